"""Loads racing other writers, on two real connections: `--requeue-changed` against a worker
claiming the same requests (a changed request a worker took meanwhile is never reported
re-queued while it runs with what was stored; docs/jobs.md "Changing a job"), and the same new
job loaded from two terminals at once."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import SpecError
from lowtide.core.states import DispatchState
from lowtide.engine.dispatch import claim_due, new_dispatch
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_text
from lowtide.store.schema import jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.engine.concurrency import Background, held_before_commit, ran_or_waits, second_store


def test_a_changed_request_claimed_during_the_load_is_refused_not_counted_requeued(store, clock, tmp_path):
    rows = ticket_rows(3)
    source = write_csv(tmp_path / "t.csv", rows)
    load_job(store, make_spec(source), clock)
    rows[1]["body"] = "an entirely new text"
    write_csv(source, rows)
    worker, _ = second_store(store)
    other, other_name = second_store(store)  # opened first: on SQLite, opening waits for the store
    try:
        with held_before_commit(worker) as (entered, go):

            def claim() -> int:  # what a tick's execute step does on a direct route
                with worker.begin() as conn:
                    job_id = conn.execute(sa.select(jobs.c.id)).scalar_one()
                    dispatch = new_dispatch(conn, job_id, "echo", "direct", DispatchState.RUNNING, clock.now())
                    return claim_due(conn, dispatch, job_id, clock.now(), 10, "echo")

            claimer = Background(claim)
            claimer.start()
            assert entered.wait(60), "the claim never reached its commit"
            loader = Background(lambda: load_job(other, make_spec(source), clock, requeue_changed=True))
            loader.start()
            ran_or_waits(other, other_name, loader)
            go.set()
            assert claimer.result() == 3
            with pytest.raises(SpecError, match="already sent"):
                loader.result()
    finally:
        other.close()
        worker.close()
    with store.begin() as conn:
        payload = conn.execute(sa.select(payload_text().label("payload")).where(requests.c.custom_id == "T1001")).scalar_one()
    assert "entirely new" not in json.dumps(payload)  # nothing changed: the load was refused whole


def two_loads_at_once(store, clock, first_spec, second_spec) -> tuple[Background, Background]:
    """Two loads of a new job, the second started (on its own connection) while the first
    is held before its commit; both are finished when this returns."""
    other, other_name = second_store(store)
    try:
        with held_before_commit(store) as (entered, go):
            first = Background(lambda: load_job(store, first_spec, clock))
            first.start()
            assert entered.wait(60), "the first load never reached its commit"
            second = Background(lambda: load_job(other, second_spec, clock))
            second.start()
            ran_or_waits(other, other_name, second)
            go.set()
            first.join(60)
            second.join(60)
    finally:
        other.close()
    return first, second


def test_the_same_new_job_loaded_from_two_terminals_at_once_is_stored_once(store, clock, tmp_path):
    """`lowtide run spec` twice at once, before the job exists: the second load waits for the
    first and adds nothing (it crashed with a unique violation on jobs.name on PostgreSQL)."""
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    first, second = two_loads_at_once(store, clock, make_spec(source), make_spec(source))
    assert (first.result().created, first.result().new) == (True, 4)
    assert (second.result().created, second.result().new) == (False, 0)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 4


def test_a_new_job_loaded_at_once_with_another_spec_is_refused_not_written_over(store, clock, tmp_path):
    """The second load found no job, so its spec was never compared with the first's: it is
    refused, and the first load's spec is the one stored."""
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    first, second = two_loads_at_once(store, clock, make_spec(source), make_spec(source, model="another-model"))
    assert first.result().new == 4
    # SQLite runs the loads one after the other (the second sees the job); PostgreSQL at once
    with pytest.raises(SpecError, match="created by another load at the same moment|was stored with model test-model"):
        second.result()
    with store.begin() as conn:
        assert '"model":"test-model"' in conn.execute(sa.select(jobs.c.spec)).scalar_one()
