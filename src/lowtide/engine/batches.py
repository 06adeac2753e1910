"""The batch-route steps of a tick: plan chunks, submit them exactly once, poll, ingest.

Submission records its intent before the provider call (dispatch state `submitting`, with a
key the route attaches to the batch). A process that dies between the call and recording the
provider's id leaves the dispatch in `submitting`; the next tick asks the route to `find` the
batch by that key and adopts it instead of submitting again (DESIGN invariant 3). `find`
looks around `submit_started_at`, the time recorded as the create began, not when the chunk
was planned. The worker sending a chunk holds it under a lease (SUBMIT_LEASE), renewed while
its `find`, upload and create run (engine/leases.py): another worker takes a `submitting`
chunk over only from a worker gone or stalled past the lease. A worker whose create lands
after such a takeover has made a second batch: it is recorded apart, cancelled at the
provider and booked, never applied (`_sent_twice`), and not said to be `submitted`.

A cancel reaches every state: a `submitting` dispatch it flagged is adopted and cancelled at
the provider (its results still brought in; an Anthropic batch is adopted only once it has
ended, and so is never cancelled), or, never sent, ends here with its requests cancelled; a
worker inside the create keeps the flag when it records the id, and the next poll cancels
the batch. A create whose connection was refused sent nothing: its dispatch is planned
again (`NotSent`). What happens to requests is decided by engine/fate.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy import and_, case, func, or_, select, update

from lowtide.core.clock import Clock
from lowtide.core.embeddings import MAX_INPUTS
from lowtide.core.errors import BatchGone, BatchRejected, NotSent
from lowtide.core.states import DispatchState, JobState
from lowtide.core.tokens import approx_from
from lowtide.core.types import Outcome, Request
from lowtide.engine import budget, fate, queue_limit
from lowtide.engine.context import JobContext
from lowtide.engine.dispatch import assign, iter_dispatched, left_in_dispatch, new_dispatch
from lowtide.engine.held import hold, hold_poll, key_refused
from lowtide.engine.ingest import IngestCounts, apply_outcomes, book_late
from lowtide.engine.leases import kept
from lowtide.engine.packs import Packer, pack_size, packing, unpack_stored, vector_check
from lowtide.engine.results_window import (
    RESULTS_GONE,
    gone_reason,
    late_words,
    next_poll_delay,
    past_retention,
    results_gone,
)
from lowtide.routes.base import BatchRoute
from lowtide.routes.options import scrub
from lowtide.store.db import Store
from lowtide.store.payloads import payload_bytes, payload_chars
from lowtide.store.queries import add_event, note_phase, watched
from lowtide.store.schema import PENDING, dispatches, jobs, requests
from lowtide.store.transitions import lock_job, move_dispatch

INGEST_CHUNK = 2000
CHUNKS_PER_TICK = 10  # planning more waits for the next tick: memory stays bounded
PACKED_CHUNKS_PER_TICK = 5
# Rows per batch of a packed embedding job: ten provider requests of 2,048 inputs. Bigger
# batches gain little (1,000,000 rows are 49 batches) and cost memory while each is written
# out, and a smaller share of the job waits on any one batch (or fails with it).
PACKED_CHUNK = 10 * MAX_INPUTS
# Requests per provider batch unless the job says (`chunk_size`): well below the providers'
# 50,000 and 100,000, so that the first results come back while later chunks are still
# being sent, and an expired or failed batch takes less work down with it.
DEFAULT_CHUNK = 10_000
SUBMITS_PER_TICK = 2  # then the tick polls and ingests before sending more
LINE_OVERHEAD = 200  # bytes a provider's line format adds around a request's payload
DEFAULT_POLL_INTERVAL = (30.0, 600.0)


def plan(store: Store, job: JobContext, route: BatchRoute, clock: Clock, lane: str | None = None) -> int:
    """Group due pending requests (of `lane`, for a job with a fallback route) into
    dispatches within the route's and the job's limits."""
    # A packed embedding job's rows share provider requests: its chunk is ten full packs.
    default = PACKED_CHUNK if packing(job.spec) else DEFAULT_CHUNK
    limit = min(route.limits.max_requests, job.spec.chunk_size or default)
    limit_of = getattr(route, "token_limit", None)  # a provider's per-model enqueued-token limit
    now = clock.now()
    planned = 0
    with store.begin() as conn:
        # A packed job's chunks are twice the usual: fewer of them per tick keep the read the same size.
        chunks = PACKED_CHUNKS_PER_TICK if packing(job.spec) else CHUNKS_PER_TICK
        if _first_on(conn, job.id, route.name):  # only what this tick sends: the provider starts at once
            chunks = min(chunks, SUBMITS_PER_TICK)
        # Planned ahead at most that many chunks: a tick sends two, so planning ten each tick
        # would plan the whole job long before it is sent (a 10,000,000-request job: 520
        # chunks planned within minutes), and a cancel or a deadline would undo them all.
        chunks -= _waiting(conn, job.id, route.name)
        if chunks <= 0:
            return 0
        # Read whole before the updates below touch the same rows.
        rows = conn.execute(_due_window(conn, job, route, now, lane, limit * chunks)).all()
        chunks_made: list[_Chunk] = []
        chunk = _Chunk()
        one_model = route.limits.one_model_per_batch
        rooms: dict[str, queue_limit.Room] = {}  # model -> what of its provider queue is left
        for rid, nbytes, chars, model in rows:
            if chunk.ids and (
                len(chunk.ids) >= limit or chunk.size + nbytes > route.limits.max_bytes or (one_model and model != chunk.model)
            ):  # a provider that takes one model per batch never gets two in a chunk
                chunks_made.append(chunk)
                chunk = _Chunk()
            need = approx_from(chars, nbytes - LINE_OVERHEAD)  # the input tokens, as budgets estimate them
            if model not in rooms:
                rooms[model] = queue_limit.room(conn, route.name, model, limit_of(model) if limit_of else None, now)
            taken = rooms[model].take(need)
            if taken is None:  # can never be queued: fails now, by name
                queue_limit.refuse_oversized(conn, job, route.name, model, rid, need, rooms[model], now)
                continue
            if not taken:  # the queue is full for this model: waits for a later tick
                continue
            chunk.add(rid, nbytes, need, model)
        if chunk.ids:
            chunks_made.append(chunk)
        for made in _at_least(chunks_made, route.limits.min_requests, limit, route.limits.max_bytes):
            planned += _plan_one(conn, job, route, made.ids, now, made.models, sum(made.tokens))
    return planned


def _due_window(conn, job: JobContext, route: BatchRoute, now: float, lane: str | None, size: int):
    """The next `size` due pending requests (of `lane`) as (id, bytes in a line, characters
    of the payload, model), in
    the order chunks are cut from them. They are the earliest due, read off the index
    (ix_requests_job_state, or the lane's) without a pass over the job's other pending
    requests: sorting all of them took a minute a tick at 10,000,000 pending (issue 32), and
    put a request whose text sorts last behind every later one. Among these only:
    requests with the same model, parameters and leading messages (the system prompt) side
    by side, so each chunk shares a prefix the provider can cache (not for embeddings: no
    prompt cache to hit, and rows in id order pack into id ranges); and, for a provider that
    takes one model per batch, each model's requests together. On PostgreSQL the window's
    rows are held until the plan commits and those another worker's plan holds are skipped:
    two workers plan the next two windows, not the same one twice."""
    grouped = getattr(route, "group_by_prefix", False) and not packing(job.spec)
    # (by head, then own part: the whole payloads' order among each head's)
    sort_by = (requests.c.head_id, requests.c.payload) if grouped else (requests.c.not_before, requests.c.id)
    window = (
        select(requests.c.id, (payload_bytes() + LINE_OVERHEAD).label("nbytes"),
               payload_chars().label("chars"), requests.c.model, *sort_by)
        .where(
            requests.c.job_id == job.id,
            requests.c.state == PENDING,  # with a lane: off the partial index of pending requests by lane
            requests.c.not_before <= now,
        )
        .order_by(requests.c.not_before, requests.c.id)
        .limit(size)
    )
    if lane is not None:
        window = window.where(requests.c.lane == lane)
    if conn.dialect.name == "postgresql":
        # NO KEY: an attempt row naming one of these (a late result) is not held up by the plan.
        window = window.with_for_update(skip_locked=True, key_share=True)
    w = window.subquery()
    order = [w.c[c.name] for c in sort_by]
    if route.limits.one_model_per_batch:
        order.insert(0, w.c.model)
    return select(w.c.id, w.c.nbytes, w.c.chars, w.c.model).order_by(*order)


@dataclass
class _Chunk:
    """Requests planned into one batch, with what each adds to its bytes and tokens."""

    ids: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    model: str | None = None  # the last request's
    size: int = 0

    def add(self, rid: int, nbytes: int, need: int, model: str) -> None:
        self.ids.append(rid)
        self.sizes.append(nbytes)
        self.tokens.append(need)
        self.models.add(model)
        self.model = model
        self.size += nbytes


def _at_least(chunks: list[_Chunk], minimum: int, limit: int, max_bytes: int) -> list[_Chunk]:
    """The chunks with none under a provider's minimum batch (Bedrock's 100 records) where the
    chunk before it, of the same model, can spare the difference or take it whole: 10,050
    requests go as 9,950 + 100, not 10,000 + a 50 the provider refuses. A model with fewer
    requests than the minimum is sent as it is, and its refusal names the minimum and the fix."""
    if minimum <= 1:
        return chunks
    out: list[_Chunk] = []
    for chunk in chunks:
        before = out[-1] if out else None
        short = minimum - len(chunk.ids)
        if short <= 0 or before is None or before.models != chunk.models:
            out.append(chunk)
        elif len(before.ids) + len(chunk.ids) <= limit and before.size + chunk.size <= max_bytes:
            for i, rid in enumerate(chunk.ids):  # the two fit in one batch
                before.add(rid, chunk.sizes[i], chunk.tokens[i], chunk.model or "")
        elif len(before.ids) - short >= minimum and chunk.size + sum(before.sizes[-short:]) <= max_bytes:
            moved = _Chunk()
            for rid, nbytes, need in zip(before.ids[-short:], before.sizes[-short:], before.tokens[-short:], strict=True):
                moved.add(rid, nbytes, need, chunk.model or "")
            del before.ids[-short:], before.sizes[-short:], before.tokens[-short:]
            before.size = sum(before.sizes)
            for i, rid in enumerate(chunk.ids):
                moved.add(rid, chunk.sizes[i], chunk.tokens[i], chunk.model or "")
            out.append(moved)
        else:
            out.append(chunk)
    return out


def _first_on(conn, job_id: int, route: str) -> bool:
    """Has the job no batch on this route yet? Its first tick plans only what it sends, so
    the provider starts on the first chunk without waiting for nine more to be planned."""
    some = select(dispatches.c.id).where(
        dispatches.c.job_id == job_id, dispatches.c.route == route, dispatches.c.kind == "batch"
    )
    return conn.execute(some.limit(1)).first() is None


def _waiting(conn, job_id: int, route: str) -> int:
    """The job's chunks on this route that are planned and not yet being sent."""
    planned = select(func.count()).where(
        dispatches.c.job_id == job_id, dispatches.c.route == route, dispatches.c.state == DispatchState.PLANNED.value
    )
    return conn.execute(planned).scalar_one()


