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
limit set, a tier-1 organization, chunks of 10,000). In flight means in the queue when the
refused batch was sent: still in flight, or ended since (one polled and ingested just before
the refusal is read counts). Such a refusal teaches a limit instead,
half that batch's tokens, kept for a day, so the next chunk is half the size. A batch of one
request refused alone can never be queued: that request fails with the provider's words, and
the refusal *proves* the limit is under its size (kept for a day too). Every request of the
model at least that big then fails at once, naming its size, the limit and the fix, rather
than being sent alone and refused one batch and one poll at a time (simulation finding 3).
A request bigger than the whole configured limit fails the same way. The first request of an
empty queue is otherwise let through, whatever was guessed: the provider tells.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, and_, func, or_, select

from lowtide.core.states import DispatchState, RequestState
from lowtide.core.tokens import approx_from
from lowtide.engine import fate
from lowtide.engine.context import JobContext
from lowtide.store.payloads import payload_bytes, payload_chars
from lowtide.store.queries import add_event
from lowtide.store.schema import PENDING, dispatches, meta, requests
from lowtide.store.transitions import move_dispatch

QUEUE_FULL = "token_limit_exceeded"
LIVE = (DispatchState.PLANNED.value, DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value)
# A sent batch in these states was in the provider's queue until it ended (one that failed
# was refused, and never queued).
ENDED_AFTER_QUEUEING = (DispatchState.ENDED.value, DispatchState.CANCELLED.value)
LEARNED_FOR = 86400.0  # seconds a limit learned from a refusal stands (an organization's tier may rise)


