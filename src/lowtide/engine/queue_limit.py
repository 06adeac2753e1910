"""Enqueued-token limits: a provider that caps the input tokens of one model waiting in its
batch queue (OpenAI: `token_limit_exceeded`, core/batch_limits.py) is planned within it.

    room(model) = limit − Σ input_tokens_est of this route's live dispatches of the model
                  (planned, submitting, submitted: every job in this store counts)
    a chunk takes requests while they fit in the room; the rest waits for a later tick

A batch the provider still fails for its full queue (a limit set too high, or other users of
the same organization) is not a failure of its requests: they go back to pending without
losing an attempt (engine/fate.py `take_back`: cancelled instead if the job is, failed past
its deadline), and the model is *held* — nothing more of it is planned — until one of the
batches that were in flight when it failed has ended, and at least the route's first poll
interval has passed.

A batch refused with nothing of its model in flight would be refused again for ever (no
limit set, a tier-1 organization, chunks of 10,000): the refusal teaches a limit instead,
half that batch's tokens, kept for a day, so the next chunk is half the size; a batch of one
request refused alone can never be queued, and that request fails with the provider's words.
A request bigger than the whole limit can never be enqueued: it fails at once, naming its
size, the limit and the fix. The first request of an empty queue is always let through,
whatever was learned: the provider tells.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from lowtide.core.states import DispatchState, RequestState
from lowtide.engine import fate
from lowtide.engine.context import JobContext
from lowtide.store.queries import add_event
from lowtide.store.schema import dispatches, meta
from lowtide.store.transitions import move_dispatch

QUEUE_FULL = "token_limit_exceeded"
LIVE = (DispatchState.PLANNED.value, DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value)
CHARS_PER_TOKEN = 4  # the approximation of lowtide.core.tokens (as budgets use): an over-count
LEARNED_FOR = 86400.0  # seconds a limit learned from a refusal stands (an organization's tier may rise)


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


@dataclass(slots=True)
class Room:
    """What of one model's queue a plan may still fill: `left` tokens (None: no limit known),
    `limit` the configured whole (None: none), `empty` nothing of the model enqueued yet."""

    left: int | None
    limit: int | None
    empty: bool

    def take(self, need: int) -> bool | None:
        """True: a request of `need` tokens goes into the plan; False: it waits; None: it
        can never be queued (bigger than the whole configured limit)."""
        if self.limit is not None and need > self.limit:
            return None
        if self.left is None:
            return True
        if need <= self.left or self.empty:  # alone in an empty queue it goes: the provider tells
            self.left = max(self.left - need, 0)
            self.empty = False
            return True
        self.left = 0  # the queue is full for this model: the rest waits
        return False


def room(conn: Connection, route: str, model: str, limit: int | None, now: float) -> Room:
    """The room left in `route`'s queue for `model` now: the configured limit or the one a
    refusal taught (the smaller), less what this store has enqueued; none while held."""
    if held(conn, route, model):
        return Room(0, limit, False)
    caps = [c for c in (limit, learned(conn, route, model, now)) if c is not None]
    used = enqueued(conn, route, model)
    return Room(max(min(caps) - used, 0) if caps else None, limit, used == 0)


def _learned_key(route: str, model: str) -> str:
    return f"queue_limit {route} {model}"


def learned(conn: Connection, route: str, model: str, now: float) -> int | None:
    raw = conn.execute(select(meta.c.value).where(meta.c.key == _learned_key(route, model))).scalar()
    if raw is None:
        return None
    kept = json.loads(raw)
    return kept["tokens"] if now - kept["at"] < LEARNED_FOR else None


def learn(conn: Connection, route: str, model: str, tokens: int, now: float) -> None:
    key, value = _learned_key(route, model), json.dumps({"tokens": tokens, "at": now})
    if conn.execute(meta.update().where(meta.c.key == key).values(value=value)).rowcount == 0:
        conn.execute(meta.insert().values(key=key, value=value))


def refuse_oversized(conn: Connection, job: JobContext, route: str, model: str, rid: int, tokens: int, limit: int, now: float) -> None:
    reason = (
        f"about {tokens:,} input tokens, over {route}'s enqueued-token limit of {limit:,} for {model}: it can never be "
        "queued; raise route_options.max_enqueued_tokens (or tier) to your organization's limit, or shorten the request"
    )
    if fate.refuse(conn, job.id, rid, "over_token_limit", reason, now):
        add_event(conn, job.id, "over_token_limit", f"1 request: {reason}", now)


def requeue(conn: Connection, job: JobContext, route: str, dispatch_id: int, current: DispatchState, reason: str,
            now: float, wait: float) -> int:  # fmt: skip
    """The provider's queue was full: the dispatch ends failed (holding the model while
    batches it waits for are in flight, see `held`; teaching a smaller limit when none
    is), its requests leave it unsent (`fate.take_back`). Returns how many wait again."""
    model, size, tokens = conn.execute(
        select(dispatches.c.model, dispatches.c.size, dispatches.c.input_tokens_est).where(dispatches.c.id == dispatch_id)
    ).one()  # fmt: skip
    in_flight = conn.execute(
        select(func.count(), func.coalesce(func.sum(dispatches.c.input_tokens_est), 0)).where(
            dispatches.c.route == route, dispatches.c.model == model, dispatches.c.id != dispatch_id,
            dispatches.c.state == DispatchState.SUBMITTED.value,
        )
    ).one()  # fmt: skip
    error = reason if reason.startswith(QUEUE_FULL) else f"{QUEUE_FULL}: {reason}"
    alone = in_flight[0] == 0
    if alone and size <= 1:
        why = (
            f"{route} refused it for its queue limit with nothing else of {model} in flight ({error}): it cannot be "
            "queued as it is; shorten the request, or raise your organization's limit, then `lowtide retry JOB --failed`"
        )
        n = fate.refuse_dispatched(conn, job, dispatch_id, "over_token_limit", why, now)
        waiting = 0
        said = f"{route}: {n} request(s) failed: {why}"
    else:
        taken = fate.take_back(conn, job, dispatch_id, now, sent=False, values={"not_before": now + wait})
        waiting = taken.get(RequestState.PENDING, 0)
        if alone and model is not None and tokens:
            learn(conn, route, model, max(tokens // 2, 1), now)
            said = (
                f"{route}: the provider's queue for {model} refused {size} request(s) (about {int(tokens):,} tokens) with "
                f"nothing else in flight ({error}); its limit is taken as about {max(tokens // 2, 1):,} tokens for a day "
                f"(set route_options.max_enqueued_tokens or tier to say it); {waiting} request(s) are sent again in smaller batches"
            )
        else:
            said = (
                f"{route}: the provider's queue for {model} is full ({error}); {waiting} request(s) wait for "
                f"{in_flight[0]} batch(es) in flight (about {int(in_flight[1]):,} tokens) to end, then are sent again"
            )
    move_dispatch(conn, dispatch_id, current, DispatchState.FAILED, error=error[:2000], ended_at=now)
    add_event(conn, job.id, "queue_full", said, now)
    return waiting
