"""Executing a job's requests on a direct route: claim under a lease, run, ingest as they finish."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.exc import DBAPIError

from lowtide.core.clock import Clock
from lowtide.core.states import DispatchState
from lowtide.core.types import Outcome
from lowtide.engine import budget, turnaround
from lowtide.engine.context import JobContext, Lane
from lowtide.engine.dispatch import (
    claim_due,
    dispatched_requests,
    left_in_dispatch,
    new_dispatch,
    pending_ids,
)
from lowtide.engine.ingest import IngestCounts, apply_outcomes
from lowtide.engine.leases import kept
from lowtide.engine.packs import execute_packed, packing
from lowtide.routes.base import DirectRoute
from lowtide.routes.options import scrub
from lowtide.store.db import Store, is_busy
from lowtide.store.queries import add_event
from lowtide.store.schema import dispatches
from lowtide.store.transitions import lock_job, move_dispatch


class _OverBudget(Exception):
    pass


# What one claim may hold, in bytes of stored payload (UTF-8, store/queries.stored_bytes), as
# well as the route's dispatch_size: the claimed requests are held parsed while they run, and
# 5,000 Gemini prompts of 40 kB took serve to 625 MB (issue 32); 32 MB claims, to 304 MB at the
# 2 GB maximum, 16 MB to 289 (bench/maxsize.py --case gemini-input). At least one is claimed.
CLAIM_BYTES = 16 * 2**20
FLUSH_EVERY = 5000  # outcomes
FLUSH_SECONDS = 1.0  # wall time between commits while a slow route runs
RUN_SECONDS = 1.0  # wall time one call goes on claiming dispatches that go by quickly (PostgreSQL)
log = logging.getLogger(__name__)


async def run_direct(
    store: Store,
    job: JobContext,
    route: DirectRoute,
    clock: Clock,
    owner: str,
    lease: float,
    rng: random.Random,
    lane: Lane | None = None,
) -> IngestCounts:
    """Claim one dispatch of due requests (of `lane`, for a job with a fallback route) and
    execute it; on PostgreSQL, while the dispatches go by quickly, the next ones too, each
    claimed and answered while the database writes the one before (`Writer`). Returns what
    was applied, all of it committed."""
    counts = IngestCounts()
    writer = Writer(store)
    started = time.monotonic()
    try:
        while await _run_one(store, job, route, clock, owner, lease, rng, lane, writer, counts):
            if not _goes_on(store, job, started):
                break
    finally:
        await writer.close()
    return counts


def _goes_on(store: Store, job: JobContext, started: float) -> bool:
    """Whether this call claims another dispatch: on PostgreSQL (SQLite takes one writer at a
    time, so nothing would overlap), within RUN_SECONDS, for a job whose requests only the
    tick moves otherwise (a deadline, a fallback, a chain's tiers) and whose spending is
    read from what was written (a budget): those go back to the tick between dispatches. A
    cancel needs no look: it leaves nothing pending to claim."""
    spec = job.spec
    return (
        not store.is_sqlite
        and time.monotonic() - started < RUN_SECONDS
        and spec.deadline is None
        and spec.fallback is None
        and not spec.chain
        and spec.budget_usd is None
    )


async def _run_one(
    store: Store, job: JobContext, route: DirectRoute, clock: Clock, owner: str, lease: float,
    rng: random.Random, lane: Lane | None, writer: Writer, counts: IngestCounts,
) -> bool:  # fmt: skip
    """One dispatch: claimed, run, its outcomes handed to `writer` (which adds them to
    `counts`). False when nothing was claimed (none due, the budget spent) or the route broke."""
    now = clock.now()
    lane_name = lane.name if lane else None
    try:
        with store.begin() as conn:
            if job.spec.budget_usd is not None:
                lock_job(conn, job.id)  # the job before its requests, in the order cancel takes them
            if not pending_ids(conn, job.id, now, 1, lane_name):
                return False
            dispatch_id = new_dispatch(
                conn, job.id, route.name, "direct", DispatchState.RUNNING, now, owner=owner, lease_until=now + lease,
                model=(lane.model if lane else None) or job.spec.model,  # turnarounds are kept per model
                tier=turnaround.service_tier(lane.options if lane else job.spec.route_options),  # ... and tier
            )
            claim_due(conn, dispatch_id, job.id, now, route.dispatch_size, route.name, lane_name, CLAIM_BYTES)
            refused = budget.reserve(conn, job, dispatch_id, route.name)
            if refused:
                raise _OverBudget(refused)  # undoes the claim: nothing was sent
            batch = dispatched_requests(conn, dispatch_id)
    except _OverBudget as over:
        with store.begin() as conn:
            budget.exhaust(conn, job, str(over), now)
        return False
    if lane is not None and lane.model:
        for request in batch:
            request.model = lane.model

    def flush(outcomes: list[Outcome], final: bool) -> None:
        now = clock.now()
        applied = IngestCounts()  # added to `counts` once committed: a write the store was too busy for is tried again
        with store.begin() as conn:
            applied.add(apply_outcomes(conn, job, dispatch_id, route.name, outcomes, now, rng, whole_dispatch=True, lane=lane_name))
            if final:
                # A route that returned nothing for a request: treat it as a retryable loss.
                missing = left_in_dispatch(conn, dispatch_id)
                lost = [Outcome.failure(c, "no_result", f"route {route.name} returned no result", True) for c in missing]
                applied.add(apply_outcomes(conn, job, dispatch_id, route.name, lost, now, rng, lane=lane_name))
                move_dispatch(conn, dispatch_id, DispatchState.RUNNING, DispatchState.ENDED, ended_at=now)
            else:
                conn.execute(dispatches.update().where(dispatches.c.id == dispatch_id).values(lease_until=now + lease))
        counts.add(applied)

    buffer: list[Outcome] = []
    last_flush = time.monotonic()
    broke = False
    try:
        async with kept(store, dispatch_id, owner, DispatchState.RUNNING, clock, lease):  # however long a call takes
            # Embedding requests are packed on the way and unpacked per row (engine/packs.py).
            async for outcome in execute_packed(route, batch, packing(job.spec)):
                buffer.append(outcome)
                if len(buffer) >= FLUSH_EVERY or time.monotonic() - last_flush >= FLUSH_SECONDS:
                    await writer.write(flush, buffer)
                    buffer = []
                    last_flush = time.monotonic()
    except Exception as err:  # the route broke: every request it did not answer is retried
        if writer.error is not None:  # not the route: the store (the worker stops, its lease runs out)
            raise
        broke = True
        answered = {o.custom_id for o in buffer}  # those written before are skipped by ingest
        said = scrub(route, f"{type(err).__name__}: {err}")
        buffer.extend(Outcome.failure(r.custom_id, "route_error", said, True) for r in batch if r.custom_id not in answered)
        with store.begin() as conn:
            add_event(conn, job.id, "route_error", f"{route.name}: {said}", clock.now())
    except BaseException:  # stopped (Ctrl-C, SIGTERM: the task cancelled) while calls were in flight
        # The answers in hand are paid for: written, not dropped (the rest of the dispatch
        # stays under its lease, taken back when it runs out). One transaction, as any flush:
        # one the stop cut off was rolled back whole, so this applies nothing twice.
        if buffer and writer.error is None:
            await writer.write(flush, buffer)
        raise
    await writer.write(flush, buffer, final=True)
    return not broke


class Writer:
    """Where a direct dispatch's outcomes are written. SQLite: at once. PostgreSQL: by a thread
    of the call's own, in the order given, so that the database applies one dispatch's
    answers while this process claims and runs the next (two cores busy, not one; the
    claim does not wait on the write: store/transitions.py `lock_job`). At most DEPTH writes
    are queued. After a write fails, none of the later ones runs (as if the worker had
    stopped there: the dispatch's lease lets any worker take back what was not written).
    `close` returns once every write has ended, raising the first error."""

    DEPTH = 2

    def __init__(self, store: Store):
        self.pool = None if store.is_sqlite else ThreadPoolExecutor(1, thread_name_prefix="lowtide-writer")
        self.queued: collections.deque[asyncio.Future] = collections.deque()
        self.error: BaseException | None = None

    async def write(self, flush: Callable[[list[Outcome], bool], None], outcomes: list[Outcome], final: bool = False) -> None:
        if self.pool is None:
            self._guarded(flush, outcomes, final)
            return
        while len(self.queued) >= self.DEPTH:
            await self.queued.popleft()
        self.queued.append(asyncio.wrap_future(self.pool.submit(self._guarded, flush, outcomes, final)))

    def _guarded(self, flush: Callable[[list[Outcome], bool], None], outcomes: list[Outcome], final: bool) -> None:
        if self.error is not None:
            raise self.error
        try:
            _written(flush, outcomes, final)
        except BaseException as err:
            self.error = err
            raise

    async def close(self) -> None:
        """Once every write has ended: the first write's error, if one failed."""
        if self.pool is not None:
            try:
                # Shielded: a caller cancelled meanwhile still leaves after the writes, not during them.
                await asyncio.shield(asyncio.gather(*self.queued, return_exceptions=True))
            finally:
                self.queued.clear()
                self.pool.shutdown(wait=True)
        if self.error is not None:
            raise self.error


def _written(flush: Callable[[list[Outcome], bool], None], outcomes: list[Outcome], final: bool) -> None:
    """`flush(outcomes, final)`, tried again for as long as the store is too busy to take it
    (SQLite: another process held the write lock past the busy timeout, as a load of
    millions of rows does). The answers in hand are paid for: dropping them would have the
    requests sent, and billed, again once their lease ran out. Each try is one transaction,
    rolled back whole when it fails, so trying again applies nothing twice; a request taken
    back meanwhile (its lease ran out) is a stale answer, billed and not applied."""
    tries = 0
    while True:
        try:
            flush(outcomes, final)
            return
        except DBAPIError as err:
            if not is_busy(err):
                raise
            tries += 1
            log.warning("the store is busy (another process holds its write lock): %d answers wait to be written; "
                        "trying again (%d so far)", len(outcomes), tries)  # fmt: skip
