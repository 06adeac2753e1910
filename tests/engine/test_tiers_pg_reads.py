"""On PostgreSQL too, a chain's quiet pass reads a few index pages however many requests wait.

PostgreSQL leaves `state = 'pending'` out of a plain read's index condition on the partial
lane index (the index implies it), and then cannot seek on `lane`: before store/queries.py
bounded the row value (state, lane), finding the lanes with waiting requests read every
pending entry of the job (about 2,100 pages at 300,000 pending, 50 ms at 1,000,000). Counted
as buffer pages, from each statement's own EXPLAIN (ANALYZE, BUFFERS): deterministic, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.engine import tiers
from lowtide.store.db import Store
from tests.engine.test_tiers_waiting import KINDS, NOW, _job

pytestmark = pytest.mark.postgres


@contextmanager
def pg_pages(store: Store) -> Iterator[list[int]]:
    """Buffer pages (hit or read) that the store's SELECTs meanwhile take, each statement
    run again under EXPLAIN (ANALYZE, BUFFERS) with its own parameters when the block ends."""
    seen: list[tuple[str, object]] = []

    def watch(_conn, _cursor, statement, parameters, _context, _many):
        if statement.lstrip().upper().startswith("SELECT") and not statement.startswith("EXPLAIN"):
            seen.append((statement, parameters))

    pages = [0]
    sa.event.listen(store.engine, "before_cursor_execute", watch)
    try:
        yield pages
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", watch)
    with store.engine.connect() as conn:
        for statement, parameters in seen:
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters).scalar()
            top = plan[0]["Plan"]
            pages[0] += top["Shared Hit Blocks"] + top["Shared Read Blocks"]
        conn.rollback()


def test_a_quiet_pass_reads_as_many_pages_for_20000_waiting_requests_as_for_2000(pg_store):
    small, large = _job(pg_store, "small", {"main": 2000}), _job(pg_store, "large", {"main": 20_000})
    with pg_store.begin() as conn:
        conn.exec_driver_sql("ANALYZE requests")
    clock = ManualClock(NOW)
    cost = {}
    for job in (small, large):
        with pg_pages(pg_store) as pages:
            assert tiers.step(pg_store, job, KINDS, clock) == 0
        cost[job.name] = pages[0]
    # Reading every pending entry (before): {'small': 23, 'large': 152}.
    assert cost["large"] <= cost["small"] + 5, cost


def test_counting_a_lane_reads_that_lane_not_the_lanes_below_it(pg_store):
    small = _job(pg_store, "small", {"main": 2000, "tier1": 20})
    large = _job(pg_store, "large", {"main": 20_000, "tier1": 20})
    with pg_store.begin() as conn:
        conn.exec_driver_sql("ANALYZE requests")
    cost = {}
    for job in (small, large):
        with pg_pages(pg_store) as pages, pg_store.begin() as conn:
            waiting = tiers.Waiting(conn, job.id)
            assert waiting.lanes == {"main", "tier1"}
            assert waiting.count("tier1") == 20
            assert not waiting.more_than("tier1", 20)
        cost[job.name] = pages[0]
    # Counting through the lanes below (before): {'small': 58, 'large': 444}.
    assert cost["large"] <= cost["small"] + 5, cost