def _together(route: BatchRoute) -> float:
    """Retries on a batch route are due on a grid of its first poll interval: those due
    within one interval of each other go in one batch (a provider batch is a round trip of
    minutes to hours; sent one by one as each came due, 3,000 rows with faults became 399)."""
    return getattr(route, "poll_interval", DEFAULT_POLL_INTERVAL)[0]


def _plan_one(conn, job: JobContext, route: BatchRoute, ids: list[int], now: float, models: set[str], tokens: int) -> int:
    model = next(iter(models)) if len(models) == 1 else None
    dispatch_id = new_dispatch(conn, job.id, route.name, "batch", DispatchState.PLANNED, now, model=model, input_tokens_est=tokens)
    return assign(conn, dispatch_id, ids, route.name, now)


@dataclass(frozen=True, slots=True)
class Worker:
    """Who is ticking: several workers on one store claim what they send and poll, so that
    no chunk is sent twice and no batch is polled by two at once."""

    owner: str
    alive: Callable[[str | None], bool]  # is that owner's process still running?


SUBMIT_LEASE = 900.0  # seconds an upload and create may take before another worker may adopt it
POLL_LEASE = 600.0  # seconds a poll and its ingest hold a batch before another worker may


async def submit(
    store: Store, job: JobContext, route: BatchRoute, clock: Clock, rng: random.Random, worker: Worker,
    model: str | None = None,
) -> int:  # fmt: skip
    """Submit planned dispatches of the job on this route (up to SUBMITS_PER_TICK); adopt
    any that a dead process had sent; resolve those a cancel flagged while `submitting`.
    `model` overrides the requests' model (a fallback route's)."""
    with store.begin() as conn:
        todo = list(
            conn.execute(
                select(
                    dispatches.c.id, dispatches.c.key, dispatches.c.state, dispatches.c.size,
                    func.coalesce(dispatches.c.submit_started_at, dispatches.c.created_at),
                    dispatches.c.owner, dispatches.c.lease_until,
                ).where(
                    dispatches.c.job_id == job.id,
                    dispatches.c.route == route.name,
                    dispatches.c.kind == "batch",
                    dispatches.c.state.in_([DispatchState.PLANNED.value, DispatchState.SUBMITTING.value]),
                ).order_by(dispatches.c.id)
            )
        )
    sent = 0
    for dispatch_id, key, state, size, started_at, owner, lease_until in todo:
        if sent >= SUBMITS_PER_TICK:
            break
        if state == DispatchState.PLANNED:
            if not _begin_submit(store, job, route, dispatch_id, worker, clock):
                continue
            provider_id = None
        else:
            if not _claim(store, dispatch_id, owner, lease_until, worker, clock.now(), SUBMIT_LEASE):
                continue  # another worker is sending it right now
            try:
                async with _holding(store, dispatch_id, worker, clock):  # Anthropic's reads candidates' results
                    provider_id = await route.find(
                        key, size, started_at, _known_batches(store, route.name, started_at), sent=_carried(store, dispatch_id)
                    )
            except Exception as err:  # cannot tell whether it was sent: wait, never guess
                said = scrub(route, str(err))
                if key_refused(err):  # held, said once (engine/held.py), until the key works, a cancel or the deadline
                    given_up = hold(store, job, route.name, dispatch_id, key, said, clock.now())
                    if given_up:
                        _reject(store, job, route, dispatch_id, DispatchState.SUBMITTING, given_up, clock, rng,
                                code="batch_lost", retryable=True)  # fmt: skip
                    continue
                with store.begin() as conn:
                    conn.execute(
                        update(dispatches).where(dispatches.c.id == dispatch_id).values(error=said[:2000], lease_until=0.0)
                    )
                    add_event(conn, job.id, "find_error", f"{route.name}: {said}", clock.now())
                continue
        with store.begin() as conn:
            waiting = len(left_in_dispatch(conn, dispatch_id))
            cancelled = conn.execute(select(dispatches.c.cancel_requested).where(dispatches.c.id == dispatch_id)).scalar_one()
            # Nothing reached the provider: past the deadline it is not sent now (its requests fail).
            if provider_id is None and (cancelled or not waiting or fate.deadline_passed(job.spec, clock.now())):
                _end_unsent(conn, job, route, dispatch_id, clock.now())
                continue
            if provider_id is None and state == DispatchState.SUBMITTING:
                # Found nothing from the last try: this create is the one `find` must match next.
                conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(submit_started_at=clock.now()))
        created = provider_id is None
        try:
            if created:
                given = _with_model(iter_dispatched(store, dispatch_id), model)
                # An embedding job's rows go packed (engine/packs.py): the store keeps them one per row.
                async with _holding(store, dispatch_id, worker, clock):  # a 2 GB upload outlasts SUBMIT_LEASE
                    provider_id = await route.submit(key, Packer()(given) if packing(job.spec) else given)
        except BatchRejected as err:
            _reject(store, job, route, dispatch_id, DispatchState.SUBMITTING, scrub(route, str(err)), clock, rng)
            continue
        except NotSent as err:  # provably nothing at the provider: planned again, so a cancel needs no `find`
            said = scrub(route, str(err))
            with store.begin() as conn:
                move_dispatch(conn, dispatch_id, DispatchState.SUBMITTING, DispatchState.PLANNED, error=said[:2000], owner=None, lease_until=0.0)
                add_event(conn, job.id, "submit_error", f"{route.name}: {said} (nothing was sent)", clock.now())
            continue
        except Exception as err:  # transient: the next tick (this worker's or another's) finds-or-submits again
            said = scrub(route, str(err))
            with store.begin() as conn:
                mine = conn.execute(  # nobody is inside the create now, unless another worker took the chunk over meanwhile
                    update(dispatches)
                    .where(dispatches.c.id == dispatch_id, dispatches.c.owner == worker.owner,
                           dispatches.c.state == DispatchState.SUBMITTING.value)  # fmt: skip
                    .values(error=said[:2000], lease_until=0.0)
                ).rowcount
                if mine:
                    add_event(conn, job.id, "submit_error", f"{route.name}: {said}", clock.now())
            continue
        now = clock.now()
        interval = getattr(route, "poll_interval", DEFAULT_POLL_INTERVAL)
        with store.begin() as conn:
            recorded = move_dispatch(
                conn, dispatch_id, DispatchState.SUBMITTING, DispatchState.SUBMITTED,
                provider_id=provider_id, submitted_at=now, error=None, lease_until=0.0,
                # A cancel that came while the create was on its way: poll (and cancel) at once.
                next_poll_at=case((dispatches.c.cancel_requested.is_(True), now), else_=now + next_poll_delay(route, interval, 0, rng)),
            )  # fmt: skip
            if not recorded:  # another worker took the chunk over meanwhile (this one stalled past its lease)
                _sent_twice(conn, job, route, dispatch_id, provider_id, created, now)
                continue
            add_event(conn, job.id, "submitted", f"{route.name} batch {provider_id}: {waiting} request(s)", now)
        sent += 1
    return sent


