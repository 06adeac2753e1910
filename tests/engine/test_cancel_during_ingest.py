"""A cancel that lands while a tick is working: outcomes the tick applies afterwards follow
the job's state in the store, not the state the tick read when it began. Before the fix, a
retryable outcome (a batch the cancel had just ended came back `canceled`) was requeued as
pending under the tick's stale `active`, and the cancelled job ended with requests left
pending forever (DESIGN invariant 4)."""

from __future__ import annotations

import random

import sqlalchemy as sa

from lowtide.core.states import DispatchState, RequestState
from lowtide.core.types import Outcome
from lowtide.engine.context import JobContext
from lowtide.engine.control import cancel_job
from lowtide.engine.ingest import apply_outcomes
from lowtide.engine.loader import load_job
from lowtide.store.schema import dispatches, jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv


def test_outcomes_applied_after_a_cancel_end_cancelled_even_for_a_tick_that_read_active(store, clock, tmp_path):
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route="echo-batch")
    load_job(store, spec, clock)
    with store.begin() as conn:
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())  # what a tick read: active
        dispatch_id = conn.execute(
            sa.insert(dispatches).values(job_id=job.id, route="echo-batch", kind="batch", key="k1", provider_id="b1",
                                         state=DispatchState.SUBMITTED.value, size=3, created_at=clock.now())  # fmt: skip
        ).inserted_primary_key[0]
        conn.execute(sa.update(requests).values(state=RequestState.DISPATCHED.value, dispatch_id=dispatch_id, attempts=1))
        ids = list(conn.scalars(sa.select(requests.c.custom_id)))
    cancel_job(store, spec.name, clock)  # lands while the tick is between its read and its ingest
    came_back = [Outcome.failure(cid, "batch_cancelled", "request canceled", True) for cid in ids]
    with store.begin() as conn:
        apply_outcomes(conn, job, dispatch_id, "echo-batch", came_back, clock.now(), random.Random(1))
    with store.begin() as conn:
        states = list(conn.scalars(sa.select(requests.c.state)))
    assert states == [RequestState.CANCELLED.value] * 3, states
