"""One tick: a short list of named steps, each a non-blocking pass over the store.

    reclaim   requests held by a dead worker or an expired lease go back to pending
    deadline  past a job's deadline, requests not yet sent fail with `deadline_passed`
    cut-over  near a job's deadline, move what its route cannot finish to the fallback route;
              for a `route: auto` job's chain, to the first tier up that can (engine/tiers.py)
    plan      batch routes: group due pending requests into chunks
    submit    batch routes: send planned chunks (exactly once; adopt after a crash), each
              within the job's budget (engine/budget.py)
    poll      batch routes: poll what is due; ingest what ended
    execute   direct routes: claim one dispatch of due requests, run it, ingest
    finish    a job whose requests are all terminal is finished (its notification enqueued)
    notify    start the due notifications' attempts, each its own task (engine/notifier.py):
              the tick never waits for a receiver

Any process may die at any point; the next tick continues from the store alone.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import uuid
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select

from lowtide.core.clock import Clock, SystemClock
from lowtide.core.errors import JobGone
from lowtide.core.spec import stored_spec
from lowtide.core.states import DispatchState, JobState, RequestState
from lowtide.engine import batches, fate, notify, tiers
from lowtide.engine.context import JobContext, Lane
from lowtide.engine.direct import run_direct
from lowtide.engine.fallback import cut_over
from lowtide.engine.ingest import IngestCounts
from lowtide.engine.notifier import Notifier
from lowtide.routes import Route, create_route
from lowtide.store.db import Store
from lowtide.store.queries import add_event, watched
from lowtide.store.schema import PENDING, dispatches, jobs, requests
from lowtide.store.transitions import lock_job, move_dispatch, move_job

LIVE = (RequestState.PENDING.value, RequestState.DISPATCHED.value)
RESEND_WAIT = 5.0  # seconds before a chunk whose create failed is tried again by an idle worker (`next_due`)
log = logging.getLogger(__name__)


@dataclass(slots=True)
class TickReport:
    reclaimed: int = 0
    deadline_failed: int = 0
    planned: int = 0
    submitted: int = 0
    to_fallback: int = 0
    finished: list[str] = field(default_factory=list)
    ingested: IngestCounts = field(default_factory=IngestCounts)
    notifying: int = 0  # notification attempts started (they run on: not counted as busy)

    @property
    def busy(self) -> bool:
        i = self.ingested
        applied = i.succeeded + i.retried + i.failed + i.cancelled + i.stale
        return bool(
            self.reclaimed or self.deadline_failed or self.planned or self.submitted or self.to_fallback
            or self.finished or applied
        )  # fmt: skip


class Engine:
    """Moves work between the store and the routes. Use as `async with Engine(store) as e`."""

    def __init__(
        self,
        store: Store,
        clock: Clock | None = None,
        *,
        lease: float = 120.0,
        seed: int | None = None,
        routes: dict[str, Route] | None = None,
        notify_concurrency: int = 16,
        notify_per_receiver: int = 4,
    ):
        """`routes` gives ready-made route instances by route name (an embedding server's
        own, or a probe in a test); other routes are built from the job spec.
        `notify_concurrency`: notification attempts in flight at once, at most
        `notify_per_receiver` of them to one receiver (engine/notifier.py)."""
        self.store = store
        self.clock = clock or SystemClock()
        self.lease = lease
        self.rng = random.Random(seed)
        self.host = socket.gethostname()
        self.owner = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._given = dict(routes or {})
        self._routes: dict[str, Route] = {}
        # Its own generator, seeded apart: drawing from the engine's would shift every retry's
        # jitter a seeded run (a test, the simulation) was written against.
        self.notifier = Notifier(store, self.clock, concurrency=notify_concurrency, per_receiver=notify_per_receiver,
                                 rng=random.Random(None if seed is None else f"notify:{seed}"))  # fmt: skip

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.notifier.aclose()
        routes, self._routes = self._routes, {}
        for route in routes.values():
            await route.aclose()

    def route_for(self, lane: Lane) -> Route:
        if lane.route in self._given:
            return self._given[lane.route]
        route = self._routes.get(lane.route_key)
        if route is None:
            route = self._routes[lane.route_key] = create_route(lane.route, lane.options)
        return route

    async def tick(self, job_name: str | None = None) -> TickReport:
        report = TickReport()
        report.reclaimed = self.reclaim()
        for job in self._jobs(job_name):
            try:
                await self._turn(job, report)
            except JobGone:  # deleted since this tick read it (`lowtide delete`: nothing of it was in flight)
                log.info("job %s was deleted while this worker ticked it; leaving it", job.name)
        report.notifying = len(self.notifier.start_due(job_name))
        return report

    async def _turn(self, job: JobContext, report: TickReport) -> None:
        """One job's part of a tick."""
        report.deadline_failed += self.enforce_deadline(job)
        lanes = [(lane, self.route_for(lane)) for lane in job.lanes]
        if job.spec.fallback is not None:
            main = lanes[0][1]
            report.to_fallback += cut_over(self.store, job, main.kind, main.name, self.clock).to_fallback
        elif job.spec.chain:
            report.to_fallback += tiers.step(self.store, job, [route.kind for _, route in lanes], self.clock)
        # A tier past its hand-over takes no new work (what ingest hands it now goes up at the next tick).
        handed_over = tiers.handed_over(job.spec, self.clock.now())
        for lane, route in lanes:
            await self._work(job, lane, route, report, takes_work=lane.name not in handed_over)
        if self.finish(job):
            report.finished.append(job.name)

    async def _work(self, job: JobContext, lane: Lane, route: Route, report: TickReport, takes_work: bool = True) -> None:
        """The steps of one lane of a job: plan, submit and poll batches; or run directly.
        `takes_work` False: only bring in what was sent (a chain's tier past its hand-over)."""
        if route.kind == "batch":
            if job.state is JobState.ACTIVE and takes_work:
                report.planned += batches.plan(self.store, job, route, self.clock, lane.name)
            worker = batches.Worker(self.owner, self._owner_alive)
            # Polled first: a batch that ended is read before this tick's uploads (each up to
            # the provider's 200 MB or 2 GB), not after them, its results window running.
            report.ingested.add(await batches.poll(self.store, job, route, self.clock, self.rng, worker))
            report.submitted += await batches.submit(self.store, job, route, self.clock, self.rng, worker, lane.model)
        elif job.state is JobState.ACTIVE and takes_work:
            if lane.name not in (None, "main") and job.spec.deadline is not None:  # a fallback lane, a tier up
                self._ask_for_speed(job, route, lane.name)
            report.ingested.add(
                await run_direct(self.store, job, route, self.clock, self.owner, self.lease, self.rng, lane)
            )

    def _ask_for_speed(self, job: JobContext, route: Route, lane: str) -> None:
        """Tell a fallback route (or a tier up) that can scale (`plan_for`) how much must
        finish by the deadline."""
        plan_for = getattr(route, "plan_for", None)
        if plan_for is None:
            return
        left = job.spec.deadline.timestamp() - self.clock.now()
        with self.store.read() as conn:
            waiting = conn.execute(
                select(func.count()).where(
                    requests.c.job_id == job.id,
                    requests.c.state == PENDING,  # the partial lane index
                    requests.c.lane == lane,
                )
            ).scalar_one()
        if waiting and left > 0:
            plan_for(waiting, left)

    def _jobs(self, job_name: str | None) -> list[JobContext]:
        """Active jobs, budget_exhausted ones (they finish when what was in flight is back),
        and others whose provider batches still have results to bring in or a create still
        to resolve (a cancelled job's, or a batch left behind at a deadline cut-over: they
        are paid for; or one given up as lost, still polled for what it bills)."""
        live_batches = select(dispatches.c.id).where(
            dispatches.c.job_id == jobs.c.id,
            dispatches.c.state.in_([DispatchState.SUBMITTED.value, DispatchState.SUBMITTING.value]),
        )
        # Given up as lost, polled for its bill. A query of its own: each finds its rows by
        # the (job, state) index, where one OR of both would read every dispatch of every job.
        lost_watched = select(dispatches.c.id).where(dispatches.c.job_id == jobs.c.id, watched())
        ticked = [JobState.ACTIVE.value, JobState.BUDGET_EXHAUSTED.value]
        stmt = select(jobs).where(or_(jobs.c.state.in_(ticked), live_batches.exists(), lost_watched.exists()))
        if job_name is not None:
            stmt = stmt.where(jobs.c.name == job_name)
        with self.store.read() as conn:
            return [JobContext.from_row(r) for r in conn.execute(stmt.order_by(jobs.c.id))]

    def reclaim(self) -> int:
        """Return to pending the requests of direct dispatches whose worker is gone."""
        now = self.clock.now()
        running = select(dispatches.c.id, dispatches.c.job_id, dispatches.c.owner, dispatches.c.lease_until).where(
            dispatches.c.state == DispatchState.RUNNING.value
        )
        # Most ticks find none to take back: asked in a read transaction first, so that an idle
        # worker's tick does not take SQLite's write lock (nor wait for it) only to find that.
        with self.store.read() as conn:
            if not any(self._reclaimable(owner, lease_until, now) for _, _, owner, lease_until in conn.execute(running)):
                return 0
        with self.store.begin() as conn:
            reclaimed = 0
            for dispatch_id, job_id, owner, lease_until in conn.execute(running).all():
                if not self._reclaimable(owner, lease_until, now):
                    continue
                # Given back unsent: a dead worker's answers never reached the store.
                n = sum(fate.take_back(conn, JobContext.load(conn, job_id), dispatch_id, now, sent=False).values())
                move_dispatch(conn, dispatch_id, DispatchState.RUNNING, DispatchState.ABANDONED, ended_at=now)
                add_event(conn, job_id, "reclaimed", f"{n} request(s) from worker {owner} that stopped", now)
                reclaimed += n
        return reclaimed

    def _reclaimable(self, owner: str | None, lease_until: float | None, now: float) -> bool:
        """Whether a running direct dispatch's worker is gone: not this one, and its lease
        run out (or never taken) or its process seen dead on this machine."""
        held = lease_until is not None and lease_until > now  # no lease: nobody holds it
        return owner != self.owner and not (held and self._owner_alive(owner))

    def _owner_alive(self, owner: str | None) -> bool:
        host, _, rest = (owner or "").partition(":")
        pid = rest.partition(":")[0]
        if host != self.host or not pid.isdigit():
            return True  # another machine: only its lease can tell
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        try:  # a killed process its parent has not reaped yet still has a pid: a zombie
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rpartition(b")")[2].split()[0] != b"Z"
        except (OSError, IndexError):
            return True

    def enforce_deadline(self, job: JobContext) -> int:
        """Past the deadline nothing more is sent (engine/fate.py `past_deadline`)."""
        now = self.clock.now()
        if job.state is JobState.CANCELLED or not fate.deadline_passed(job.spec, now):
            return 0
        with self.store.begin() as conn:
            return fate.past_deadline(conn, job, now)

    def finish(self, job: JobContext) -> bool:
        """An active (or budget_exhausted) job whose requests are all terminal is finished.
        The job's row is locked first (`lock_job`): a load or retry that adds live requests
        takes the same lock, so it commits either wholly before this check or after the
        job is finished (and makes it active again), never in between."""
        now = self.clock.now()
        with self.store.begin() as conn:
            state = lock_job(conn, job.id)
            if state not in (JobState.ACTIVE.value, JobState.BUDGET_EXHAUSTED.value):
                return False
            live = conn.execute(
                select(requests.c.id).where(requests.c.job_id == job.id, requests.c.state.in_(LIVE)).limit(1)
            ).first()
            if live is not None:
                return False
            if move_job(conn, job.id, JobState.FINISHED, finished_at=now, updated_at=now):
                add_event(conn, job.id, "finished", "every request reached a terminal state", now)
                notify.job_ended(conn, job, now)  # in this transaction: enqueued if and only if finished
                return True
        return False

    def next_due(self, job_name: str | None = None) -> float | None:
        """The earliest time something becomes due (a poll, a retry), if anything waits."""
        with self.store.read() as conn:
            # Not a batch given up as lost, polled for its bill alone (batches.WATCH, days): a
            # worker's loop ticks every IDLE_WAIT_MAX whatever, and `--until-idle` ends without it.
            q_poll = select(func.min(dispatches.c.next_poll_at)).where(
                dispatches.c.state == DispatchState.SUBMITTED.value
            )
            active = select(jobs.c.id).where(jobs.c.state == JobState.ACTIVE.value)
            # Per job, so the (job_id, state, not_before) index answers it without a scan. Only
            # what is still ahead: a request due now that the tick just before did not send is
            # held (its model's provider queue is full, its tier handed over) and waits for a
            # poll or a cut-over, which wake the loop themselves; counted, it would spin it.
            now = self.clock.now()
            q_retry = select(func.min(requests.c.not_before)).where(
                requests.c.job_id.in_(active), requests.c.state == RequestState.PENDING.value, requests.c.not_before > now
            )
            # A create another process holds (its lease running): resolved by whoever ticks once
            # the lease runs out or its owner is seen dead. Left out, `--until-idle` could stop
            # with its requests dispatched (a worker SIGKILLed mid-create whose process its
            # parent has not reaped yet still looks alive).
            # A direct dispatch another process runs, likewise: its requests come back to whoever
            # ticks should that process die.
            q_lease = select(func.min(dispatches.c.lease_until)).where(
                dispatches.c.state.in_([DispatchState.SUBMITTING.value, DispatchState.RUNNING.value]), dispatches.c.lease_until > now
            )
            # A chunk still to send: one whose create failed (its lease let go) or that was planned
            # again (provably not sent). The next tick sends it, RESEND_WAIT from now, not at once
            # (a provider that keeps failing is not asked in a loop). Left out, `--until-idle` ended
            # with the chunk's requests dispatched and nothing sent.
            q_unsent = select(dispatches.c.id).where(
                dispatches.c.job_id.in_(active),
                or_(dispatches.c.state == DispatchState.PLANNED.value,
                    (dispatches.c.state == DispatchState.SUBMITTING.value) & or_(dispatches.c.lease_until.is_(None), dispatches.c.lease_until <= now)),
            ).limit(1)  # fmt: skip
            if job_name is not None:
                job_id = select(jobs.c.id).where(jobs.c.name == job_name).scalar_subquery()
                q_poll = q_poll.where(dispatches.c.job_id == job_id)
                q_retry = q_retry.where(requests.c.job_id == job_id)
                q_lease = q_lease.where(dispatches.c.job_id == job_id)
                q_unsent = q_unsent.where(dispatches.c.job_id == job_id)
            times = [conn.execute(q_poll).scalar(), conn.execute(q_retry).scalar(), conn.execute(q_lease).scalar()]
            if conn.execute(q_unsent).first() is not None:
                times.append(now + RESEND_WAIT)
            watched = select(jobs.c.spec).where(jobs.c.state == JobState.ACTIVE.value)
            if job_name is not None:
                watched = watched.where(jobs.c.name == job_name)
            for spec_json in conn.scalars(watched):
                times.append(_cut_over_time(spec_json, now))
        times.append(self.notifier.next_due(job_name))
        times = [t for t in times if t is not None]
        return min(times) if times else None


def _cut_over_time(spec_json: str, now: float) -> float | None:
    """When a job's deadline cut-over (or the next hand-over of its chain) is still ahead,
    its time: a worker must wake for it."""
    spec = stored_spec(spec_json)
    if spec.chain:
        return min(tiers.cut_times(spec, now), default=None)
    if spec.fallback is None or spec.deadline is None:
        return None
    cut_at = spec.deadline.timestamp() - spec.fallback.safety_margin
    return cut_at if cut_at > now else None