def _holding(store: Store, dispatch_id: int, worker: Worker, clock: Clock):
    """The chunk's submit lease, kept while this worker finds or sends it (engine/leases.py):
    run out, another worker would take the chunk over and send it a second time."""
    return kept(store, dispatch_id, worker.owner, DispatchState.SUBMITTING, clock, SUBMIT_LEASE)


def _sent_twice(conn, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, created: bool, now: float) -> None:
    """A batch this worker created (or found) for a chunk another worker took over while it
    did so: the chunk is that worker's now (sent by it, or ended unsent). Unless the store
    holds this very batch already (both found the same one), it is a second batch of the
    same requests that nothing would poll: recorded as a dispatch of its own, holding no
    request, flagged to be cancelled at its first poll (due at once). What it ran is paid for:
    its lines are booked as stale attempts, never applied (the requests keep the answers of
    the chunk's own batch), and the dispatch ends when the batch does."""
    held = select(dispatches.c.id).where(dispatches.c.route == route.name, dispatches.c.provider_id == provider_id)
    if conn.execute(held.limit(1)).first() is not None:
        return
    state, theirs = conn.execute(select(dispatches.c.state, dispatches.c.provider_id).where(dispatches.c.id == dispatch_id)).one()
    new_dispatch(conn, job.id, route.name, "batch", DispatchState.SUBMITTED, now, provider_id=provider_id, submitted_at=now,
                 submit_started_at=now, next_poll_at=now, cancel_requested=True)  # fmt: skip
    chunk = f"dispatch {dispatch_id} is {state}" + (f", as batch {theirs}" if theirs else "")
    how = "created" if created else "found"
    add_event(conn, job.id, "duplicate_batch", f"{route.name} batch {provider_id}, {how} after this worker's lease on its chunk ran "
              f"out and another worker took the chunk over ({chunk}), is a second batch of the same requests: it is cancelled "
              "at the provider at its first poll, and what it ran is booked, not applied", now)  # fmt: skip


