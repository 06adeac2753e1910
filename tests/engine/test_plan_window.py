"""A batch route's plan reads the next due requests off the index, not the whole job (issue 32).

Grouping requests by prompt prefix (every provider's batch route sorts a chunk by payload,
so a chunk shares its system prompt) used to sort every pending request of the job on every
plan: at 10,000,000 pending one plan took over a minute, each of two workers ran it, and a
request whose text sorts last waited behind every later one. Now the plan takes the earliest
due requests (as many as it plans) and groups those alone; on PostgreSQL it holds them while
it plans, and another worker's plan skips them for the next ones instead of waiting on them
(or planning the same ones twice). At most ten chunks wait planned, and a batch is read out
a page at a time off one range of an index."""

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


def _job(store: Store, tmp_path, bodies: list[str], chunk: int) -> None:
    """A job of one request per body (T1000, T1001, …) on echo-batch, `chunk` requests a batch."""
    rows = [{"ticket_id": f"T{1000 + i}", "body": body} for i, body in enumerate(bodies)]
    spec = make_spec(write_csv(tmp_path / "t.csv", rows), route="echo-batch",
                     route_options={"dir": str(tmp_path / "provider"), "max_requests": chunk})  # fmt: skip
    load_job(store, spec, ManualClock())


def _plans(store: Store, times: int = 1) -> list[int]:
    """Plan the job `times` over, sending nothing, on its route grouping by prefix as every
    provider's batch route does: how many requests each plan planned."""

    async def plan() -> list[int]:
        clock = ManualClock()
        async with Engine(store, clock) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            route.group_by_prefix = True
            return [batches.plan(store, job, route, clock) for _ in range(times)]

    return asyncio.run(plan())


def _planned(store: Store) -> list[list[str]]:
    """The custom_ids of each planned dispatch, in dispatch order."""
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(requests.c.dispatch_id, requests.c.custom_id)
            .where(requests.c.dispatch_id.is_not(None))
            .order_by(requests.c.dispatch_id, requests.c.id)
        ).all()
    out: dict[int, list[str]] = {}
    for dispatch_id, custom_id in rows:
        out.setdefault(dispatch_id, []).append(custom_id)
    return list(out.values())


def test_a_plan_takes_the_earliest_due_requests_and_groups_those(store, tmp_path):
    _job(store, tmp_path, list("zyxwvu"), chunk=2)  # payloads sort in the reverse of the rows' order
    _plans(store)  # a job's first plan: the two chunks its tick sends
    chunks = _planned(store)
    # Before: the four whose text sorts first of the whole job (T1002-T1005); T1000 and T1001,
    # the oldest, waited behind them.
    assert sorted(sum(chunks, [])) == ["T1000", "T1001", "T1002", "T1003"]
    # Among those, grouped by payload: T1003 ("w") and T1002 ("x") side by side.
    assert [sorted(c) for c in chunks] == [["T1002", "T1003"], ["T1000", "T1001"]]


@pytest.mark.postgres
def test_a_plan_skips_the_requests_another_plan_holds_instead_of_waiting(pg_store, tmp_path):
    _job(pg_store, tmp_path, list("abcdef"), chunk=2)  # in both orders alike

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
        # Before: the plan read the held rows too and its update waited on them (LockNotAvailable).
        assert _plans(pg_store) == [4]
        other.rollback()
    with pg_store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar() == 2
    assert sorted(sum(_planned(pg_store), [])) == ["T1002", "T1003", "T1004", "T1005"]


def test_a_plan_plans_ahead_at_most_ten_chunks(store, tmp_path):
    _job(store, tmp_path, [f"ticket {i}" for i in range(30)], chunk=1)
    # The first plans the two its tick sends; then up to ten wait planned, and no more
    # (before: ten more each time, 2 + 10 + 10, the whole job planned ahead of its sending).
    assert _plans(store, times=3) == [2, 8, 0]


@pytest.mark.postgres
def test_a_page_of_a_dispatch_is_one_range_of_its_index(pg_store, tmp_path):
    _job(pg_store, tmp_path, [f"ticket {i}" for i in range(40)], chunk=10)
    _plans(pg_store)
    with pg_store.engine.connect() as conn:
        dispatch_id, after = conn.execute(
            sa.select(requests.c.dispatch_id, sa.func.min(requests.c.id) + 3)
            .where(requests.c.dispatch_id.is_not(None)).group_by(requests.c.dispatch_id).limit(1)
        ).one()
        # The planner's choice on a table this small is a sequential scan; with that and
        # bitmaps off, what remains is the best index path, as on a big table.
        conn.exec_driver_sql("SET enable_seqscan = off")
        conn.exec_driver_sql("SET enable_bitmapscan = off")
        compiled = dispatched_page(dispatch_id, after).compile(dialect=conn.dialect)
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
