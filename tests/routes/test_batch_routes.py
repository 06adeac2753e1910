"""openai-batch and anthropic-batch against `lowtide serve` run as a subprocess: the official
SDKs on both sides of a real HTTP connection."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa

from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import ROUTES, _options, _run


@pytest.mark.parametrize("route", ROUTES)
def test_a_job_runs_through_the_providers_batch_protocol(route, serve, tmp_path):
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(25))
    spec = make_spec(source, route=route, route_options=_options(route, url, max_requests=10))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, _clock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 25}
    with store.begin() as conn:
        outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
        usage = conn.execute(sa.select(sa.func.sum(requests.c.input_tokens))).scalar_one()
    assert outputs["T1003"] == "Ticket: ticket 1003 about shipping"  # echo, matched by custom_id
    assert len(provider_ids) == 3 and all(provider_ids)  # 10 + 10 + 5
    assert usage > 0


KILL_AFTER_CREATE = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from lowtide.core.clock import SystemClock
    from lowtide.core.spec import JobSpec
    from lowtide.core.states import DispatchState
    from lowtide.engine import batches
    from lowtide.engine.dispatch import dispatched_requests
    from lowtide.engine.tick import Engine
    from lowtide.store.db import Store
    from lowtide.store.transitions import move_dispatch
    import sqlalchemy as sa
    from lowtide.store.schema import dispatches

    async def main():
        store = Store(sys.argv[1])
        async with Engine(store) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            batches.plan(store, job, route, SystemClock())
            with store.begin() as conn:
                dispatch_id, key = conn.execute(sa.select(dispatches.c.id, dispatches.c.key)).first()
                move_dispatch(conn, dispatch_id, DispatchState.PLANNED, DispatchState.SUBMITTING)
                batch = dispatched_requests(conn, dispatch_id)
            await route.submit(key, batch)  # "create" sent and answered ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before recording the id

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("route", ROUTES)
def test_sigkill_between_create_and_recording_the_id_does_not_submit_twice(route, serve, tmp_path):
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    store_path = str(tmp_path / "client.db")
    spec = make_spec(source, route=route, route_options=_options(route, url))
    store = Store(store_path)
    load_job(store, spec, _clock())
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]

    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 6}
    assert _provider_batch_count(route, url) == 1  # adopted, not created again
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


async def _all_ended(url: str) -> None:
    """Until every Anthropic batch at the server has ended (bounded)."""
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=url, api_key="k")
    for _ in range(600):
        if all(s == "ended" for s in [b.processing_status async for b in client.messages.batches.list()]):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the batches did not end")


def _provider_batch_count(route: str, url: str) -> int:
    if route == "openai-batch":
        import openai

        return len(list(openai.OpenAI(base_url=f"{url}/v1", api_key="k").batches.list(limit=100)))
    import anthropic

    return len(list(anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list(limit=100)))


def _clock():
    from lowtide.core.clock import SystemClock

    return SystemClock()


def test_status_shows_the_provider_phase(serve, tmp_path):
    url = serve("--complete-after", "36000")  # ten scaled hours: the batch stays in progress a while
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    spec = make_spec(source, route="openai-batch", route_options=_options("openai-batch", url))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, _clock())

    async def first_ticks():
        async with Engine(store) as engine:
            await engine.tick("tickets")  # plan + submit
            await asyncio.sleep(0.2)  # let the first poll come due (poll_interval 0.05 s)
            await engine.tick("tickets")

    asyncio.run(first_ticks())
    phases = job_status(store, "tickets").phases
    assert set(phases) <= {"validating", "in_progress", "finalizing"} and sum(phases.values()) == 1


# Each fault of `lowtide serve --faults` (docs/serve.md), and the end state every row must reach.
FAULTS = {
    "create_rate_limited": ({"http": [{"match": "POST *", "first": 2, "status": 429}]}, {"succeeded": 12}),
    "poll_server_errors": ({"http": [{"match": "GET *", "every": 3, "status": 500}]}, {"succeeded": 12}),
    "download_times_out": (
        {"http": [{"match": "GET /v1/files/*/content", "first": 1, "delay": 6}, {"match": "GET /v1/messages/batches/*/results", "first": 1, "delay": 6}]},
        {"succeeded": 12},
    ),
    "validation_fails": ({"batches": [{"first": 1, "fail_validation": True}]}, None),  # per API, below
    "expires_part_way": ({"batches": [{"first": 1, "expire_after": 3}]}, {"succeeded": 12}),
    "lines_dropped_duplicated_corrupted": (
        {"batches": [{"first": 2, "drop_lines": 1, "duplicate_lines": 1, "corrupt_lines": 1}]},
        {"succeeded": 12},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_kind_converges_to_the_right_terminal_states(route, fault, serve, tmp_path):
    import yaml

    plan, expected = FAULTS[fault]
    plan_file = tmp_path / "faults.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    url = serve("--faults", str(plan_file))
    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    spec = make_spec(
        source,
        route=route,
        # A short client timeout only where the plan delays a download past it.
        route_options=_options(route, url, max_requests=6, **({"timeout": 3} if fault == "download_times_out" else {})),
        retry={"max_attempts": 4, "backoff_seconds": 0},
    )
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, _clock())
    status = _run(store, "tickets")
    if fault == "validation_fails":
        # OpenAI fails the whole first batch at validation: its rows fail for good with the
        # provider's reason. Anthropic has no failed state: every request comes back errored.
        assert status.counts == {"succeeded": 6, "failed": 6}
        assert set(status.failures) == ({"batch_rejected"} if route == "openai-batch" else {"invalid_request_error"})
    else:
        assert status.counts == expected, status.events
    with store.begin() as conn:  # no request got two applied answers
        dup = conn.execute(
            sa.text("SELECT request_id FROM attempts WHERE applied AND ok GROUP BY request_id HAVING COUNT(*) > 1")
        ).all()
    assert dup == []


def test_anthropic_adoption_is_anchored_at_the_create_not_at_planning(serve, store, tmp_path):
    """A chunk planned long before it is sent (its first create got a 500; ticks send a few
    chunks at a time) whose next create reached Anthropic but whose answer was lost is
    adopted, not created again: `find` looks around the time recorded when that create
    began (`submit_started_at`), not around the time the chunk was planned."""
    import time

    import yaml

    from lowtide.core.clock import ManualClock
    from lowtide.core.errors import RouteError
    from lowtide.routes.anthropic.batch import AnthropicBatchRoute

    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /v1/messages/batches", "first": 1, "status": 500}]}))
    url = serve("--time-scale", "1", "--faults", str(plan))  # real time: the provider's creation times are ours
    window = 600
    options = _options("anthropic-batch", url, find_window=window)

    class LostAnswer(AnthropicBatchRoute):
        """The first create the provider takes: its answer never reaches us."""

        lost = False

        async def submit(self, key, requests):
            batch_id = await super().submit(key, requests)
            if not self.lost:
                self.lost = True
                raise RouteError(f"{self.name}: connection reset while reading the answer")
            return batch_id

    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    spec = make_spec(source, route="anthropic-batch", route_options=options)
    clock = ManualClock(time.time() - 2 * window)  # planned twenty minutes ago
    load_job(store, spec, clock)

    async def ticks():
        route = LostAnswer(options)
        try:
            async with Engine(store, clock, routes={"anthropic-batch": route}) as engine:
                assert (await engine.tick("tickets")).submitted == 0  # planned; the create got a 500
                clock.advance(2 * window)  # now: the create is tried again, and taken
                assert (await engine.tick("tickets")).submitted == 0  # ... its answer lost
                await _all_ended(url)  # a running batch may be another client's: adopted once it ended
                return (await engine.tick("tickets")).submitted  # find-or-create
        finally:
            await route.aclose()

    assert asyncio.run(ticks()) == 1
    assert _provider_batch_count("anthropic-batch", url) == 1  # adopted, not created again
    with store.begin() as conn:
        created_at, started_at = conn.execute(sa.select(dispatches.c.created_at, dispatches.c.submit_started_at)).one()
    assert started_at - created_at == 2 * window
    assert _run(store, "tickets").counts == {"succeeded": 4}