def _end_unsent(conn, job: JobContext, route: BatchRoute, dispatch_id: int, now: float) -> None:
    """A `submitting` dispatch the provider has no batch for (never sent), now not wanted (a
    cancel, a deadline, or nothing left in it): it ends here, and what it held leaves it
    unsent (`fate.take_back`: cancelled in a cancelled job, failed past its deadline)."""
    fate.take_back(conn, job, dispatch_id, now, sent=False)
    move_dispatch(conn, dispatch_id, DispatchState.SUBMITTING, DispatchState.CANCELLED, ended_at=now)


class _Refused(Exception):
    pass


def _begin_submit(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, worker: Worker, clock: Clock) -> bool:
    """Take a planned dispatch (planned → submitting, a compare-and-set: one worker wins) and
    reserve its budget, in one transaction, before any network call. A worker that read the
    dispatch before another took it loses the compare-and-set and reserves nothing; one that
    read the job's spec before a load changed it sends nothing (the job's row held: a load
    that moves a connection holds it too, engine/changes.py `move_connections`); a job no
    longer active sends nothing, and the batch is taken apart. False if it must not be sent
    by this worker now."""
    now = clock.now()
    try:
        with store.begin() as conn:
            state = lock_job(conn, job.id)  # the job before the dispatch, in the order cancel and a load take them
            if state != JobState.ACTIVE.value:
                # Stopped since this tick read it (a budget stop, a cancel) by a worker that could
                # not see this batch yet: taken apart as that stop takes the others.
                fate.undo_planned(conn, job, dispatch_id, now)
                return False
            if job.spec_text is not None and conn.execute(select(jobs.c.spec).where(jobs.c.id == job.id)).scalar_one() != job.spec_text:
                # Loaded again since this tick read it (its connection may have moved): sent
                # by the next tick, as the spec says now, never to where it pointed before.
                return False
            if not move_dispatch(
                conn, dispatch_id, DispatchState.PLANNED, DispatchState.SUBMITTING,
                owner=worker.owner, lease_until=now + SUBMIT_LEASE, submit_started_at=now,
            ):  # fmt: skip
                return False  # another worker took it, or it was cancelled
            refused = budget.reserve(conn, job, dispatch_id, route.name)
            if refused:
                raise _Refused(refused)  # undoes the compare-and-set: nothing was sent
    except _Refused as refused:
        with store.begin() as conn:
            budget.exhaust(conn, job, str(refused), now)
        return False
    return True


