"""Fallback and deadline cut-over through the providers' batch protocols: `openai-batch` and
`anthropic-batch` against `lowtide serve`, falling back to `echo`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import openai
import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import ManualClock, SystemClock
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import ROUTES, _options, _run


async def _until_answered(url: str, n: int) -> None:
    """Until the server's batch has answered `n` requests (it reports them while in progress)."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="test-key")
    for _ in range(600):  # bounded
        batch = (await client.batches.list(limit=1)).data[0]
        if batch.request_counts and batch.request_counts.completed >= n:
            return
        await asyncio.sleep(0.05)  # real time for the server's worker, not a timing
    raise AssertionError(f"the server answered {batch.request_counts} of {n}")


def _by_route(store) -> dict[str, int]:
    with store.begin() as conn:
        return dict(conn.execute(sa.select(requests.c.route, sa.func.count()).group_by(requests.c.route)).all())


def _answers_per_request(store) -> set[int]:
    """How many successful attempts each request has, applied or not (what was paid for)."""
    with store.begin() as conn:
        return set(
            conn.execute(
                sa.select(sa.func.count()).select_from(attempts).where(attempts.c.ok).group_by(attempts.c.request_id)
            ).scalars()
        )


@pytest.mark.parametrize("route", ROUTES)
def test_requests_a_batch_expired_are_answered_on_the_fallback_route(route, serve, tmp_path):
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"first": 1, "expire_after": 3}]}))
    url = serve("--faults", str(plan))
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    spec = make_spec(source, route=route, route_options=_options(route, url), fallback={"route": "echo"})
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 10}
    assert _by_route(store) == {route: 3, "echo": 7}
    assert _answers_per_request(store) == {1}  # nothing answered (and paid for) twice
    assert any(e.startswith("finished") for e in status.events)


def test_at_the_cut_over_the_cancelled_batch_keeps_what_it_had_finished(serve, tmp_path):
    # The server finishes every request at once but holds the batch in progress for 10 days:
    # when the deadline cut-over cancels it, the cancelled batch still returns all answers.
    url = serve("--complete-after", str(10 * 86400))
    clock = ManualClock(datetime.now(UTC).timestamp())
    deadline = datetime.fromtimestamp(clock.now() + 7200, UTC)
    source = write_csv(tmp_path / "t.csv", ticket_rows(8))
    spec = make_spec(
        source, route="openai-batch", route_options=_options("openai-batch", url), deadline=deadline.isoformat(),
        fallback={"route": "echo", "expected_turnaround": 60},
    )  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock) as engine:
            await engine.tick("tickets")  # submitted
            await _until_answered(url, 8)  # the server's own pace: its first load imports more
            clock.advance(spec.deadline.timestamp() - spec.fallback.safety_margin - clock.now())
            for _ in range(600):  # bounded: the server cancels in its own time
                await engine.tick("tickets")
                if job_status(store, "tickets").done:
                    return
                await asyncio.sleep(0.05)  # real time for the server's worker, not a timing
                clock.advance(1)
            raise AssertionError(job_status(store, "tickets"))

    asyncio.run(go())
    assert job_status(store, "tickets").counts == {"succeeded": 8}
    assert _by_route(store) == {"openai-batch": 8}  # none had to be sent again
    with store.begin() as conn:
        phase, cut = conn.execute(sa.select(dispatches.c.phase, dispatches.c.cut_at)).one()
    assert phase == "cancelled" and cut is not None