def approx_sql(chars: ColumnElement, nbytes: ColumnElement) -> ColumnElement:
    """A stored request's input tokens as budgets estimate them (core/tokens.approx_from over
    its JSON, of `chars` characters and `nbytes` bytes), in SQL but for the ceiling: 4 ×
    tokens = characters + 2 × (bytes − characters)."""
    return (nbytes * 2 - chars) / 4.0


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
    `limit` the configured whole (None: none), `empty` nothing of the model enqueued yet,
    `proven` the most a lone refusal left possible (None: none stands)."""

    left: int | None
    limit: int | None
    empty: bool
    proven: Proven | None = None

    @property
    def never(self) -> int | None:
        """Tokens above which a request can never be queued: the smaller of the configured
        limit and the proven one."""
        caps = [c for c in (self.limit, self.proven.tokens if self.proven else None) if c is not None]
        return min(caps) if caps else None

    def take(self, need: int) -> bool | None:
        """True: a request of `need` tokens goes into the plan; False: it waits; None: it
        can never be queued (bigger than the whole configured limit, or than a proven one)."""
        never = self.never
        if never is not None and need > never:
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
    proof = proven(conn, route, model, now)
    if held(conn, route, model):
        return Room(0, limit, False, proof)
    caps = [c for c in (limit, learned(conn, route, model, now)) if c is not None]
    used = enqueued(conn, route, model)
    return Room(max(min(caps) - used, 0) if caps else None, limit, used == 0, proof)


def _learned_key(route: str, model: str) -> str:
    return f"queue_limit {route} {model}"


def _kept(conn: Connection, route: str, model: str, now: float) -> dict | None:
    """What refusals taught about the model's limit, while it stands (a day): `tokens` the
    room planned within; `proven` and `proof`, where a lone request was refused, the most
    that can fit and how that was learned."""
    raw = conn.execute(select(meta.c.value).where(meta.c.key == _learned_key(route, model))).scalar()
    if raw is None:
        return None
    kept = json.loads(raw)
    return kept if now - kept["at"] < LEARNED_FOR else None


def learned(conn: Connection, route: str, model: str, now: float) -> int | None:
    kept = _kept(conn, route, model, now)
    return kept["tokens"] if kept else None


@dataclass(frozen=True, slots=True)
class Proven:
    """A limit a lone refusal proved: no request over `tokens` fits; `said` is how (the
    refused request's size and the provider's words)."""

    tokens: int
    said: str


def proven(conn: Connection, route: str, model: str, now: float) -> Proven | None:
    kept = _kept(conn, route, model, now)
    return Proven(kept["proven"], kept["proof"]) if kept and "proven" in kept else None


def learn(conn: Connection, route: str, model: str, tokens: int, now: float, proof: str | None = None) -> None:
    """Keep a limit for a day: a guess (half a refused batch), or with `proof` the most a
    refused lone request leaves possible (which also caps the guess). A proof that stands
    is kept through later guesses; a smaller proof replaces it."""
    kept = _kept(conn, route, model, now) or {}
    value: dict = {"tokens": tokens, "at": now}
    if "proven" in kept:
        value.update(proven=kept["proven"], proof=kept["proof"], tokens=min(tokens, kept["proven"]))
    if proof is not None and ("proven" not in kept or tokens < kept["proven"]):
        value.update(proven=tokens, proof=proof, tokens=min(tokens, kept.get("tokens", tokens)))
    key, raw = _learned_key(route, model), json.dumps(value)
    if conn.execute(meta.update().where(meta.c.key == key).values(value=raw)).rowcount == 0:
        conn.execute(meta.insert().values(key=key, value=raw))


def _oversized_reason(route: str, model: str, tokens: int, room: Room) -> str:
    if room.limit is not None and tokens > room.limit:
        return (
            f"about {tokens:,} input tokens, over {route}'s enqueued-token limit of {room.limit:,} for {model}: it can never "
            "be queued; raise route_options.max_enqueued_tokens (or tier) to your organization's limit, or shorten the request"
        )
    assert room.proven is not None
    return (
        f"about {tokens:,} input tokens, over the at most {room.proven.tokens:,} that {route}'s enqueued-token queue for "
        f"{model} can hold: {room.proven.said}; it cannot be queued either; shorten the request, or raise your "
        "organization's limit, then `lowtide retry JOB --failed`"
    )


def refuse_oversized(conn: Connection, job: JobContext, route: str, model: str, rid: int, tokens: int, room: Room, now: float) -> None:
    reason = _oversized_reason(route, model, tokens, room)
    if fate.refuse(conn, job.id, [rid], "over_token_limit", reason, now):
        add_event(conn, job.id, "over_token_limit", f"1 request: {reason}", now)


def refuse_all_oversized(conn: Connection, job: JobContext, route: str, model: str, lane: str | None, now: float) -> int:
    """Every pending request of the job's `lane` for `model` bigger than a proven limit
    fails now, each naming its size (engine/fate.py `refuse`): none is sent alone to be
    refused one batch and one poll at a time. How many."""
    room = Room(None, None, False, proven(conn, route, model, now))
    if room.proven is None:
        return 0
    over = select(requests.c.id, payload_chars(), payload_bytes()).where(
        requests.c.job_id == job.id, requests.c.state == PENDING, requests.c.model == model,
        approx_sql(payload_chars(), payload_bytes()) > room.proven.tokens,
    )  # fmt: skip
    if lane is not None:
        over = over.where(requests.c.lane == lane)
    by_size: dict[int, list[int]] = {}
    for rid, chars, nbytes in conn.execute(over).all():
        by_size.setdefault(approx_from(chars, nbytes), []).append(rid)
    n = 0
    for tokens, ids in sorted(by_size.items()):
        n += fate.refuse(conn, job.id, ids, "over_token_limit", _oversized_reason(route, model, tokens, room), now)
    if n:
        add_event(conn, job.id, "over_token_limit", f"{n} pending request(s) of {model} failed: {_oversized_reason(route, model, min(by_size), room)}", now)
    return n


def requeue(conn: Connection, job: JobContext, route: str, dispatch_id: int, current: DispatchState, reason: str,
            now: float, wait: float) -> int:  # fmt: skip
    """The provider's queue was full: the dispatch ends failed (holding the model while
    batches it waits for are in flight, see `held`; teaching a smaller limit when none
    is), its requests leave it unsent (`fate.take_back`). Returns how many wait again."""
    model, size, tokens, sent_at = conn.execute(
        select(dispatches.c.model, dispatches.c.size, dispatches.c.input_tokens_est, dispatches.c.submitted_at)
        .where(dispatches.c.id == dispatch_id)
    ).one()  # fmt: skip
    # What was in the queue when the provider refused it: what is still in flight, and what
    # ended after it was sent (polled first in this tick, say: it filled the queue all the
    # same). Judged by what is left now, a lone batch of one would fail its request for good.
    sent_at = now if sent_at is None else sent_at  # refused at create: now
    in_flight = conn.execute(
        select(func.count(), func.coalesce(func.sum(dispatches.c.input_tokens_est), 0)).where(
            dispatches.c.route == route, dispatches.c.model == model, dispatches.c.id != dispatch_id,
            or_(
                dispatches.c.state == DispatchState.SUBMITTED.value,
                and_(dispatches.c.state.in_(ENDED_AFTER_QUEUEING), dispatches.c.submitted_at.is_not(None),
                     dispatches.c.ended_at > sent_at),
            ),
        )
    ).one()  # fmt: skip
    error = reason if reason.startswith(QUEUE_FULL) else f"{QUEUE_FULL}: {reason}"
    alone = in_flight[0] == 0
    if alone and size <= 1:
        why = (
            f"{route} refused it for its queue limit with nothing else of {model} in flight ({error}): it cannot be "
            "queued as it is; shorten the request, or raise your organization's limit, then `lowtide retry JOB --failed`"
        )
        lane = conn.execute(select(requests.c.lane).where(requests.c.dispatch_id == dispatch_id).limit(1)).scalar()
        n = fate.refuse_dispatched(conn, job, dispatch_id, "over_token_limit", why, now)
        waiting = 0
        said = f"{route}: {n} request(s) failed: {why}"
        if model is not None and tokens:
            # The limit is under this request's size: nothing of the model this big is sent again.
            proof = f"a request of about {int(tokens):,} tokens was refused alone with nothing else of {model} in flight ({error})"
            learn(conn, route, model, max(int(tokens) - 1, 0), now, proof)
            n = refuse_all_oversized(conn, job, route, model, lane, now)
            if n:
                said += f"; {n} pending request(s) as big or bigger failed at once: they cannot be queued either"
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
