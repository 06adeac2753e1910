"""A request's fate: the one module that decides which state a request moves to.

Code that learns something about a request (an answer, a refusal, a cancel, a deadline, a
batch taken back unsent) reports it here; nothing else in the engine moves a request
(tests/test_codebase.py checks that only this module calls store/transitions.py's request
moves). Every exit is in this table, and each function below is one row of it:

    what happened                                  the request becomes
    ---------------------------------------------  ------------------------------------------------
    a valid answer                  after_outcome  succeeded (in a cancelled job too: it is paid for)
    an invalid answer               after_outcome  pending with one repair turn, then failed
                                                   (failed at once with `repair: false`)
    a retryable failure             after_outcome  pending after a backoff (or on the next lane)
                                                   until retry.max_attempts on its lane, then failed
    a permanent failure             after_outcome  failed, with the provider's words
    any failure, job cancelled      after_outcome  cancelled
    taken back unsent or given      take_back      pending, the attempt given back if nothing was
      back (queue full, a planned                  sent; cancelled if the job is cancelled; failed
      batch undone, a dead worker's,               `deadline_passed` past the job's deadline
      a create that never left)
    the deadline passed unsent      past_deadline  failed `deadline_passed` (pending, or in a batch
                                                   planned but not sent)
    it can never be sent            refuse         failed, naming why and the fix
    sent                            send           dispatched (an attempt; one that carries
                                                   repair turns is kept in repair_sends)
    the user cancels                cancel,        cancelled (what was sent: when it comes back;
                                    cancel_planned a batch planned but not sent: with it)
    the user retries                retry          pending, with a fresh attempt budget
    its source or spec changed      rerender       pending again (a succeeded one as its next
      (--requeue-changed)                          version, the old answer kept)

A job's state is read with its row locked (store/transitions.lock_job) wherever it decides:
a cancel landing between a tick's read and its write still decides.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, func, literal, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.core.outputs import (
    InvalidOutput,
    check_tool_calls,
    parse_output,
    repair_messages,
    tool_repair,
)
from lowtide.core.spec import JobSpec
from lowtide.core.states import DispatchState, JobState, RequestState
from lowtide.core.types import Outcome
from lowtide.engine.context import JobContext
from lowtide.engine.policy import retry_delay
from lowtide.store.bulk import among
from lowtide.store.queries import add_event
from lowtide.store.schema import PENDING, dispatches, repair_sends, requests
from lowtide.store.transitions import (
    lock_job,
    move_dispatch,
    move_requests,
    settle_dispatched,
    start_new_version,
)

DISPATCHED = RequestState.DISPATCHED.value
# Read from its class once: a member read from an Enum costs ~70 ns (Python 3.11), and every answer is one.
SUCCEEDED = RequestState.SUCCEEDED
# Failures that say the batch ran out of time, not that the request is bad: with a fallback
# route they go there at once instead of waiting for another batch.
OUT_OF_TIME = frozenset({"expired", "batch_expired", "batch_cancelled", "canceled", "cancelled", "batch_lost", "results_expired"})


# --- answers and failures that came back -------------------------------------------------


def after_outcome(
    job: JobContext, state: JobState, req, outcome: Outcome, row: dict, route: str, choices, now: float, rng: random.Random,
    called: tuple[list[dict], str, Any] | None = None, together: float = 0.0,
) -> RequestState:  # fmt: skip
    """The next state of a request after an outcome from the dispatch it is in; fills in
    `row` to match (engine/ingest.py: SUCCEEDED_COLUMNS for a success, OTHER_COLUMNS
    otherwise). `state` is the job's, read under its lock. `called`, where the answer is a
    tool call: its calls, the request's endpoint and its tools; the calls are then the
    answer, checked against their tools' parameters; choices and a schema apply to text.
    `together`: a retry is due at the next multiple of it after its backoff (a batch
    route's first poll interval), so retries due within it share a batch."""
    spec = job.spec
    if outcome.ok:
        try:
            if called:
                check_tool_calls(called[0], called[2])
                parsed = None
            else:
                parsed = parse_output(outcome.text or "", spec.response_schema, choices)
        except InvalidOutput as err:
            _not_succeeded(row, req, outcome)
            row["error_code"] = "invalid_output"
            if req.repair is None and spec.repair and state in (JobState.ACTIVE, JobState.BUDGET_EXHAUSTED):
                # One more try, with the validation error in the conversation.
                row["error_message"] = f"answer invalid, retrying once: {err}"
                turns = (
                    tool_repair(called[1], outcome.response or {}, called[0], str(err)) if called
                    else repair_messages(outcome.text or "", str(err), spec.response_schema)
                )  # fmt: skip
                row["repair"] = json.dumps(turns)
                return RequestState.PENDING
            row["error_message"] = (
                f"answer invalid after one repair attempt: {err}" if req.repair
                else f"answer invalid: {err}" if spec.repair else f"answer invalid (repair: false, not retried): {err}"
            )  # fmt: skip
            return RequestState.FAILED
        if parsed is not None:
            row["parsed"] = _choice_json(parsed) if parsed.__class__ is str else json.dumps(parsed, ensure_ascii=False)
        return SUCCEEDED
    _not_succeeded(row, req, outcome)
    if state is JobState.CANCELLED:
        return RequestState.CANCELLED
    tries = req.attempts - req.lane_base_attempts  # on this lane
    up = job.next_lane(req.lane) if outcome.retryable else None  # the fallback lane, or a chain's next tier
    if up is not None:
        out_of_time = outcome.error_code in OUT_OF_TIME
        if out_of_time or tries >= spec.retry.max_attempts:
            why = outcome.error_code if out_of_time else f"failed {tries} time(s), last: {outcome.error_code}"
            row.update(lane=up, lane_base_attempts=req.attempts, lane_reason=f"{why} on {route}")
            return RequestState.PENDING
    if outcome.retryable and tries < spec.retry.max_attempts:
        due = now + retry_delay(spec.retry, tries, rng)
        row["not_before"] = math.ceil(due / together) * together if together > 0 else due
        return RequestState.PENDING
    if outcome.retryable:
        row["error_message"] = f"{outcome.error_message} (gave up after {req.attempts} attempts)"
    return RequestState.FAILED


@lru_cache(maxsize=256)  # a job's parsed answers that are text are its few choices
def _choice_json(choice: str) -> str:
    return json.dumps(choice, ensure_ascii=False)


def _not_succeeded(row: dict, req, outcome: Outcome) -> None:
    """The columns beyond a success's, as they stay unless `after_outcome` changes them."""
    row.update(
        error_code=outcome.error_code, error_message=outcome.error_message, not_before=0.0, repair=req.repair,
        lane=req.lane, lane_reason=req.lane_reason, lane_base_attempts=req.lane_base_attempts,
    )  # fmt: skip


def settle(conn: Connection, target: RequestState, dispatch_id: int, rows: Sequence[dict], columns: Sequence[str],
           shared: dict[str, Any]) -> None:  # fmt: skip
    """Write what `after_outcome` decided, only on requests still in the dispatch (a stale
    result changes nothing: DESIGN invariant 2)."""
    settle_dispatched(conn, target, dispatch_id, rows, columns, shared)


# --- requests that were not sent, or given back ------------------------------------------


def deadline_passed(spec: JobSpec, now: float) -> bool:
    return spec.deadline is not None and now >= spec.deadline.timestamp()


def _deadline_words(spec: JobSpec) -> str:
    when = datetime.fromtimestamp(spec.deadline.timestamp(), UTC).isoformat(timespec="seconds")  # with its offset
    return f"the job's deadline ({when}) passed"


def deadline_values(spec: JobSpec, now: float) -> dict[str, Any]:
    return {
        "error_code": "deadline_passed",
        "error_message": f"{_deadline_words(spec)} before this request was sent; raise `deadline` and run "
        "`lowtide retry JOB --failed`",
        "updated_at": now,
    }


def deadline_after_values(spec: JobSpec, now: float) -> dict[str, Any]:
    """What a request carries that was sent, failed retryably and waited to go again."""
    last = func.coalesce(requests.c.error_code, "unknown") + ": " + func.coalesce(requests.c.error_message, "")
    said = (f"{_deadline_words(spec)} before this request could be sent again (raise `deadline` and run "
            "`lowtide retry JOB --failed`); its last attempt: ")
    return {
        "error_code": "deadline_passed",
        "error_message": func.substr(literal(said) + last, 1, 2000),
        "updated_at": now,
    }


def cancelled_values(now: float) -> dict[str, Any]:
    """What a request cancelled by the user carries."""
    return {"error_code": "cancelled", "error_message": "cancelled by the user", "updated_at": now}


def unsent_exit(conn: Connection, job_id: int, spec: JobSpec, now: float) -> tuple[RequestState, dict[str, Any]]:
    """Where a request goes that is not (or no longer) on its way to a provider, and what it
    then carries: it waits (pending) unless its job is cancelled or its deadline passed.
    Locks the job's row, so a cancel decides before or after, never between."""
    state = lock_job(conn, job_id)
    if state == JobState.CANCELLED.value:
        return RequestState.CANCELLED, cancelled_values(now)
    if deadline_passed(spec, now):
        return RequestState.FAILED, deadline_values(spec, now)
    return RequestState.PENDING, {"updated_at": now}


def take_back(
    conn: Connection, job: JobContext, dispatch_id: int, now: float, *, sent: bool, values: dict[str, Any] | None = None,
) -> dict[RequestState, int]:  # fmt: skip
    """The requests still in a dispatch leave it without an answer: a queue-full refusal, a
    batch taken apart before it was sent, a dead worker's, a create that never left. Each
    goes to its `unsent_exit`. `sent` False: nothing reached a provider, so the attempt is
    given back. `values` apply to those that wait again (a lane, a not_before)."""
    target, carried = unsent_exit(conn, job.id, job.spec, now)
    waiting = and_(requests.c.dispatch_id == dispatch_id, requests.c.state == DISPATCHED)
    moved = {"dispatch_id": None, **carried}
    if not sent:
        moved["attempts"] = requests.c.attempts - 1
    if target is RequestState.PENDING:
        moved.update(values or {})
        if not sent and "lane_base_attempts" in moved:  # an unsent claim was no attempt on the new lane either
            moved["lane_base_attempts"] = requests.c.attempts - 1
    n = move_requests(conn, target, waiting, values=moved)
    if n and target is not RequestState.PENDING:
        add_event(conn, job.id, target.value, f"{n} request(s) taken back unsent: {carried['error_message']}", now)
    return {target: n}


def undo_planned(conn: Connection, job: JobContext, dispatch_id: int, now: float, values: dict[str, Any] | None = None) -> int | None:
    """A batch planned but not sent is taken apart: the dispatch ends cancelled and its
    requests leave it unsent (`take_back`); how many. None if another worker has just begun
    to send it (it is no longer planned)."""
    if not move_dispatch(conn, dispatch_id, DispatchState.PLANNED, DispatchState.CANCELLED, ended_at=now):
        return None
    return sum(take_back(conn, job, dispatch_id, now, sent=False, values=values).values())


def past_deadline(conn: Connection, job: JobContext, now: float) -> int:
    """Past the job's deadline nothing more is sent: pending requests, and those in batches
    planned but not sent, fail `deadline_passed`. (A create already begun is resolved by
    the submit step: adopted if it reached the provider, else failed the same way.)"""
    if not deadline_passed(job.spec, now):
        return 0
    lock_job(conn, job.id)
    waiting = and_(requests.c.job_id == job.id, requests.c.state == PENDING)
    n = move_requests(conn, RequestState.FAILED, and_(waiting, requests.c.attempts == 0), values=deadline_values(job.spec, now))
    # One that was sent and waits to go again (a lost batch, a retryable failure) says so, and
    # keeps its last attempt's words: "before it was sent" would be untrue of it.
    n += move_requests(conn, RequestState.FAILED, and_(waiting, requests.c.attempts > 0), values=deadline_after_values(job.spec, now))
    planned = conn.scalars(
        select(dispatches.c.id).where(dispatches.c.job_id == job.id, dispatches.c.state == DispatchState.PLANNED.value)
    ).all()
    for dispatch_id in planned:
        n += undo_planned(conn, job, dispatch_id, now) or 0
    if n:
        add_event(conn, job.id, "deadline", f"{n} unsent request(s) failed: deadline passed", now)
    return n


def refuse(conn: Connection, job_id: int, request_ids: Sequence[int], code: str, message: str, now: float) -> int:
    """Pending requests of a job that can never be sent (e.g. bigger than the provider's
    whole queue) fail now, naming why and the fix."""
    return move_requests(
        conn, RequestState.FAILED, and_(requests.c.job_id == job_id, among(conn, requests.c.id, request_ids)),
        only=[RequestState.PENDING], values={"error_code": code, "error_message": message, "updated_at": now},
    )  # fmt: skip


def refuse_dispatched(conn: Connection, job: JobContext, dispatch_id: int, code: str, message: str, now: float) -> int:
    """The requests still in a dispatch that a provider will never accept fail now, with its
    words (the attempt stands: the provider saw them); cancelled if the job is."""
    target, carried = unsent_exit(conn, job.id, job.spec, now)
    if target is not RequestState.CANCELLED:
        target, carried = RequestState.FAILED, {"error_code": code, "error_message": message, "updated_at": now}
    waiting = and_(requests.c.dispatch_id == dispatch_id, requests.c.state == DISPATCHED)
    return move_requests(conn, target, waiting, values=carried)


# --- sending ---------------------------------------------------------------------------------


def send(conn: Connection, dispatch_id: int, which: ColumnElement[bool], route: str, now: float) -> int:
    """Pending requests `which` selects join a dispatch: one attempt each. Those that carry
    repair turns are noted (schema.repair_sends): their attempts' cost is reported apart."""
    n = move_requests(
        conn, RequestState.DISPATCHED, which, only=[RequestState.PENDING],
        values={"dispatch_id": dispatch_id, "attempts": requests.c.attempts + 1, "route": route, "updated_at": now},
    )  # fmt: skip
    if n:
        repairs = select(requests.c.id, literal(dispatch_id), requests.c.job_id).where(
            which, requests.c.dispatch_id == dispatch_id, requests.c.state == DISPATCHED, requests.c.repair.is_not(None)
        )
        into = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(repair_sends)
        conn.execute(into.from_select(["request_id", "dispatch_id", "job_id"], repairs).on_conflict_do_nothing())
    return n


# --- what the user does ----------------------------------------------------------------------


def cancel(conn: Connection, job_id: int, which: ColumnElement[bool], now: float, *, sent: bool = True) -> int:
    """The user cancels: requests `which` selects that are pending, or in a dispatch that
    never sent them, are cancelled now. They leave that dispatch, as `take_back`'s do: a
    direct dispatch stays running until its worker (or, for a dead worker, its lease) ends
    it, and must not hold them meanwhile; an answer it still brings is stale. `sent` False:
    `which` selects requests claimed by a plan that never left, whose attempt is given back."""
    values = {**cancelled_values(now), "dispatch_id": None}
    if not sent:
        values["attempts"] = requests.c.attempts - 1
    return move_requests(conn, RequestState.CANCELLED, and_(requests.c.job_id == job_id, which), values=values)


def cancel_planned(conn: Connection, job_id: int, dispatch_id: int, now: float) -> int:
    """The user cancels a batch planned but not sent: it ends cancelled with the requests it
    holds, read once the dispatch is taken (a compare-and-set; 0 if another worker has just
    begun to send it). Read by the batch, not by a statement over the job: a batch another
    worker planned while the cancel waited for its rows is not yet visible to that statement
    (PostgreSQL), and its requests stayed `dispatched` in a cancelled batch for ever. Nothing
    was sent, so the plan's attempt is given back, as `undo_planned` gives it."""
    if not move_dispatch(conn, dispatch_id, DispatchState.PLANNED, DispatchState.CANCELLED, ended_at=now):
        return 0
    return cancel(conn, job_id, and_(requests.c.dispatch_id == dispatch_id, requests.c.state == DISPATCHED), now, sent=False)


def rerender(conn: Connection, ids: list[int], state: RequestState, values: dict[str, Any], succeeded_rows: Sequence[dict] = ()) -> None:
    """`--requeue-changed`: changed requests that ended failed or cancelled (`ids`, all in
    `state`) wait again with `values` (a fresh attempt budget); succeeded ones
    (`succeeded_rows`: {"_id", …}) start again as their next version, their old answer
    kept in request_versions by the caller (engine/changes.py)."""
    if ids:
        move_requests(conn, RequestState.PENDING, among(conn, requests.c.id, ids), only=[state], values=values)
    if succeeded_rows:
        start_new_version(conn, succeeded_rows, values)


def retry(conn: Connection, job_id: int, states: Iterable[RequestState], now: float) -> int:
    """The user retries failed and/or cancelled requests: pending again, with a fresh
    attempt budget, on the main lane."""
    states = list(states)
    return move_requests(
        conn, RequestState.PENDING,
        and_(requests.c.job_id == job_id, requests.c.state.in_([s.value for s in states])),
        only=states,
        values={
            "attempts": 0, "not_before": 0.0, "repair": None, "dispatch_id": None, "updated_at": now,
            "lane": "main", "lane_reason": None, "lane_base_attempts": 0,
        },
    )  # fmt: skip
