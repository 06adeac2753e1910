"""States as str enums with one transition table each (rq's JobStatus, with its gap closed).

Only `lowtide.store.transitions` writes a state column, and it checks these tables.
"""

from __future__ import annotations

from enum import StrEnum


class RequestState(StrEnum):
    PENDING = "pending"  # stored, waiting to be sent (first time or retry)
    DISPATCHED = "dispatched"  # handed to a route: in a batch, or executing directly
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_REQUEST_STATES = frozenset(
    {RequestState.SUCCEEDED, RequestState.FAILED, RequestState.CANCELLED}
)

REQUEST_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.PENDING: frozenset(
        {RequestState.DISPATCHED, RequestState.FAILED, RequestState.CANCELLED}
    ),
    RequestState.DISPATCHED: frozenset(
        {
            RequestState.PENDING,  # retry, or reclaimed from a dead worker
            RequestState.SUCCEEDED,
            RequestState.FAILED,
            RequestState.CANCELLED,
        }
    ),
    RequestState.SUCCEEDED: frozenset(),
    RequestState.FAILED: frozenset({RequestState.PENDING}),  # `lowtide retry --failed`
    RequestState.CANCELLED: frozenset({RequestState.PENDING}),  # `lowtide retry --cancelled`
}


class DispatchState(StrEnum):
    """A dispatch is one group of requests handed to one route: a provider batch, or a
    group executed directly. Batch routes go planned → submitting → submitted → ended."""

    PLANNED = "planned"  # requests assigned, nothing sent
    SUBMITTING = "submitting"  # intent recorded; the provider call may or may not have happened
    SUBMITTED = "submitted"  # provider id recorded; polling
    RUNNING = "running"  # direct route: executing under a lease
    ENDED = "ended"  # results ingested
    FAILED = "failed"  # the provider refused the whole batch
    ABANDONED = "abandoned"  # lease expired or owner died; requests went back to pending
    CANCELLED = "cancelled"


TERMINAL_DISPATCH_STATES = frozenset(
    {DispatchState.ENDED, DispatchState.FAILED, DispatchState.ABANDONED, DispatchState.CANCELLED}
)

DISPATCH_TRANSITIONS: dict[DispatchState, frozenset[DispatchState]] = {
    DispatchState.PLANNED: frozenset({DispatchState.SUBMITTING, DispatchState.CANCELLED}),
    DispatchState.SUBMITTING: frozenset(
        {DispatchState.SUBMITTED, DispatchState.FAILED, DispatchState.CANCELLED, DispatchState.PLANNED}
    ),
    DispatchState.SUBMITTED: frozenset(
        {DispatchState.ENDED, DispatchState.FAILED, DispatchState.CANCELLED}
    ),
    DispatchState.RUNNING: frozenset(
        {DispatchState.ENDED, DispatchState.ABANDONED, DispatchState.CANCELLED}
    ),
    DispatchState.ENDED: frozenset(),
    DispatchState.FAILED: frozenset(),
    DispatchState.ABANDONED: frozenset(),
    DispatchState.CANCELLED: frozenset(),
}


class JobState(StrEnum):
    ACTIVE = "active"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    # The next batch or direct dispatch would have gone over the job's `budget_usd`: nothing
    # more is sent; batches in flight are still collected. Submitting the spec again (with
    # a bigger budget) makes it active.
    BUDGET_EXHAUSTED = "budget_exhausted"


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.ACTIVE: frozenset({JobState.FINISHED, JobState.CANCELLED, JobState.BUDGET_EXHAUSTED}),
    JobState.FINISHED: frozenset({JobState.ACTIVE}),  # new rows, or a retry
    JobState.CANCELLED: frozenset({JobState.ACTIVE}),  # a retry of cancelled requests
    # resubmitted, cancelled, or every request ended anyway (what was in flight came back)
    JobState.BUDGET_EXHAUSTED: frozenset({JobState.ACTIVE, JobState.CANCELLED, JobState.FINISHED}),
}


def check_transition(table: dict, current: str, target: str) -> None:
    """Raise ValueError if `current → target` is not in `table`."""
    allowed = table.get(current)
    if allowed is None or target not in allowed:
        raise ValueError(f"illegal state transition '{current}' → '{target}'")
