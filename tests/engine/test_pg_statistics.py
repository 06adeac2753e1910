"""On PostgreSQL, a load of many requests leaves the planner knowing they are pending.

Autovacuum refreshes a table's statistics only once a tenth of it has changed, so after a
load they still describe the store as it was: all finished, or five rows. The statement that
puts the next 10,000 pending requests into a batch was then planned as walking the new job's
rows for each id in the batch: two ticks of a 45,000-request job took 89 s instead of 3 s
(`tests/engine/test_pipeline.py`'s 45,000-request test, after an ANALYZE of a 5-row store).
The planner's own estimate is what is checked here: deterministic, no clock.
"""

from __future__ import annotations

import threading

import pytest

from lowtide.core.clock import ManualClock
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

pytestmark = pytest.mark.postgres


def _estimated_pending(store: Store) -> int:
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) SELECT id FROM requests WHERE state = 'pending'").scalar()
    return plan[0]["Plan"]["Plan Rows"]


def _analyze_as_autovacuum_would(store: Store) -> None:
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE requests")


def test_a_big_load_into_a_store_of_finished_requests_is_planned_as_pending(pg_store, tmp_path):
    clock = ManualClock()
    drive_to_end(pg_store, make_spec(write_csv(tmp_path / "old.csv", ticket_rows(5)), name="earlier"), clock)
    _analyze_as_autovacuum_would(pg_store)
    assert _estimated_pending(pg_store) < 10  # the statistics say: nothing pending

    load_job(pg_store, make_spec(write_csv(tmp_path / "new.csv", ticket_rows(5000, start=10_000))), clock)
    assert _estimated_pending(pg_store) >= 2500



def test_a_load_does_not_wait_for_a_vacuum_holding_the_table(pg_store, tmp_path):
    # A VACUUM (`lowtide prune`) holds SHARE UPDATE EXCLUSIVE, which ANALYZE needs too: the
    # refresh is skipped, and the load, committed already, returns.
    source = write_csv(tmp_path / "new.csv", ticket_rows(1500))
    with pg_store.engine.connect() as other, other.begin():
        other.exec_driver_sql("LOCK TABLE requests IN SHARE UPDATE EXCLUSIVE MODE")
        loading = threading.Thread(target=load_job, args=(pg_store, make_spec(source), ManualClock()), daemon=True)
        loading.start()
        loading.join(timeout=60)  # a safety net: it returns at once, or waits for ever
        assert not loading.is_alive(), "the load waits for the lock"
    with pg_store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM requests").scalar() == 1500