def _claim(store: Store, dispatch_id: int, owner, lease_until, worker: Worker, now: float, lease: float) -> bool:
    """May this worker work on a dispatch (find-or-send one left in `submitting`, poll one
    submitted)? Yes if it holds it already, or nobody does: no owner, a lease run out, or an
    owner whose process is gone. Taking it is a compare-and-set: only one worker wins."""
    if owner == worker.owner:
        return True
    if owner is not None and lease_until is not None and lease_until > now and worker.alive(owner):
        return False
    with store.begin() as conn:
        taken = conn.execute(
            update(dispatches)
            .where(
                dispatches.c.id == dispatch_id,
                dispatches.c.owner.is_(None) if owner is None else dispatches.c.owner == owner,
                dispatches.c.lease_until.is_(None) if lease_until is None else dispatches.c.lease_until == lease_until,
            )
            .values(owner=worker.owner, lease_until=now + lease)
        ).rowcount
    return taken == 1


def _with_model(requests: Iterator[Request], model: str | None) -> Iterator[Request]:
    for request in requests:
        if model:
            request.model = model
        yield request


def _carried(store: Store, dispatch_id: int) -> set[str]:
    """The custom_ids a dispatch's create carried: every request it was given (one that has
    left it since was still in it when it was sent)."""
    with store.begin() as conn:
        return set(conn.scalars(select(requests.c.custom_id).where(requests.c.dispatch_id == dispatch_id)))


def _known_batches(store: Store, route: str, since: float) -> set[str]:
    """Provider ids other dispatches already hold: never adopted a second time."""
    with store.begin() as conn:
        return set(
            conn.scalars(
                select(dispatches.c.provider_id).where(
                    dispatches.c.route == route,
                    dispatches.c.provider_id.is_not(None),
                    dispatches.c.created_at >= since - 86400,
                )
            )
        )


def _reject(
    store: Store, job: JobContext, route, dispatch_id: int, current: DispatchState, reason: str, clock: Clock, rng,
    code: str = "batch_rejected", retryable: bool = False, watch: float | None = None,
) -> None:  # fmt: skip
    """The provider refused (or lost) the batch: each of its requests gets that failure, with
    the provider's reason (engine/fate.py decides what it becomes). `watch`: seconds the
    batch is still polled for what it bills (`_watch`). Only while the dispatch is still in
    `current`: one another worker has moved on meanwhile (it took a stalled worker's chunk
    over and sent it) is that worker's, and its requests wait on its batch."""
    now = clock.now()
    with store.begin() as conn:
        watch_until = None if watch is None else now + watch
        if not move_dispatch(conn, dispatch_id, current, DispatchState.FAILED, error=reason[:2000], ended_at=now, watch_until=watch_until):
            return
        ids = left_in_dispatch(conn, dispatch_id)
        failures = [Outcome.failure(c, code, reason, retryable) for c in ids]
        apply_outcomes(conn, job, dispatch_id, route.name, failures, now, rng, together=_together(route))
        add_event(conn, job.id, code, f"{route.name}: {reason}", now)


