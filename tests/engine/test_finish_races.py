"""finish() against a load or a retry committing at the same moment, on two real connections:
the job never ends `finished` while it has requests no tick will send (issue 15, item 2)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.core.states import JobState, RequestState
from lowtide.engine.control import job_status, retry_job
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import requests
from lowtide.store.transitions import move_requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv
from tests.engine.concurrency import Background, held_before_commit, ran_or_waits, second_store


def _all_failed_but_active(store, clock, source):
    """A job whose every request is terminal (failed) while the job is still active: the
    moment a tick's finish() would end it."""
    spec = make_spec(source)
    load_job(store, spec, clock)
    with store.begin() as conn:
        move_requests(conn, RequestState.FAILED, requests.c.job_id.is_not(None), values={"error_code": "boom"})
    return spec


def _finish_while_held(store, clock, commit_later) -> bool:
    """Run `commit_later` (a load or retry on its own Store) up to its COMMIT and hold it
    there; meanwhile a tick's finish() runs on another Store; then let the first commit."""
    other, app_name = second_store(store)
    try:
        with held_before_commit(store) as (entered, go):
            writer = Background(commit_later)
            writer.start()
            assert entered.wait(60), "the load/retry never reached its commit"

            async def finish():
                async with Engine(other, clock) as engine:
                    [job] = engine._jobs("tickets")
                    return engine.finish(job)

            finisher = Background(lambda: asyncio.run(finish()))
            finisher.start()
            ran_or_waits(other, app_name, finisher)
            go.set()
            writer.result()
            return finisher.result()
    finally:
        other.close()


def test_a_retry_committing_during_finish_leaves_the_job_active(store, clock, tmp_path):
    spec = _all_failed_but_active(store, clock, write_csv(tmp_path / "t.csv", ticket_rows(3)))
    finished = _finish_while_held(store, clock, lambda: retry_job(store, "tickets", clock, failed=True))
    status = job_status(store, "tickets")
    assert not finished
    assert (status.state, status.counts) == (JobState.ACTIVE, {"pending": 3})
    assert drive_to_end(store, spec, clock).counts == {"succeeded": 3}  # and the ticks send them


def test_rows_loaded_during_finish_leave_the_job_active(store, clock, tmp_path):
    rows = ticket_rows(5)
    source = write_csv(tmp_path / "t.csv", rows[:3])
    spec = _all_failed_but_active(store, clock, source)
    write_csv(source, rows)  # two rows appended to the source
    finished = _finish_while_held(store, clock, lambda: load_job(store, spec, clock))
    status = job_status(store, "tickets")
    assert not finished
    assert (status.state, status.counts) == (JobState.ACTIVE, {"failed": 3, "pending": 2})


@pytest.mark.parametrize("first", ["finish", "load"])
def test_finish_and_load_in_either_order_end_right(store, clock, tmp_path, first):
    """The same two transactions one after the other: the serial orders the lock allows."""
    rows = ticket_rows(4)
    source = write_csv(tmp_path / "t.csv", rows[:2])
    spec = _all_failed_but_active(store, clock, source)
    write_csv(source, rows)

    async def finish():
        async with Engine(store, clock) as engine:
            [job] = engine._jobs("tickets")
            return engine.finish(job)

    if first == "finish":
        assert asyncio.run(finish())
        load_job(store, spec, clock)
    else:
        load_job(store, spec, clock)
        assert not asyncio.run(finish())
    with store.begin() as conn:
        pending = conn.execute(sa.select(sa.func.count()).where(requests.c.state == "pending")).scalar_one()
    assert (job_status(store, "tickets").state, pending) == (JobState.ACTIVE, 2)
