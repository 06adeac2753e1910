"""A batch route's plan reads the next due requests off the index, not the whole job (issue 32).

Grouping requests by prompt prefix (every provider's batch route sorts a chunk by payload,
so a chunk shares its system prompt) used to sort every pending request of the job on every
plan: at 10,000,000 pending one plan took over a minute, each of two workers ran it, and a
request whose text sorts last waited behind every later one. Now the plan takes the earliest
due requests (as many as it plans) and groups those alone; on PostgreSQL it holds them while
it plans, and another worker's plan skips them for the next ones instead of waiting on them
(or planning the same ones twice)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.engine import batches
from lowtide.engine.dispatch import dispatched_page
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import dispatches, requests
from tests.conftest import make_spec, write_csv

# Bodies whose payloads sort in the reverse of the rows' order: T1000 last, T1005 first.
ROWS = [{"ticket_id": f"T{1000 + i}", "body": letter} for i, letter in enumerate("zyxwvu")]


def _plan_first_tick(store: Store, clock: ManualClock, tmp_path) -> list[list[str]]:
    """Plan the job's first tick on a batch route of chunks of 2 that groups by prefix (as
    every provider's does): the first tick plans two chunks. The custom_ids of each
    planned dispatch, in dispatch order."""
    spec = make_spec(write_csv(tmp_path / "t.csv", ROWS), route="echo-batch",
                     route_options={"dir": str(tmp_path / "provider"), "max_requests": 2})  # fmt: skip
    load_job(store, spec, clock)

    async def plan() -> None:
        async with Engine(store, clock) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            route.group_by_prefix = True
            batches.plan(store, job, route, clock)

    asyncio.run(plan())
    with store.begin() as conn:
        planned = conn.execute(
            sa.select(requests.c.dispatch_id, requests.c.custom_id)
            .where(requests.c.dispatch_id.is_not(None))
            .order_by(requests.c.dispatch_id, requests.c.id)
        ).all()
    out: dict[int, list[str]] = {}
    for dispatch_id, custom_id in planned:
        out.setdefault(dispatch_id, []).append(custom_id)
    return list(out.values())


def test_a_plan_takes_the_earliest_due_requests_and_groups_those(store, tmp_path):
    chunks = _plan_first_tick(store, ManualClock(), tmp_path)
    # Before: the four whose text sorts first of the whole job (T1002-T1005); T1000 and T1001,
    # the oldest, waited behind them.
    assert sorted(sum(chunks, [])) == ["T1000", "T1001", "T1002", "T1003"]
    # Among those, grouped by payload: T1003 ("w") and T1002 ("x") side by side.
    assert [sorted(c) for c in chunks] == [["T1002", "T1003"], ["T1000", "T1001"]]


@pytest.mark.postgres
def test_a_plan_skips_the_requests_another_plan_holds_instead_of_waiting(pg_store, tmp_path):
    clock = ManualClock()
    rows = [{"ticket_id": f"T{1000 + i}", "body": letter} for i, letter in enumerate("abcdef")]  # in both orders alike
    spec = make_spec(write_csv(tmp_path / "t.csv", rows), route="echo-batch",
                     route_options={"dir": str(tmp_path / "provider"), "max_requests": 2})  # fmt: skip
    load_job(pg_store, spec, clock)

    @sa.event.listens_for(pg_store.engine, "connect")
    def _bounded(dbapi_conn, _record):  # a bound on waiting, never reached unless the plan waits
        with dbapi_conn.cursor() as cur:
            cur.execute("SET lock_timeout = '5s'")
        dbapi_conn.commit()

    pg_store.engine.dispose()
    with pg_store.engine.connect() as other:  # another worker's plan, holding the two oldest
        held = other.execute(
            sa.select(requests.c.custom_id).order_by(requests.c.id).limit(2).with_for_update(key_share=True)
        ).scalars().all()
        assert held == ["T1000", "T1001"]

        async def plan() -> int:
            async with Engine(pg_store, clock) as engine:
                job = engine._jobs("tickets")[0]
                route = engine.route_for(job.lanes[0])
                route.group_by_prefix = True
                return batches.plan(pg_store, job, route, clock)

        # Before: the plan read the held rows too and its update waited on them (LockNotAvailable).
        assert asyncio.run(plan()) == 4
        other.rollback()
    with pg_store.begin() as conn:
        planned = conn.execute(sa.select(requests.c.custom_id).where(requests.c.dispatch_id.is_not(None))).scalars().all()
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar() == 2
    assert sorted(planned) == ["T1002", "T1003", "T1004", "T1005"]


def test_a_plan_plans_ahead_at_most_ten_chunks(store, tmp_path):
    clock = ManualClock()
    rows = [{"ticket_id": f"T{1000 + i}", "body": f"ticket {i}"} for i in range(30)]
    spec = make_spec(write_csv(tmp_path / "t.csv", rows), route="echo-batch",
                     route_options={"dir": str(tmp_path / "provider"), "max_requests": 1})  # fmt: skip
    load_job(store, spec, clock)

    async def plans() -> list[int]:
        async with Engine(store, clock) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            return [batches.plan(store, job, route, clock) for _ in range(3)]  # none of them sent

    # The first plans the two its tick sends; then up to ten wait planned, and no more
    # (before: ten more each time, 2 + 10 + 10, the whole job planned ahead of its sending).
    assert asyncio.run(plans()) == [2, 8, 0]


@pytest.mark.postgres
def test_a_page_of_a_dispatch_is_one_range_of_its_index(pg_store, tmp_path):
    clock = ManualClock()
    rows = [{"ticket_id": f"T{1000 + i}", "body": f"ticket {i}"} for i in range(40)]
    spec = make_spec(write_csv(tmp_path / "t.csv", rows), route="echo-batch",
                     route_options={"dir": str(tmp_path / "provider"), "max_requests": 10})  # fmt: skip
    load_job(pg_store, spec, clock)

    async def plan() -> None:
        async with Engine(pg_store, clock) as engine:
            job = engine._jobs("tickets")[0]
            batches.plan(pg_store, job, engine.route_for(job.lanes[0]), clock)

    asyncio.run(plan())
    with pg_store.engine.connect() as conn:
        dispatch_id, after = conn.execute(
            sa.select(requests.c.dispatch_id, sa.func.min(requests.c.id) + 3)
            .where(requests.c.dispatch_id.is_not(None)).group_by(requests.c.dispatch_id).limit(1)
        ).one()
        # The planner's choice on a table this small is a sequential scan; with that and
        # bitmaps off, what remains is the best index path, as on a big table.
        conn.exec_driver_sql("SET enable_seqscan = off")
        conn.exec_driver_sql("SET enable_bitmapscan = off")
        stmt = dispatched_page(dispatch_id, after)
        compiled = stmt.compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), compiled.params).scalar()[0]["Plan"]
        conn.rollback()
    nodes = list(_nodes(plan))
    # Before (an index of dispatch_id alone): the table's ids above `after` read in id order
    # and filtered by dispatch (at 10,000,000 requests, 1.2 s a page), or the dispatch's rows sorted.
    scans = [n for n in nodes if n["Node Type"] == "Index Scan"]
    assert [n["Index Name"] for n in scans] == ["ix_requests_dispatch"], nodes
    assert "id >" in scans[0]["Index Cond"] and not any(n["Node Type"] == "Sort" for n in nodes), nodes


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)