async def poll(
    store: Store, job: JobContext, route: BatchRoute, clock: Clock, rng: random.Random, worker: Worker
) -> IngestCounts:
    """Poll every submitted dispatch that is due and no other live worker holds; ingest the
    ones that ended."""
    counts = IngestCounts()
    now = clock.now()
    with store.begin() as conn:
        due = list(
            conn.execute(
                select(
                    dispatches.c.id, dispatches.c.provider_id, dispatches.c.polls, dispatches.c.cancel_requested,
                    dispatches.c.owner, dispatches.c.lease_until, dispatches.c.submitted_at, dispatches.c.watch_until,
                ).where(
                    dispatches.c.job_id == job.id,
                    dispatches.c.route == route.name,
                    or_(dispatches.c.state == DispatchState.SUBMITTED.value, watched()),
                    dispatches.c.next_poll_at <= now,
                ).order_by(dispatches.c.next_poll_at)  # the longest waiting first: its results may be the oldest
            )
        )
    interval = getattr(route, "poll_interval", DEFAULT_POLL_INTERVAL)
    for dispatch_id, provider_id, polls, cancel_requested, owner, lease_until, submitted_at, watch_until in due:
        if not _claim(store, dispatch_id, owner, lease_until, worker, now, POLL_LEASE):
            continue  # another worker is polling or ingesting it
        if watch_until is not None:  # given up as lost: polled for its bill alone
            counts.add(await _watch(store, job, route, dispatch_id, provider_id, polls, watch_until, interval, clock, rng))
            continue
        asked = bool(cancel_requested)
        try:
            status = await route.poll(provider_id)
            # Cancel only a batch still running: one that ended first has nothing to stop, and
            # the provider refuses the cancel. A cancel that fails is asked again next poll.
            if cancel_requested and not status.ended:
                cancel_requested = not await _cancel(store, job, route, provider_id, clock)
                if not cancel_requested:
                    status = await route.poll(provider_id)
        except Exception as err:
            said = scrub(route, str(err))
            if key_refused(err):  # held, said once: the batch runs whatever our key (engine/held.py `hold_poll`)
                _hold_poll(store, job, route, dispatch_id, provider_id, polls, submitted_at, said, interval, clock, rng)
                continue
            with store.begin() as conn:
                conn.execute(
                    update(dispatches).where(dispatches.c.id == dispatch_id).values(
                        polls=polls + 1, error=said[:2000], next_poll_at=clock.now() + next_poll_delay(route, interval, polls, rng),
                        lease_until=0.0, lost_since=_failing_since(clock.now()),
                    )
                )
                add_event(conn, job.id, "poll_error", f"{route.name} batch {provider_id}: {said}", clock.now())
            if not _gone_past_retention(store, job, route, dispatch_id, provider_id, submitted_at, err, said, clock, rng):
                _give_up_if_lost(store, job, route, dispatch_id, provider_id, said, isinstance(err, BatchGone), clock, rng)
            continue
        # The flag is cleared only once acted on: a cancel that arrived during this poll stays.
        settled = {"cancel_requested": False} if status.ended or (asked and not cancel_requested) else {}
        with store.begin() as conn:
            note_phase(conn, dispatch_id, status.phase, clock.now())  # the batch timeline
            conn.execute(
                update(dispatches).where(dispatches.c.id == dispatch_id).values(
                    polls=polls + 1, phase=status.phase, error=None, **settled,
                    lost_since=_gone_since(clock.now()) if status.ended else None,  # `_not_read` judges an ended one
                    next_poll_at=clock.now() + next_poll_delay(route, interval, polls + 1, rng),
                    # Held while an ended batch is ingested; let go otherwise.
                    lease_until=clock.now() + POLL_LEASE if status.ended else 0.0,
                )
            )  # fmt: skip
        if status.queue_full:  # not the requests' failure: they are sent again once there is room
            with store.begin() as conn:
                queue_limit.requeue(conn, job, route.name, dispatch_id, DispatchState.SUBMITTED, scrub(route, "; ".join(status.errors)),
                                    clock.now(), interval[0])  # fmt: skip
        elif status.errors:
            _reject(store, job, route, dispatch_id, DispatchState.SUBMITTED, scrub(route, "; ".join(status.errors)), clock, rng)
        elif status.ended:
            try:
                # Held while its results download and are ingested (800 MB on a slow link
                # outlives POLL_LEASE): no second worker reads them all again beside this one.
                async with kept(store, dispatch_id, worker.owner, DispatchState.SUBMITTED, clock, POLL_LEASE):
                    counts.add(await _ingest(store, job, route, dispatch_id, provider_id, clock, rng, submitted_at))
            except Exception as err:  # what was applied stays, the rest comes next poll
                said = scrub(route, str(err))
                if not _gone_past_retention(store, job, route, dispatch_id, provider_id, submitted_at, err, said, clock, rng):
                    _not_read(store, job, route, dispatch_id, provider_id, said, results_gone(err), clock, rng)
    return counts


def _gone_since(now: float):
    """`lost_since` after a poll that found the batch ended: when the provider first answered
    that its results are not found (`_not_read`), kept while the polls between succeeded and
    came on time; a failed poll before this one (its error still on the dispatch) or a late
    one (nobody polled in between, `_failing_since`) says nothing of the results: cleared."""
    kept = and_(dispatches.c.error.is_(None), dispatches.c.next_poll_at >= now - LATE_POLL)
    return case((kept, dispatches.c.lost_since), else_=None)


def _not_read(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, said: str, gone: bool,
              clock: Clock, rng: random.Random) -> None:  # fmt: skip
    """An ended batch whose results could not be read. A download that broke off is read
    again next poll, however long that takes; one the provider answers "not found" (`gone`:
    its results file deleted there) counts from `lost_since` as a batch the provider does
    not know does: after LOST_GRACE its requests leave it `batch_lost`, retryable, with the
    route's words, which name the file (engine/fate.py decides: the fallback route, another
    batch while attempts remain, failed). Not watched: what it ran cannot be read any more.
    Each download that broke off is an `ingest_error` event; "not found" is one when it is
    first answered (`lost_since` was NULL), not one each poll of the grace, and `batch_lost`
    says it again when the batch is given up."""
    now = clock.now()
    with store.begin() as conn:
        before = conn.execute(select(dispatches.c.lost_since).where(dispatches.c.id == dispatch_id)).scalar_one()
        since = (now if before is None else before) if gone else None
        conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(lease_until=0.0, lost_since=since))
        if not gone or before is None:
            later = f" (given up if still not found in {LOST_GRACE / 3600:.0f} h)" if gone else ""
            add_event(conn, job.id, "ingest_error", f"{route.name} batch {provider_id}: {said}{later}", now)
    if since is None or now - since < LOST_GRACE:
        return
    reason = (
        f"the provider has answered that the results of batch {provider_id} are not found for {now - since:.0f} s "
        f"(last: {said}); given up: its requests go on without it, and what the batch ran is billed there and cannot be read"
    )
    _reject(store, job, route, dispatch_id, DispatchState.SUBMITTED, reason, clock, rng, code="batch_lost", retryable=True)


