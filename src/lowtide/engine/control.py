"""What a user does to a job: look at it, cancel it, retry what failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import and_, func, or_, select, update

from lowtide.core.clock import Clock
from lowtide.core.spec import JobSpec, stored_spec
from lowtide.core.states import DispatchState, JobState, RequestState
from lowtide.engine import fate
from lowtide.engine.budget import position
from lowtide.engine.context import tier_lane
from lowtide.store.db import Store
from lowtide.store.money import from_pico
from lowtide.store.queries import (
    LIVE_DISPATCH_STATES,
    add_event,
    dispatch_phases,
    get_job,
    recent_events,
    request_counts,
    token_totals,
)
from lowtide.store.schema import dispatches, notifications, requests
from lowtide.store.transitions import lock_job, move_dispatch, move_job


@dataclass(slots=True)
class JobStatus:
    name: str
    state: str
    route: str
    counts: dict[str, int]
    phases: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    # Where requests ran and why they moved there: (route, reason or None, state, count).
    placement: list[tuple[str, str | None, str, int]] = field(default_factory=list)
    # A `route: auto` job's chain (engine/tiers.py): requests by the tier they are on, and state.
    tiers: list[tuple[str, str, int]] = field(default_factory=list)
    # The known cost of its attempts, how many have an unknown cost, and its budget.
    spent_usd: Decimal = Decimal(0)
    unknown_costs: int = 0
    budget_usd: Decimal | None = None
    reserved_usd: Decimal = Decimal(0)
    # Dispatched requests by the state of their dispatch (a `planned` batch is not sent yet),
    # and the job's dispatches by state (batches done of total).
    dispatched: dict[str, int] = field(default_factory=dict)
    dispatches: dict[str, int] = field(default_factory=dict)
    # The job's notifications (`notify:`, engine/notifier.py) by delivery state: pending,
    # delivered, dead (given up).
    notifications: dict[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        """Requests sent (or being sent) and not back: never those still waiting to go."""
        return sum(n for state, n in self.dispatched.items() if state in SENT_DISPATCH_STATES)

    @property
    def queued(self) -> int:
        """Requests not sent yet: pending, or in a batch that is planned but not submitted."""
        return self.count(RequestState.PENDING) + self.count(RequestState.DISPATCHED) - self.in_flight

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def count(self, state: RequestState) -> int:
        return self.counts.get(state.value, 0)

    @property
    def done(self) -> bool:
        return self.state != JobState.ACTIVE.value and not self.phases

    @property
    def all_succeeded(self) -> bool:
        return self.count(RequestState.SUCCEEDED) == self.total


def job_status(store: Store, name: str, events: int = 5, placement: bool = True) -> JobStatus:
    """`placement` False: left empty (a pass over every row of the job, which a table of
    all jobs does not show)."""
    with store.read() as conn:
        job = get_job(conn, name)
        failures = dict(
            conn.execute(
                select(requests.c.error_code, func.count())
                .where(requests.c.job_id == job.id, requests.c.state == RequestState.FAILED.value)
                .group_by(requests.c.error_code)
            ).all()
        )
        tokens = token_totals(conn, job.id)
        spec = stored_spec(job.spec)
        budget = spec.budget_usd
        return JobStatus(
            name=job.name,
            state=job.state,
            route=job.route,
            counts=request_counts(conn, job.id),
            phases=dispatch_phases(conn, job.id),
            tokens=tokens,
            events=[f"{e.kind}: {e.message}" for e in recent_events(conn, job.id, events)],
            failures={k or "unknown": v for k, v in failures.items()},
            placement=_placement(conn, job.id) if placement else [],
            tiers=_tiers(conn, job.id, spec),
            spent_usd=from_pico(tokens["cost_picousd"]),
            unknown_costs=tokens["unknown_cost"],
            budget_usd=budget,
            reserved_usd=position(conn, job.id).reserved if budget is not None else Decimal(0),
            dispatched=_dispatched(conn, job.id),
            dispatches=dict(
                conn.execute(
                    select(dispatches.c.state, func.count()).where(dispatches.c.job_id == job.id).group_by(dispatches.c.state)
                ).all()
            ),
            notifications=dict(
                conn.execute(
                    select(notifications.c.state, func.count())
                    .where(notifications.c.job_id == job.id)
                    .group_by(notifications.c.state)
                ).all()
            ),
        )


# A dispatch in these states has reached (or may have reached) its route.
SENT_DISPATCH_STATES = frozenset({DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value, DispatchState.RUNNING.value})


def _dispatched(conn, job_id: int) -> dict[str, int]:
    rows = conn.execute(
        select(dispatches.c.state, func.count())
        .select_from(requests.join(dispatches, requests.c.dispatch_id == dispatches.c.id))
        .where(requests.c.job_id == job_id, requests.c.state == RequestState.DISPATCHED.value)
        .group_by(dispatches.c.state)
    ).all()
    return {state: n for state, n in rows}


def _placement(conn, job_id: int) -> list[tuple[str, str | None, str, int]]:
    """Requests by the route they last ran on (or "-" if none yet), the reason they moved to
    the fallback route, and state."""
    rows = conn.execute(
        select(requests.c.route, requests.c.lane_reason, requests.c.state, func.count())
        .where(requests.c.job_id == job_id)
        .group_by(requests.c.route, requests.c.lane_reason, requests.c.state)
    ).all()
    return sorted(((route or "-", why, state, n) for route, why, state, n in rows), key=lambda r: (r[0], r[1] or "", r[2]))


def _tiers(conn, job_id: int, spec: JobSpec) -> list[tuple[str, str, int]]:
    """Requests by the tier of the job's chain their lane is (in the chain's order), and state."""
    if not spec.chain:
        return []
    labels = {tier_lane(i): t.label for i, t in enumerate(spec.chain)}
    order = list(labels)
    rows = conn.execute(
        select(requests.c.lane, requests.c.state, func.count())
        .where(requests.c.job_id == job_id)
        .group_by(requests.c.lane, requests.c.state)
    ).all()
    ranked = sorted(rows, key=lambda r: (order.index(r[0]) if r[0] in labels else len(order), r[0], r[1]))
    return [(labels.get(lane, f"lane {lane}"), state, n) for lane, state, n in ranked]


def job_done(store: Store, name: str) -> bool:
    """Cheaply: is the job no longer active, with no provider batch still to collect?"""
    with store.read() as conn:
        job = get_job(conn, name)
        if job.state == JobState.ACTIVE.value:
            return False
        live = conn.execute(
            select(dispatches.c.id)
            .where(
                dispatches.c.job_id == job.id,
                dispatches.c.state.in_(LIVE_DISPATCH_STATES),
                dispatches.c.cut_at.is_(None),
            )
            .limit(1)
        ).first()
        return live is None


def job_spec(store: Store, name: str) -> JobSpec:
    with store.read() as conn:
        return stored_spec(get_job(conn, name).spec)


def cancel_job(store: Store, name: str, clock: Clock, *, force: bool = False) -> int:
    """Cancel what has not finished. Provider batches already sent are asked to cancel and
    their partial results are still brought in (they are paid for). A batch whose create may
    or may not have reached the provider (`submitting`) is flagged: the next tick adopts it
    through the route's `find` and cancels it there (an Anthropic batch is adopted only once
    it has ended: nothing shows it ours sooner), or, if it was never sent, cancels its
    requests; a worker inside that create right now finds the flag when it records the id.

    `force`: a `submitting` batch is not waited for. Against a provider that cannot be reached
    its `find` never answers, and the cancel would wait for ever; forced, its requests are
    cancelled now. The risk, said in the event: if that create did reach the provider, the
    batch runs there, is paid for, and its results are never brought in."""
    now = clock.now()
    with store.begin() as conn:
        job = get_job(conn, name)
        state = lock_job(conn, job.id)
        if force and state == JobState.CANCELLED:
            return _abandon_submitting(conn, job.id, now)
        if state not in (JobState.ACTIVE, JobState.BUDGET_EXHAUSTED):  # finished or already cancelled
            return 0
        move_job(conn, job.id, JobState.CANCELLED, updated_at=now)
        # Pending requests, and those of direct dispatches and unsent batches: nothing will be paid for after this.
        running = select(dispatches.c.id).where(dispatches.c.job_id == job.id, dispatches.c.state == DispatchState.RUNNING.value)
        n = fate.cancel(
            conn, job.id,
            or_(requests.c.state == RequestState.PENDING.value,
                and_(requests.c.state == RequestState.DISPATCHED.value, requests.c.dispatch_id.in_(running))),
            now,
        )  # fmt: skip
        # Read after the statement above: it waited for the rows a worker's plan held, and that
        # plan's batch is visible only now (engine/fate.py `cancel_planned`).
        for dispatch_id in conn.scalars(
            select(dispatches.c.id).where(dispatches.c.job_id == job.id, dispatches.c.state == DispatchState.PLANNED.value)
        ).all():
            n += fate.cancel_planned(conn, job.id, dispatch_id, now)
        # One statement for both: a create that records `submitted` meanwhile keeps the flag.
        conn.execute(
            update(dispatches)
            .where(
                dispatches.c.job_id == job.id,
                dispatches.c.state.in_([DispatchState.SUBMITTED.value, DispatchState.SUBMITTING.value]),
            )
            .values(cancel_requested=True, next_poll_at=now)
        )
        add_event(conn, job.id, "cancelled", f"{n} request(s) cancelled by the user", now)
        if force:
            n += _abandon_submitting(conn, job.id, now)
    return n


def _abandon_submitting(conn, job_id: int, now: float) -> int:
    """`cancel --force`: batches whose create may or may not have reached the provider end
    here, their requests cancelled, without the `find` that would tell."""
    submitting = conn.scalars(
        select(dispatches.c.id).where(dispatches.c.job_id == job_id, dispatches.c.state == DispatchState.SUBMITTING.value)
    ).all()
    n = 0
    for dispatch_id in submitting:
        why = "abandoned by `lowtide cancel --force` before lowtide could tell whether its create reached the provider"
        if move_dispatch(conn, dispatch_id, DispatchState.SUBMITTING, DispatchState.CANCELLED, ended_at=now, error=why):
            n += fate.cancel(conn, job_id, and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value), now)
    if submitting:
        add_event(
            conn, job_id, "cancel_forced",
            f"{len(submitting)} batch(es) being created abandoned, {n} request(s) cancelled: if a create did reach the "
            "provider, that batch runs and is paid for there, and its results are not brought in",
            now,
        )  # fmt: skip
    return n


def retry_job(store: Store, name: str, clock: Clock, *, failed: bool = True, cancelled: bool = False) -> int:
    """Send failed (and/or cancelled) requests again, with a fresh attempt budget."""
    states = [s for s, wanted in ((RequestState.FAILED, failed), (RequestState.CANCELLED, cancelled)) if wanted]
    if not states:
        return 0
    now = clock.now()
    with store.begin() as conn:
        job = get_job(conn, name)
        lock_job(conn, job.id)  # before the requests: a concurrent finish() waits, then sees them
        n = fate.retry(conn, job.id, states, now)
        if n:
            move_job(conn, job.id, JobState.ACTIVE, finished_at=None, updated_at=now)
            add_event(conn, job.id, "retry", f"{n} request(s) queued again", now)
    store.added_pending(n)
    return n
