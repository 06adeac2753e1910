"""A cancel against a worker that is planning the job's next batch, on two real connections:
the batch planned meanwhile ends with its requests, none left `dispatched` in it.

Found by the three-worker chaos test (tests/reliability/test_kill.py): the job ended with
chunks of 40 requests `dispatched` in cancelled batches, which no tick, retry or heal ever
touches again, and `worker --until-idle` stopped with the job unfinished."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.engine import batches
from lowtide.engine.control import cancel_job, retry_job
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv
from tests.engine.concurrency import Background, held_before_commit, ran_or_waits, second_store

pytestmark = pytest.mark.postgres


def test_a_batch_planned_while_the_job_is_cancelled_ends_with_its_requests(pg_store, clock, tmp_path):
    spec = make_spec(
        write_csv(tmp_path / "t.csv", ticket_rows(6)), route="echo-batch", route_options={"dir": str(tmp_path / "provider")}
    )
    load_job(pg_store, spec, clock)

    engine = Engine(pg_store, clock)
    [job] = engine._jobs("tickets")
    lane = job.lanes[0]
    route = engine.route_for(lane)
    other, app_name = second_store(pg_store)
    try:
        with held_before_commit(pg_store) as (entered, go):
            planner = Background(lambda: batches.plan(pg_store, job, route, clock, lane.name))
            planner.start()
            assert entered.wait(60)  # the window's rows are in the new batch, not yet committed
            canceller = Background(lambda: cancel_job(other, "tickets", clock))
            canceller.start()
            ran_or_waits(other, app_name, canceller)  # waits for the planner's rows
            go.set()
            assert planner.result() == 6
            canceller.result()
    finally:
        other.close()
        asyncio.run(engine.aclose())

    with pg_store.begin() as conn:
        rows = conn.execute(
            sa.select(requests.c.state, dispatches.c.state)
            .select_from(requests.outerjoin(dispatches, dispatches.c.id == requests.c.dispatch_id))
        ).all()  # fmt: skip
        planned = conn.execute(sa.select(dispatches.c.state)).scalars().all()
    assert planned == ["cancelled"]
    assert sorted(rows) == [("cancelled", None)] * 6  # none left in the cancelled batch

    # And the operator's way back works: retried, every request is answered and the job ends.
    assert retry_job(pg_store, "tickets", clock, cancelled=True) == 6
    drive_to_end(pg_store, spec, clock)
    with pg_store.begin() as conn:
        assert conn.execute(sa.select(requests.c.state)).scalars().all() == ["succeeded"] * 6