def _hold_poll(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, polls: int,
               submitted_at: float | None, said: str, interval: tuple[float, float], clock: Clock, rng: random.Random) -> None:  # fmt: skip
    """A poll refused the key: polled again as usual, never counted toward giving the batch up
    as lost; given up only when its job is cancelled or its results window has passed."""
    now = clock.now()
    given_up = hold_poll(store, job, route.name, dispatch_id, provider_id, said, now, past_retention(route, submitted_at, now))
    if given_up is not None:
        code, reason = given_up
        _reject(store, job, route, dispatch_id, DispatchState.SUBMITTED, reason, clock, rng, code=code, retryable=True)
        return
    with store.begin() as conn:
        conn.execute(
            update(dispatches).where(dispatches.c.id == dispatch_id).values(
                polls=polls + 1, next_poll_at=now + next_poll_delay(route, interval, polls, rng), lease_until=0.0, lost_since=None,
            )
        )  # fmt: skip


LOST_GRACE = 3600.0  # seconds a provider may answer "no such batch" before the batch is given up
ERROR_GRACE = 86400.0  # ... or answer polls with nothing but errors (down, or answering nonsense)
# ... and then still polled, for what it bills if it ran after all: a provider's day of
# errors may end, and a batch it did not know may turn up, each within a completion window.
WATCH = 2 * 86400.0
LATE_POLL = 3600.0  # a poll this much past its time: nobody was polling in between


def _failing_since(now: float):
    """`lost_since` after a failed poll: when the failures began, unless this poll comes more
    than LATE_POLL after it was due. Then nobody polled in between (the workers were down, the
    machine asleep), and the failures before say nothing of that time: they begin again now.
    Else a worker away for a day would give up a batch, which ran and was billed, on its first
    failed poll back (found by the simulation, docs/simulation.md finding 7)."""
    late = dispatches.c.next_poll_at < now - LATE_POLL
    return case((late, now), else_=func.coalesce(dispatches.c.lost_since, now))


def _give_up_if_lost(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, said: str,
                     gone: bool, clock: Clock, rng: random.Random) -> None:  # fmt: skip
    """A batch whose every poll has failed since `lost_since` is given up after a grace: an
    hour where the provider says it does not know the batch (lost there, or the route now
    points elsewhere), a day of any other error. Polled for ever, it would hold its requests
    for ever. They get a retryable failure `batch_lost` with the provider's words
    (engine/fate.py decides: another batch while attempts remain, failed after)."""
    now = clock.now()
    with store.begin() as conn:
        since = conn.execute(select(dispatches.c.lost_since).where(dispatches.c.id == dispatch_id)).scalar_one()
    if since is None or now - since < (LOST_GRACE if gone else ERROR_GRACE):
        return
    known = "has not known" if gone else "has answered every poll of"
    reason = f"the provider {known} batch {provider_id} for {now - since:.0f} s (last: {said}); given up as lost"
    _reject(store, job, route, dispatch_id, DispatchState.SUBMITTED, reason, clock, rng, code="batch_lost", retryable=True,
            watch=WATCH)  # fmt: skip


def _end_watch(conn, job_id: int, dispatch_id: int, kind: str, said: str, now: float) -> None:
    conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(watch_until=None, lease_until=0.0))
    add_event(conn, job_id, kind, said, now)


def end_watches(conn, job_id: int, on_routes, why: str, now: float) -> int:
    """End the open watches of the job's batches whose route meets `on_routes` (a condition
    on `dispatches.c.route`): a load moved that route's connection (the new place does not
    know them) or took the job off it (nothing polls it). Each is said once, as unread."""
    watching = conn.execute(
        select(dispatches.c.id, dispatches.c.route, dispatches.c.provider_id).where(
            dispatches.c.job_id == job_id, on_routes, watched()
        )
    ).all()
    for dispatch_id, route, provider_id in watching:
        _end_watch(conn, job_id, dispatch_id, "lost_batch_unread", f"{route} batch {provider_id}, given up as lost, is no longer "
                   f"polled: {why}; if the provider ran it, it is billed and not booked", now)  # fmt: skip
    return len(watching)


