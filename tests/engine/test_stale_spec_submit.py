"""A worker sends a planned batch with the spec it read at the start of its tick. When the
operator moved the job's connection meanwhile (a `base_url`, a key, a folder: nothing was in
flight, so the load was allowed), that worker must not send it to the old place: the batch
would be polled at the new one, which never heard of it, its requests given up as lost and
sent again, and what the old place ran billed and never booked."""

from __future__ import annotations

import asyncio
import random

import sqlalchemy as sa

from lowtide.core.states import JobState
from lowtide.engine import batches
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, requests
from lowtide.store.transitions import move_job
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_worker_that_read_the_spec_before_the_connection_moved_sends_nothing_to_the_old_place(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    old, new = tmp_path / "old-provider", tmp_path / "new-provider"
    load_job(store, make_spec(source, route="echo-batch", route_options={"dir": str(old)}), clock)

    async def a_tick_that_read_the_old_spec() -> int:
        async with Engine(store, clock) as engine:
            [job] = engine._jobs("tickets")  # the tick's read, before the operator's load
            lane = job.lanes[0]
            route = engine.route_for(lane)
            moved = make_spec(source, route="echo-batch", route_options={"dir": str(new)})
            load_job(store, moved, clock)  # nothing planned or sent yet: the move is applied
            assert batches.plan(store, job, route, clock, lane.name) == 4
            worker = batches.Worker(engine.owner, engine._owner_alive)
            return await batches.submit(store, job, route, clock, random.Random(1), worker)

    assert asyncio.run(a_tick_that_read_the_old_spec()) == 0
    assert not old.exists() or not any(old.iterdir()), "a batch went to the place the job no longer uses"
    with store.begin() as conn:
        assert conn.scalars(sa.select(dispatches.c.state)).all() == ["planned"]  # sent by the next tick, to the new place

    drive_to_end(store, make_spec(source, route="echo-batch", route_options={"dir": str(new)}), clock)
    with store.begin() as conn:
        assert conn.scalars(sa.select(requests.c.state)).all() == ["succeeded"] * 4
    assert len(list(new.iterdir())) == 1  # one batch, at the new place


def test_a_batch_planned_by_a_worker_that_read_the_job_active_is_not_sent_once_it_stopped(store, clock, tmp_path):
    # A plan that committed after another worker's budget stop had taken the planned batches
    # apart (budget.exhaust reads the committed ones) leaves one planned in a job that sends
    # nothing more. The stop is set here as that worker's refused reserve leaves it.
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "provider")})
    load_job(store, spec, clock)

    async def a_tick_that_read_the_job_active() -> int:
        async with Engine(store, clock) as engine:
            [job] = engine._jobs("tickets")
            lane = job.lanes[0]
            route = engine.route_for(lane)
            assert batches.plan(store, job, route, clock, lane.name) == 4
            with store.begin() as conn:
                assert move_job(conn, job.id, JobState.BUDGET_EXHAUSTED, updated_at=clock.now())
            worker = batches.Worker(engine.owner, engine._owner_alive)
            return await batches.submit(store, job, route, clock, random.Random(1), worker)

    assert asyncio.run(a_tick_that_read_the_job_active()) == 0
    with store.begin() as conn:
        assert conn.scalars(sa.select(dispatches.c.state)).all() == ["cancelled"]  # taken apart, as the stop does
        assert conn.execute(sa.select(requests.c.state, requests.c.attempts)).all() == [("pending", 0)] * 4

    drive_to_end(store, spec, clock)  # submitted again: the job resumes (docs/costs.md)
    with store.begin() as conn:
        assert conn.scalars(sa.select(requests.c.state)).all() == ["succeeded"] * 4
