"""A direct route on PostgreSQL keeps both cores busy (issue 32): the database writes one
dispatch's answers while the worker claims and runs the next.

What makes that possible, each checked on real connections: a claim does not wait on a
transaction that holds the job (`lock_job` is FOR NO KEY UPDATE: inserting a dispatch takes
only the job's key share); one call of `run_direct` goes on through several dispatches and
returns with all of them written; a write that fails stops the ones queued behind it and is
raised. And lookups by custom_id seek the index even where the table's statistics are stale
(right after a load), instead of reading the whole job for each chunk."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.core.states import DispatchState
from lowtide.engine import direct
from lowtide.engine.dispatch import new_dispatch
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.bulk import among
from lowtide.store.db import Store
from lowtide.store.schema import dispatches, jobs, requests
from lowtide.store.transitions import lock_job
from tests.conftest import make_spec, ticket_rows, write_csv


def _job_id(store: Store) -> int:
    with store.begin() as conn:
        return conn.execute(sa.select(jobs.c.id)).scalar_one()


@pytest.mark.postgres
def test_a_claim_does_not_wait_for_a_transaction_holding_the_job(pg_store, tmp_path):
    clock = ManualClock()
    load_job(pg_store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3))), clock)
    job_id = _job_id(pg_store)
    with pg_store.engine.connect() as writing, pg_store.engine.connect() as claiming:
        lock_job(writing, job_id)  # a write of answers holds the job until it commits
        claiming.exec_driver_sql("SET lock_timeout = '5s'")  # a bound on waiting, never reached unless it waits
        # Before: SELECT … FOR UPDATE, which the dispatch's foreign key share waits on (LockNotAvailable).
        dispatch_id = new_dispatch(claiming, job_id, "echo", "direct", DispatchState.RUNNING, clock.now())
        assert dispatch_id
        claiming.exec_driver_sql("SET lock_timeout = '50ms'")
        with pytest.raises(sa.exc.OperationalError) as taken:  # two takers of the job still exclude each other
            lock_job(claiming, job_id)
        assert isinstance(taken.value.orig, psycopg.errors.LockNotAvailable)
        claiming.rollback()
        writing.rollback()


def _removed_by_filter(plan: dict) -> int:
    return plan.get("Rows Removed by Filter", 0) + sum(_removed_by_filter(p) for p in plan.get("Plans", []))


@pytest.mark.postgres
def test_a_lookup_by_custom_id_seeks_the_index_on_stale_statistics(pg_store, tmp_path):
    with pg_store.begin() as conn:
        conn.exec_driver_sql("ANALYZE requests")  # statistics of the empty table, as right after a job's load
    load_job(pg_store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3000))), ManualClock())
    job_id = _job_id(pg_store)
    wanted = [f"T{1000 + i}" for i in range(2000, 2100)]
    with pg_store.engine.connect() as conn:
        stmt = sa.select(requests.c.id).where(requests.c.job_id == job_id, among(conn, requests.c.custom_id, wanted))
        compiled = stmt.compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled), compiled.params).scalar()
        found = conn.execute(stmt).scalars().all()
    assert len(found) == 100
    # Before (`= ANY`): the job's 3,000 rows read and 2,900 filtered away, for every chunk an export looks up.
    assert _removed_by_filter(plan[0]["Plan"]) == 0, plan


def test_one_call_runs_dispatch_after_dispatch_on_postgresql_and_returns_with_all_written(store, tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "RUN_SECONDS", 3600.0)  # how long it may go on: not what this test is about
    clock = ManualClock()
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(50)), route_options={"dispatch_size": 10}), clock)

    async def one_tick():
        async with Engine(store, clock, seed=7) as engine:
            return await engine.tick()

    report = asyncio.run(one_tick())
    with store.begin() as conn:
        states = dict(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state)).all())
        ended = conn.execute(sa.select(sa.func.count()).where(dispatches.c.state == DispatchState.ENDED.value)).scalar()
    expected = 10 if store.is_sqlite else 50  # SQLite writes one at a time: nothing to overlap, one dispatch a tick
    assert report.ingested.succeeded == expected
    assert states == ({"succeeded": 10, "pending": 40} if store.is_sqlite else {"succeeded": 50})  # all committed
    assert ended == expected // 10


@pytest.mark.postgres
def test_a_failed_write_stops_the_writes_behind_it_and_is_raised(pg_store):
    written = []

    def failing(outcomes, final):
        raise RuntimeError("the store went away")

    def writing(outcomes, final):
        written.append(final)

    async def run():
        writer = direct.Writer(pg_store)
        await writer.write(failing, [])
        await writer.write(writing, [], final=True)
        await writer.close()

    with pytest.raises(RuntimeError, match="the store went away"):
        asyncio.run(run())
    assert written == []