async def _watch(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, polls: int,
                 watch_until: float, interval: tuple[float, float], clock: Clock, rng: random.Random) -> IngestCounts:  # fmt: skip
    """Poll a batch given up as lost, whose requests went on without it: if the provider
    answers that it ended after all, what it bills is booked (`ingest.book_late`), nothing
    applied, and the watch ends; a batch the provider failed whole bills nothing, and ends
    it too. Any other answer, or none, and it is polled again, until `watch_until`: then
    the watch ends unread, said once (what the provider may bill for it is not booked)."""
    if clock.now() >= watch_until:
        with store.begin() as conn:
            _end_watch(conn, job.id, dispatch_id, "lost_batch_unread", f"{route.name} batch {provider_id}, given up as lost, was "
                       f"polled for {WATCH / 3600:.0f} h more and never answered: if the provider ran it, it is billed and not booked",
                       clock.now())  # fmt: skip
        return IngestCounts()
    try:
        status = await route.poll(provider_id)
    except Exception:  # as before it was given up: said then (`batch_lost`), not again each poll
        status = None
    if status is not None and status.ended:
        if status.errors:
            with store.begin() as conn:
                _end_watch(conn, job.id, dispatch_id, "lost_batch_ended", scrub(route, f"{route.name} batch {provider_id}, given up as "
                           f"lost, ended failed at the provider: nothing billed ({'; '.join(status.errors)})"), clock.now())  # fmt: skip
            return IngestCounts()
        return await _ingest(store, job, route, dispatch_id, provider_id, clock, rng, late=True)
    with store.begin() as conn:
        conn.execute(
            update(dispatches).where(dispatches.c.id == dispatch_id).values(
                polls=polls + 1, lease_until=0.0, next_poll_at=clock.now() + next_poll_delay(route, interval, polls, rng),
                **({"phase": status.phase} if status is not None else {}),
            )
        )  # fmt: skip
    return IngestCounts()


def _gone_past_retention(store: Store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str,
                         submitted_at: float | None, err: BaseException, said: str, clock: Clock, rng: random.Random) -> bool:  # fmt: skip
    """A batch (or its results) the provider no longer has, sent longer ago than its card
    keeps results: not waited for (they will not come back). Its requests leave it
    `results_expired`, retryable, naming the retention and the fix (engine/results_window.py)."""
    now = clock.now()
    kept = past_retention(route, submitted_at, now) if results_gone(err) else None
    if kept is None or submitted_at is None:
        return False
    reason = gone_reason(route.name, provider_id, kept, now - submitted_at, said)
    _reject(store, job, route, dispatch_id, DispatchState.SUBMITTED, reason, clock, rng, code=RESULTS_GONE, retryable=True)
    return True


async def _cancel(store: Store, job: JobContext, route: BatchRoute, provider_id: str, clock: Clock) -> bool:
    try:
        await route.cancel(provider_id)
        return True
    except Exception as err:
        with store.begin() as conn:
            add_event(conn, job.id, "cancel_error", scrub(route, f"{route.name} batch {provider_id}: {err}"), clock.now())
        return False


async def _ingest(store, job: JobContext, route: BatchRoute, dispatch_id: int, provider_id: str, clock, rng,
                  submitted_at: float | None = None, late: bool = False) -> IngestCounts:  # fmt: skip
    """Stream an ended batch's results into the store, chunk by chunk; then close it.
    `late`: a batch given up as lost (`_watch`): its lines are only booked."""
    counts = IngestCounts()

    def take(conn, chunk: list[Outcome], now: float) -> None:
        if vectors is not None:
            chunk = unpack_stored(conn, job.id, dispatch_id, chunk, vectors.expected)
        if late:
            counts.stale += book_late(conn, job, dispatch_id, route.name, chunk, now)
        else:
            counts.add(apply_outcomes(conn, job, dispatch_id, route.name, chunk, now, rng, together=_together(route)))

    chunk: list[Outcome] = []
    vectors = vector_check(job.spec)  # an embedding job's: packs unpacked, vectors checked
    rows = 0  # the rows the chunk's outcomes are for: a pack's answer is for up to 2,048
    secret = getattr(route, "secret", None)
    async for outcome in route.results(provider_id):
        if secret and not outcome.ok and outcome.error_message and secret in outcome.error_message:
            outcome.error_message = scrub(route, outcome.error_message)  # a request's own error, echoing the key
        chunk.append(outcome)
        rows += pack_size(outcome.custom_id) if vectors is not None else 1
        if rows >= INGEST_CHUNK:
            rows = 0
            with store.begin() as conn:
                take(conn, chunk, clock.now())
            chunk = []
    now = clock.now()
    with store.begin() as conn:
        take(conn, chunk, now)
        if late:
            _end_watch(conn, job.id, dispatch_id, "lost_batch_booked", f"{route.name} batch {provider_id}, given up as lost, answered "
                       f"after all: {counts.stale} billed line(s) booked, not applied (their requests had gone on without it)", now)  # fmt: skip
            return counts
        missing = left_in_dispatch(conn, dispatch_id)
        why = "no result for this request in the batch output; treated as expired"
        kept = past_retention(route, submitted_at, now)
        if kept is not None and submitted_at is not None:  # a route's own sign that files were gone (Mistral's 404)
            why += f" ({late_words(route.name, kept, now - submitted_at)})"
        expired = [Outcome.failure(c, "expired", why, True) for c in missing]
        counts.add(apply_outcomes(conn, job, dispatch_id, route.name, expired, now, rng, together=_together(route)))
        move_dispatch(conn, dispatch_id, DispatchState.SUBMITTED, DispatchState.ENDED, ended_at=now)
        if counts.unknown:
            add_event(conn, job.id, "unknown_results", f"{len(counts.unknown)} result(s) with unknown custom_id in {provider_id}", now)
    return counts
