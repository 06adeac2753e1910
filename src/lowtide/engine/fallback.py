"""Deadline cut-over: moving a job's requests from its route to its fallback route in time.

A job with a `deadline` and a `fallback` route is watched each tick:

    cut_at = deadline − fallback.safety_margin

- Before `cut_at`, a batch route only gets new requests if a batch started now is expected
  to end by `cut_at`. The expected turnaround is the median submit-to-end time of the
  route's last batches in this store (at least 3), else `fallback.expected_turnaround`.
  Requests it cannot take in time go to the fallback route at once.
- At `cut_at`, pending requests of the main route go to the fallback route, planned
  batches are taken apart, and every in-flight batch is asked to cancel. A cancelled batch
  still delivers what it finished: those results are applied as usual, and what it did not
  finish comes back cancelled and goes to the fallback route (ingest does that).
- If a cancelled batch has not ended a third of the margin after `cut_at`, its remaining
  requests are released to the fallback route without it. Should the batch deliver them
  after all, those results are recorded as attempts, with their usage, and never applied
  over the fallback's (they come from a dispatch the requests have left).

Requests failed retryably more often than `retry.max_attempts` allows, or expired, also go
to the fallback route; that is decided where outcomes are applied (engine/ingest.py).

The steps below take the lanes they move between, so a `route: auto` job's chain of tiers
(engine/tiers.py) uses them tier by tier.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sqlalchemy import Connection, and_, select, update

from lowtide.core.clock import Clock
from lowtide.core.states import DispatchState, JobState
from lowtide.engine import fate, notify
from lowtide.engine.context import JobContext
from lowtide.store.db import Store
from lowtide.store.queries import add_event
from lowtide.store.schema import PENDING, dispatches, requests

HISTORY = 20  # recent batches of a route its turnaround is estimated from
MIN_HISTORY = 3


@dataclass(slots=True)
class CutReport:
    to_fallback: int = 0
    cancelled_batches: int = 0


def expected_turnaround(conn: Connection, route: str, default: float) -> float:
    """Seconds from submission to end of this route's recent batches (median), else `default`.
    Batches cut short by a deadline are left out: they say nothing about how long one takes."""
    took = list(
        conn.scalars(
            select(dispatches.c.ended_at - dispatches.c.submitted_at)
            .where(
                dispatches.c.route == route,
                dispatches.c.kind == "batch",
                dispatches.c.state == DispatchState.ENDED.value,
                dispatches.c.submitted_at.is_not(None),
                dispatches.c.cut_at.is_(None),
            )
            .order_by(dispatches.c.ended_at.desc())
            .limit(HISTORY)
        )
    )
    return statistics.median(took) if len(took) >= MIN_HISTORY else default


def cut_over(store: Store, job: JobContext, route_kind: str, route_name: str, clock: Clock) -> CutReport:
    """One pass of the deadline watch for a job (see the module docstring)."""
    report = CutReport()
    spec = job.spec
    fb = spec.fallback
    if fb is None or spec.deadline is None or job.state is not JobState.ACTIVE:
        return report
    now = clock.now()
    cut_at = spec.deadline.timestamp() - fb.safety_margin
    with store.begin() as conn:
        if now >= cut_at:
            report.to_fallback += move_pending(conn, job.id, now, "deadline cut-over")
            report.to_fallback += unplan(conn, job, route_name, now)
            report.cancelled_batches = cancel_in_flight(conn, job.id, route_name, now)
            report.to_fallback += release_stuck(conn, job, route_name, now, fb.safety_margin / 3)
            notify.deadline_cutover(conn, job, now, f"deadline cut-over: what {route_name} has not finished goes to {fb.route}")
        elif route_kind == "batch":
            turnaround = expected_turnaround(conn, route_name, fb.expected_turnaround)
            if now + turnaround > cut_at:
                why = (
                    f"batches on {route_name} are expected to take {turnaround:.0f} s; "
                    f"{max(0.0, cut_at - now):.0f} s were left before the cut-over"
                )
                report.to_fallback += move_pending(conn, job.id, now, why)
        if report.to_fallback or report.cancelled_batches:
            add_event(
                conn, job.id, "cut_over",
                f"{report.to_fallback} request(s) to {fb.route}, {report.cancelled_batches} batch(es) asked to cancel",
                now,
            )  # fmt: skip
    return report


def move_pending(
    conn: Connection, job_id: int, now: float, why: str, src: str = "main", dst: str = "fallback", keep: int = 0
) -> int:
    """Pending requests of lane `src` move to lane `dst` (not states: they stay pending);
    the `keep` oldest stay (a direct tier of a chain keeps what it can still finish)."""
    which = and_(
        requests.c.job_id == job_id,
        requests.c.state == PENDING,  # the partial lane index
        requests.c.lane == src,
    )
    if keep > 0:
        kept = select(requests.c.id).where(which).order_by(requests.c.not_before, requests.c.id).limit(keep)
        which = and_(which, requests.c.id.not_in(kept))
    return conn.execute(
        update(requests)
        .where(which)
        .values(
            lane=dst,
            lane_reason=why,
            lane_base_attempts=requests.c.attempts,
            not_before=now,
            updated_at=now,
        )
    ).rowcount


def unplan(conn: Connection, job: JobContext, route: str, now: float, dst: str = "fallback", why: str | None = None) -> int:
    """Batches planned but not sent: their requests go to lane `dst` unsent (engine/fate.py
    `undo_planned`; one another worker has just begun to send is cut once it is submitted)."""
    planned = conn.scalars(
        select(dispatches.c.id).where(
            dispatches.c.job_id == job.id,
            dispatches.c.route == route,
            dispatches.c.state == DispatchState.PLANNED.value,
        )
    ).all()
    lane = _lane(now, why or "deadline cut-over before the batch was sent", dst)
    return sum(fate.undo_planned(conn, job, dispatch_id, now, lane) or 0 for dispatch_id in planned)


def cancel_in_flight(conn: Connection, job_id: int, route: str, now: float) -> int:
    """Ask the provider to cancel every in-flight batch of the main route (at the next poll,
    which is made due now)."""
    return conn.execute(
        update(dispatches)
        .where(
            dispatches.c.job_id == job_id,
            dispatches.c.route == route,
            dispatches.c.state == DispatchState.SUBMITTED.value,
            dispatches.c.cut_at.is_(None),
        )
        .values(cancel_requested=True, cut_at=now, next_poll_at=now)
    ).rowcount


def release_stuck(
    conn: Connection, job: JobContext, route: str, now: float, grace: float, dst: str = "fallback", why: str | None = None
) -> int:
    """Cancelled batches that have not ended within `grace`: go on without them. What they
    held goes to lane `dst`; their attempt counts (they were sent)."""
    moved = 0
    stuck = conn.scalars(
        select(dispatches.c.id).where(
            dispatches.c.job_id == job.id,
            dispatches.c.route == route,
            dispatches.c.state == DispatchState.SUBMITTED.value,
            dispatches.c.cut_at <= now - grace,
        )
    ).all()
    lane = _lane(now, why or "its batch did not end after being cancelled at the cut-over", dst)
    for dispatch_id in stuck:
        moved += sum(fate.take_back(conn, job, dispatch_id, now, sent=True, values=lane).values())
    return moved


def _lane(now: float, why: str, dst: str) -> dict:
    """What a request carries to lane `dst` (its attempts so far are the new lane's base)."""
    return {"lane": dst, "lane_reason": why, "not_before": now, "lane_base_attempts": requests.c.attempts}
