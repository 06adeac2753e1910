"""Two engines, each on its own Store, on one budgeted job (issue 15, item 4): a worker that
read a `planned` dispatch before another worker reserved and sent it must not reserve it a
second time (and so refuse it and stop the job); and a `budget_exhausted` job whose every
request has ended is finished.

The route is the real `openai-batch` route (the official SDK) against `lowtide serve`;
one engine's route holds its first create until the test lets it go, so the two engines'
steps interleave in the order that once went wrong."""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal

import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.states import DispatchState, JobState
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.openai.batch import OpenAIBatchRoute
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import dispatches, events
from lowtide.store.transitions import move_job
from tests.conftest import make_spec, write_csv
from tests.routes.conftest import _options, _run, serve  # noqa: F401  (the `serve` fixture)

D = Decimal


class HeldCreate(OpenAIBatchRoute):
    """`openai-batch` whose first create waits for the test's go-ahead."""

    def __init__(self, options):
        super().__init__(options)
        self.inside = asyncio.Event()
        self.go = asyncio.Event()

    async def submit(self, key, requests):
        if not self.inside.is_set():
            self.inside.set()
            await self.go.wait()
        return await super().submit(key, requests)


def _budgeted_spec(tmp_path, url, chunks: float):
    """Four equal rows in chunks of two, with a budget of `chunks` chunks' estimate."""
    rows = [{"ticket_id": f"T{1000 + i}", "body": f"ticket number {1000 + i}"} for i in range(4)]
    source = write_csv(tmp_path / "t.csv", rows)

    def spec(budget_usd):
        return make_spec(
            source, model="gpt-4o-mini", route="openai-batch", route_options=_options("openai-batch", url),
            chunk_size=2, params={"max_tokens": 100}, budget_usd=budget_usd,
        )  # fmt: skip

    return spec, rows


def _chunk_estimate(store) -> Decimal:
    """One chunk of two at openai-batch gpt-4o-mini prices: input ≈ characters / 4 at
    0.075, output 2 × max_tokens at 0.30 (per million tokens)."""
    with store.begin() as conn:
        [chars] = {len(p) for p in conn.scalars(sa.select(payload_text().label("payload")))}
    return (D(math.ceil(2 * chars / 4)) * D("0.075") + 200 * D("0.30")) / 1_000_000


def _events(store, kind: str) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind)))


def test_a_stale_planned_row_is_not_reserved_again_by_a_second_engine(serve, store, tmp_path):  # noqa: F811
    url = serve("--complete-after", "3600")  # a scaled hour: batches stay in flight a moment
    spec, _ = _budgeted_spec(tmp_path, url, 0)
    load_job(store, spec("1"), SystemClock())
    chunk = _chunk_estimate(store)
    budgeted = spec(str(chunk * D("2.5")))  # both chunks fit; one of them reserved twice does not
    load_job(store, budgeted, SystemClock())
    other = Store(store.location)

    async def interleave():
        held = HeldCreate(_options("openai-batch", url))
        plain = OpenAIBatchRoute(_options("openai-batch", url))
        try:
            async with Engine(other, routes={"openai-batch": held}) as b, Engine(store, routes={"openai-batch": plain}) as a:
                # B plans both chunks, reads both as planned, and takes the first: its create waits.
                b_tick = asyncio.create_task(b.tick("tickets"))
                await held.inside.wait()
                # Meanwhile A takes, reserves and sends the second chunk.
                assert (await a.tick("tickets")).submitted == 1
                # B's create goes through; then B comes to the second chunk, planned when it read it.
                held.go.set()
                assert (await b_tick).submitted == 1
        finally:
            await held.aclose()
            await plain.aclose()

    try:
        asyncio.run(interleave())
    finally:
        other.close()
    assert _events(store, "budget_exhausted") == []
    status = _run(store, "tickets")
    assert (status.state, status.counts) == (JobState.FINISHED, {"succeeded": 4})
    with store.begin() as conn:
        sent = conn.execute(sa.select(dispatches.c.state, dispatches.c.provider_id)).all()
    assert len(sent) == 2 and all(p for _, p in sent) and {s for s, _ in sent} == {DispatchState.ENDED}
    assert _events(store, "budget_exhausted") == []


def test_a_budget_exhausted_job_whose_requests_all_end_is_finished(serve, store, tmp_path):  # noqa: F811
    url = serve("--complete-after", "3600")
    spec, _ = _budgeted_spec(tmp_path, url, 0)
    load_job(store, spec("1"), SystemClock())

    async def send_all():
        async with Engine(store) as engine:
            return (await engine.tick("tickets")).submitted

    assert asyncio.run(send_all()) == 2
    # The budget ran out with both batches in flight and nothing left to send (as a refusal
    # by another worker, or a budget lowered while they ran, leaves it).
    with store.begin() as conn:
        job_id = conn.execute(sa.select(dispatches.c.job_id)).scalars().first()
        move_job(conn, job_id, JobState.BUDGET_EXHAUSTED, updated_at=0.0)
    status = _run(store, "tickets")
    assert (status.state, status.counts) == (JobState.FINISHED, {"succeeded": 4})
