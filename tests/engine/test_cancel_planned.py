"""A cancel that takes apart a batch planned but never sent: its requests end cancelled
with no attempt counted, as a budget stop or a deadline leaves them (`fate.undo_planned`).
Before, the plan's claim stayed counted: the export said 1 attempt of a request no provider
ever saw."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from lowtide.engine import batches
from lowtide.engine.control import cancel_job, retry_job
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_request_cancelled_in_a_batch_never_sent_counts_no_attempt(store, clock, tmp_path):
    spec = make_spec(
        write_csv(tmp_path / "t.csv", ticket_rows(6)), route="echo-batch", route_options={"dir": str(tmp_path / "provider")}
    )
    load_job(store, spec, clock)
    engine = Engine(store, clock)
    try:
        [job] = engine._jobs("tickets")
        lane = job.lanes[0]
        assert batches.plan(store, job, engine.route_for(lane), clock, lane.name) == 6  # planned, not sent
        cancel_job(store, "tickets", clock)
    finally:
        asyncio.run(engine.aclose())

    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.state, requests.c.attempts, requests.c.dispatch_id)).all()
        assert conn.execute(sa.select(dispatches.c.state)).scalars().all() == ["cancelled"]
    assert sorted(rows) == [("cancelled", 0, None)] * 6

    # Retried, each is sent once: one attempt, the first.
    assert retry_job(store, "tickets", clock, cancelled=True) == 6
    drive_to_end(store, spec, clock)
    with store.begin() as conn:
        assert conn.execute(sa.select(requests.c.state, requests.c.attempts)).all() == [("succeeded", 1)] * 6
