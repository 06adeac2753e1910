"""A batch the provider fails for its full queue is judged by what was in flight when it was
sent, not by what is still in flight when its failure is read: a batch that ended since (and
was polled first, in the same tick) filled the queue all the same. Judged "alone", a batch of
one request failed that request for good and proved a limit that failed every request as big
(engine/queue_limit.py)."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.core.states import DispatchState
from lowtide.engine import queue_limit
from lowtide.engine.context import JobContext
from lowtide.engine.dispatch import assign, new_dispatch
from lowtide.engine.loader import load_job
from lowtide.store.schema import events, requests
from lowtide.store.transitions import move_dispatch
from tests.conftest import make_spec, ticket_rows, write_csv

ROUTE, MODEL = "openai-batch", "test-model"
REFUSED = "token_limit_exceeded: Enqueued token limit reached for test-model"


def _sent(conn, job_id: int, request_id: int, at: float) -> int:
    """A batch of one request, submitted at `at`."""
    dispatch = new_dispatch(conn, job_id, ROUTE, "batch", DispatchState.PLANNED, at, model=MODEL, input_tokens_est=60)
    assign(conn, dispatch, [request_id], ROUTE, at)
    move_dispatch(conn, dispatch, DispatchState.PLANNED, DispatchState.SUBMITTING)
    move_dispatch(conn, dispatch, DispatchState.SUBMITTING, DispatchState.SUBMITTED, provider_id=f"batch_{request_id}", submitted_at=at)
    return dispatch


def _refusal(store, clock, tmp_path, earlier_ended_at: float):
    """Batch `earlier` (one request) sent at 100 and ended at `earlier_ended_at`; batch `refused`
    (the other) sent at 110, its failure for a full queue read at 150. What came of it."""
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(2)))
    job_id = load_job(store, spec, clock).job_id
    with store.begin() as conn:
        first, second = conn.execute(sa.select(requests.c.id).order_by(requests.c.id)).scalars().all()
        earlier = _sent(conn, job_id, first, at=100.0)
        refused = _sent(conn, job_id, second, at=110.0)
        move_dispatch(conn, earlier, DispatchState.SUBMITTED, DispatchState.ENDED, ended_at=earlier_ended_at)
        job = JobContext.load(conn, job_id)
        waiting = queue_limit.requeue(conn, job, ROUTE, refused, DispatchState.SUBMITTED, REFUSED, 150.0, 30.0)
        state, error = conn.execute(sa.select(requests.c.state, requests.c.error_code).where(requests.c.id == second)).one()
        said = conn.execute(sa.select(events.c.message).where(events.c.kind == "queue_full")).scalar_one()
        return waiting, state, error, said, queue_limit.learned(conn, ROUTE, MODEL, 150.0), queue_limit.proven(conn, ROUTE, MODEL, 150.0)


def test_a_batch_refused_while_another_was_in_flight_waits_though_that_one_ended_since(store, clock, tmp_path):
    # The queue held `earlier` when `refused` was sent; the next tick polled `earlier` first: it
    # ended, and its results were in, before the refusal was read.
    waiting, state, error, said, learned, proof = _refusal(store, clock, tmp_path, earlier_ended_at=150.0)
    # before: judged alone, the request failed (over_token_limit) and a limit under its size was proved
    assert (waiting, state, error) == (1, "pending", None), said
    assert "1 request(s) wait for 1 batch(es) in flight" in said
    assert learned is None and proof is None


def test_a_batch_refused_with_nothing_in_flight_when_it_was_sent_is_still_alone(store, clock, tmp_path):
    # The other side of the same line: a batch that had ended before this one was sent did not
    # fill the queue, so this refusal still teaches (here: proves) the limit.
    waiting, state, error, said, learned, proof = _refusal(store, clock, tmp_path, earlier_ended_at=105.0)
    assert (waiting, state, error) == (0, "failed", "over_token_limit"), said
    assert proof is not None and proof.tokens == 59
