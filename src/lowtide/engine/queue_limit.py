"""Enqueued-token limits: a provider that caps the input tokens of one model waiting in its
batch queue (OpenAI: `token_limit_exceeded`, core/batch_limits.py) is planned within it.

    room(model) = limit − Σ input_tokens_est of this route's live dispatches of the model
                  (planned, submitting, submitted: every job in this store counts)
    a chunk takes requests while they fit in the room; the rest waits for a later tick

A batch the provider still fails for its full queue (a limit set too high, or other users of
the same organization) is not a failure of its requests: they go back to pending without
losing an attempt, and the model is *held* — nothing more of it is planned — until one of
the batches that were in flight when it failed has ended, and at least the route's first
poll interval has passed. A request bigger than the whole limit can never be enqueued: it
fails at once, naming its size, the limit and the fix.
"""

from __future__ import annotations

import math

from sqlalchemy import Connection, and_, func, select

from lowtide.core.states import DispatchState, RequestState
from lowtide.engine.context import JobContext
from lowtide.store.queries import add_event
from lowtide.store.schema import dispatches, requests
from lowtide.store.transitions import move_dispatch, move_requests

QUEUE_FULL = "token_limit_exceeded"
LIVE = (DispatchState.PLANNED.value, DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value)
CHARS_PER_TOKEN = 4  # the approximation of lowtide.core.tokens (as budgets use): an over-count


def tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def enqueued(conn: Connection, route: str, model: str) -> int:
    return int(
        conn.execute(
            select(func.coalesce(func.sum(dispatches.c.input_tokens_est), 0)).where(
                dispatches.c.route == route, dispatches.c.model == model, dispatches.c.state.in_(LIVE)
            )
        ).scalar_one()
    )


def held(conn: Connection, route: str, model: str) -> bool:
    """Whether the model's last queue-full refusal still stands: a batch that was in flight
    when it came is still in flight."""
    failed_at = conn.execute(
        select(func.max(dispatches.c.ended_at)).where(
            dispatches.c.route == route, dispatches.c.model == model,
            dispatches.c.state == DispatchState.FAILED.value, dispatches.c.error.like(f"{QUEUE_FULL}%"),
        )
    ).scalar_one()  # fmt: skip
    if failed_at is None:
        return False
    return (
        conn.execute(
            select(dispatches.c.id).where(
                dispatches.c.route == route, dispatches.c.model == model,
                dispatches.c.state == DispatchState.SUBMITTED.value, dispatches.c.submitted_at <= failed_at,
            ).limit(1)
        ).first()
        is not None
    )  # fmt: skip


def room(conn: Connection, route: str, model: str, limit: int | None) -> int | None:
    """Input tokens of `model` that may still be planned on `route` now; None: no limit."""
    if held(conn, route, model):
        return 0
    if limit is None:
        return None
    return max(limit - enqueued(conn, route, model), 0)


def refuse_oversized(conn: Connection, job: JobContext, route: str, model: str, rid: int, tokens: int, limit: int, now: float) -> None:
    reason = (
        f"about {tokens:,} input tokens, over {route}'s enqueued-token limit of {limit:,} for {model}: it can never be "
        "queued; raise route_options.max_enqueued_tokens (or tier) to your organization's limit, or shorten the request"
    )
    n = move_requests(
        conn, RequestState.FAILED, requests.c.id == rid, only=[RequestState.PENDING],
        values={"error_code": "over_token_limit", "error_message": reason, "updated_at": now},
    )  # fmt: skip
    if n:
        add_event(conn, job.id, "over_token_limit", f"1 request: {reason}", now)


def requeue(conn: Connection, job: JobContext, route: str, dispatch_id: int, current: DispatchState, reason: str,
            now: float, wait: float) -> int:  # fmt: skip
    """The provider's queue was full: the dispatch ends failed (holding the model, see
    `held`), its requests go back to pending with the attempt given back."""
    waiting = and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value)
    n = move_requests(
        conn, RequestState.PENDING, waiting,
        values={"attempts": requests.c.attempts - 1, "not_before": now + wait, "updated_at": now},
    )  # fmt: skip
    error = reason if reason.startswith(QUEUE_FULL) else f"{QUEUE_FULL}: {reason}"
    move_dispatch(conn, dispatch_id, current, DispatchState.FAILED, error=error[:2000], ended_at=now)
    model, = conn.execute(select(dispatches.c.model).where(dispatches.c.id == dispatch_id)).one()
    in_flight = conn.execute(
        select(func.count(), func.coalesce(func.sum(dispatches.c.input_tokens_est), 0)).where(
            dispatches.c.route == route, dispatches.c.model == model, dispatches.c.state == DispatchState.SUBMITTED.value
        )
    ).one()  # fmt: skip
    add_event(
        conn, job.id, "queue_full",
        f"{route}: the provider's queue for {model} is full ({error}); {n} request(s) wait for "
        f"{in_flight[0]} batch(es) in flight (about {int(in_flight[1]):,} tokens) to end, then are sent again",
        now,
    )  # fmt: skip
    return n
