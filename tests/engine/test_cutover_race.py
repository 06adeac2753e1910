"""The deadline cut-over against a worker that has just begun to send a planned batch, on two
real connections: the batch keeps its requests; they are not also moved to the fallback
route (which would send them twice)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from lowtide.core.states import DispatchState
from lowtide.engine import batches
from lowtide.engine.fallback import cut_over
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, requests
from lowtide.store.transitions import move_dispatch
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.engine.concurrency import Background, held_before_commit, ran_or_waits, second_store

HOUR = 3600.0


@pytest.mark.postgres
def test_cut_over_leaves_a_batch_a_worker_is_sending_with_its_requests(store, clock, tmp_path):
    if store.is_sqlite:
        pytest.skip("SQLite runs one writer at a time: the two transactions cannot interleave")
    spec = make_spec(
        write_csv(tmp_path / "t.csv", ticket_rows(4)), route="echo-batch",
        route_options={"dir": str(tmp_path / "provider")},
        fallback={"route": "echo", "expected_turnaround": 60, "safety_margin": 900},
        deadline=datetime.fromtimestamp(clock.now() + 2 * HOUR, UTC).isoformat(),
    )  # fmt: skip
    load_job(store, spec, clock)

    async def planned():
        async with Engine(store, clock) as engine:
            [job] = engine._jobs("tickets")
            lane = job.lanes[0]
            route = engine.route_for(lane)
            assert batches.plan(store, job, route, clock, lane.name) == 4
            return job, route

    job, route = asyncio.run(planned())
    with store.begin() as conn:
        dispatch_id = conn.execute(sa.select(dispatches.c.id)).scalar_one()
    clock.advance(2 * HOUR - 600)  # past the cut-over (900 s before the deadline)

    def start_sending():  # what `submit` does first: the compare-and-set to submitting
        with store.begin() as conn:
            assert move_dispatch(conn, dispatch_id, DispatchState.PLANNED, DispatchState.SUBMITTING, owner="w", lease_until=1e12)

    other, app_name = second_store(store)
    try:
        with held_before_commit(store) as (entered, go):
            sender = Background(start_sending)
            sender.start()
            assert entered.wait(60)
            cutter = Background(lambda: cut_over(other, job, route.kind, route.name, clock))
            cutter.start()
            ran_or_waits(other, app_name, cutter)
            go.set()
            sender.result()
            cutter.result()
    finally:
        other.close()
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.state, requests.c.dispatch_id, requests.c.lane)).all()
        state = conn.execute(sa.select(dispatches.c.state).where(dispatches.c.id == dispatch_id)).scalar_one()
    assert state == DispatchState.SUBMITTING.value
    assert sorted(rows) == [("dispatched", dispatch_id, "main")] * 4  # still the batch's, sent once
