"""A decided `route: auto` job's chain of tiers: which tier each pending request runs on.

The chain (`auto.chain`, engine/auto.py) is the chosen tier, then each faster one, slowest
first; each has a margin, the seconds before the end of max_wait (the job's deadline) at
which it takes over. So tier i hands over at

    cut_i = end − margin of tier i+1          (the last tier works to the end)

and tier j **fits** work now when now < cut_j and its expected turnaround is within the
time left to the end: a batch tier one batch's p95, a direct tier its p95 per request ×
the requests (engine/turnaround.py: measured in this store, else the route's prior). It
is the test the choice made at submission, with the time left now.

Each tick, before anything is planned, tier by tier from the chosen one up:

- before cut_i, requests tier i can no longer finish in time go to the first tier above
  that fits (the last, when none does): all of a batch tier's pending requests once a
  batch's p95 no longer fits; those beyond what a direct tier can still do. What stays is
  what the tier's next chunk is planned from.
- at cut_i, tier i hands over as the two-lane cut-over does (engine/fallback.py): its
  pending requests go up, its planned batches are taken apart, its batches in flight are
  asked to cancel (what they finished is kept; what comes back cancelled goes up, at
  ingest), and one still running a third of the next margin later is left behind.

Requests moved up land on a tier that is checked next in the same pass, so work skips
tiers that can no longer make it. Every move is a `tier_move` event, and the request's
`lane_reason`, saying why in the words of the route choice.

A pass reads the pending requests by lane only as its decisions need them (`Waiting`):
which lanes have any, then a lane's count only for a batch tier that no longer fits or a
direct tier with more than it can do. A quiet tick, with nothing to move, reads a few
index entries however many requests wait (bench/tiers.py --quiet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import Connection, func, select, update

from lowtide.core.auto_spec import TierSpec, duration_text
from lowtide.core.clock import Clock
from lowtide.core.spec import JobSpec
from lowtide.core.states import JobState
from lowtide.engine import notify, turnaround
from lowtide.engine.context import JobContext, tier_lane
from lowtide.engine.fallback import cancel_in_flight, move_pending, release_stuck, unplan
from lowtide.store.db import Store
from lowtide.store.queries import add_event, pending_lanes, pending_on_lane
from lowtide.store.schema import PENDING, requests


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier of a job's chain, as this tick sees it."""

    index: int
    spec: TierSpec
    kind: str  # batch | direct (its route's)
    cut: float  # when it hands over (the end, for the last)
    last: bool

    @property
    def lane(self) -> str:
        return tier_lane(self.index)

    @property
    def label(self) -> str:
        return self.spec.label


def tiers_of(job: JobContext, kinds: list[str]) -> list[Tier]:
    """The job's chain with each tier's cut time; `kinds` the kind of each tier's route."""
    chain = job.spec.chain
    assert chain and job.spec.deadline is not None
    end = job.spec.deadline.timestamp()
    out = []
    for i, (t, kind) in enumerate(zip(chain, kinds, strict=True)):
        last = i == len(chain) - 1
        out.append(Tier(i, t, kind, end if last else end - chain[i + 1].margin, last))
    return out


def cut_times(spec: JobSpec, now: float) -> list[float]:
    """The hand-over times of a chain still ahead (a worker wakes for each)."""
    chain = spec.chain
    if not chain or spec.deadline is None:
        return []
    end = spec.deadline.timestamp()
    return [end - t.margin for t in chain[1:] if end - t.margin > now]


def handed_over(spec: JobSpec, now: float) -> set[str]:
    """The lanes of a chain's tiers whose hand-over time has come (none for other jobs)."""
    chain = spec.chain
    if not chain or spec.deadline is None:
        return set()
    end = spec.deadline.timestamp()
    return {tier_lane(i) for i in range(len(chain) - 1) if now >= end - chain[i + 1].margin}


def step(store: Store, job: JobContext, kinds: list[str], clock: Clock) -> int:
    """One pass over a chain job's tiers (see the module doc); the requests moved."""
    if not job.spec.chain or job.spec.deadline is None or job.state is not JobState.ACTIVE:
        return 0
    tiers = tiers_of(job, kinds)
    now = clock.now()
    end = job.spec.deadline.timestamp()
    moved = 0
    with store.begin() as conn:
        waiting = Waiting(conn, job.id)
        if waiting.lanes - {t.lane for t in tiers}:
            moved += _adopt_orphans(conn, job, tiers, now)
            waiting = Waiting(conn, job.id)
        for tier in tiers[:-1]:
            above = tiers[tier.index + 1 :]
            if now >= tier.cut:
                moved += _hand_over(conn, job, tier, above, now, end, waiting)
                continue
            if not waiting.any(tier.lane):
                continue
            took = _expected(conn, job, tier, 1)
            left = end - now
            if tier.kind == "batch":
                if took.p95 is not None and took.p95 <= left:
                    continue
                pending = waiting.count(tier.lane)
                why = f"{tier.label}: p95 {_text(took.p95)} does not fit the {duration_text(left)} left"
                moved += _move(conn, job, tier, above, now, end, waiting, pending, why, took.basis)
            else:
                room = math.floor(left / took.p95) if took.p95 else 0
                if not waiting.more_than(tier.lane, room):
                    continue
                pending = waiting.count(tier.lane)
                why = (
                    f"{tier.label}: {pending - room} request(s) beyond the {room} its p95 ({_text(took.p95)} a request) "
                    f"fits in the {duration_text(left)} left"
                )
                moved += _move(conn, job, tier, above, now, end, waiting, pending - room, why, took.basis, keep=room)
    return moved


def _hand_over(
    conn: Connection, job: JobContext, tier: Tier, above: list[Tier], now: float, end: float, waiting: Waiting
) -> int:
    """Tier `tier`'s cut time has come: what it has not finished goes up."""
    margin = end - tier.cut
    why = f"{tier.label} hands over {duration_text(margin)} before the end of max_wait"
    notify.deadline_cutover(conn, job, now, f"deadline cut-over: {why}")
    moved = 0
    if waiting.any(tier.lane):
        moved += _move(conn, job, tier, above, now, end, waiting, waiting.count(tier.lane), why, None)
    if tier.kind == "batch":
        route = tier.spec.route
        dst, reason, _ = _target(conn, job, above, now, end, 1, why)
        n = unplan(conn, job, route, now, dst.lane, reason) + release_stuck(conn, job, route, now, margin / 3, dst.lane, reason)
        if n:
            add_event(conn, job.id, "tier_move", f"{n} request(s) {tier.label} → {dst.label}: {reason}", now)
            waiting.arrived(dst.lane, n)
            moved += n
        cancelled = cancel_in_flight(conn, job.id, route, now)
        if cancelled:
            add_event(conn, job.id, "cut_over", f"{tier.label}: {cancelled} batch(es) asked to cancel; {why}", now)
    return moved


def _move(
    conn: Connection, job: JobContext, src: Tier, above: list[Tier], now: float, end: float, waiting: Waiting,
    count: int, why: str, basis: str | None, keep: int = 0,
) -> int:  # fmt: skip
    dst, reason, dst_basis = _target(conn, job, above, now, end, count, why)
    n = move_pending(conn, job.id, now, reason, src.lane, dst.lane, keep)
    waiting.left(src.lane, n)
    waiting.arrived(dst.lane, n)
    if n:
        bases = "; ".join(b for b in (basis and f"{src.label} {basis}", f"{dst.label} {dst_basis}") if b)
        add_event(conn, job.id, "tier_move", f"{n} request(s) {src.label} → {dst.label}: {reason} ({bases})", now)
    return n


def _target(
    conn: Connection, job: JobContext, above: list[Tier], now: float, end: float, count: int, why: str
) -> tuple[Tier, str, str]:
    """The first tier of `above` that fits `count` requests now (a direct tier: at least
    one; it passes on what it cannot do when its turn in the pass comes), the reason (as
    the route choice words it), and the basis of its turnaround; the last when none fits."""
    left = end - now
    skipped = []
    for tier in above:
        took = _expected(conn, job, tier, count)
        each = _expected(conn, job, tier, 1).p95 if tier.kind == "direct" else took.p95
        if tier.last or (now < tier.cut and each is not None and each <= left):
            if took.p95 is not None and took.p95 <= left:
                head = f"{tier.label}: p95 {_text(took.p95)} fits the {duration_text(left)} left"
            elif tier.kind == "direct" and each is not None and each <= left:
                head = f"{tier.label}: p95 {_text(each)} a request fits {math.floor(left / each)} in the {duration_text(left)} left"
            else:
                head = f"{tier.label}, the last tier: p95 {_text(took.p95)} for the {duration_text(left)} left"
            return tier, "; ".join([head, why, *skipped]), took.basis
        skipped.append(f"{tier.label} handed over" if now >= tier.cut else f"{tier.label}: p95 {_text(took.p95)} does not fit")
    raise AssertionError("a chain's last tier always takes the work")


def _expected(conn: Connection, job: JobContext, tier: Tier, count: int) -> turnaround.Turnaround:
    return turnaround.expected(conn, tier.spec.route, tier.spec.route_options, job.spec.model, tier.kind, count)


class Waiting:
    """A chain job's pending requests by lane, read as the pass needs them, inside its
    transaction: which lanes have any (one seek per lane), and a lane's count only where a
    decision needs it (a batch tier that no longer fits, a direct tier with more than it can
    do), so a quiet tick reads a few index entries however many requests wait. Moves made in
    the pass are told to it (`arrived`, `left`). The index on (job_id, state, lane) answers
    each read (store/schema.py, m015), by seeks on PostgreSQL too (store/queries.py)."""

    def __init__(self, conn: Connection, job_id: int):
        self._conn = conn
        self._job_id = job_id
        self.lanes = pending_lanes(conn, job_id)
        self._counts: dict[str, int] = {}

    def any(self, lane: str) -> bool:
        return lane in self.lanes

    def count(self, lane: str) -> int:
        if lane not in self.lanes:
            return 0
        if lane not in self._counts:
            self._counts[lane] = self._conn.execute(
                select(func.count()).where(pending_on_lane(self._job_id, lane))
            ).scalar_one()
        return self._counts[lane]

    def more_than(self, lane: str, n: int) -> bool:
        """Whether more than `n` wait on `lane`: at most n + 1 index entries read."""
        if lane not in self.lanes:
            return False
        if lane not in self._counts:
            cap = min(n, 2**62) + 1  # a LIMIT the databases take, however small a p95 made `n`
            some = select(requests.c.id).where(pending_on_lane(self._job_id, lane)).limit(cap).subquery()
            seen = self._conn.execute(select(func.count()).select_from(some)).scalar_one()
            if seen <= n:
                self._counts[lane] = seen  # all of them
            return seen > n
        return self._counts[lane] > n

    def arrived(self, lane: str, n: int) -> None:
        if n:
            self.lanes.add(lane)
            if lane in self._counts:
                self._counts[lane] += n

    def left(self, lane: str, n: int) -> None:
        """`n` left `lane`, whose count was read (a move counts what it moves from first)."""
        self._counts[lane] = self.count(lane) - n
        if self._counts[lane] <= 0:
            self.lanes.discard(lane)


def _adopt_orphans(conn: Connection, job: JobContext, tiers: list[Tier], now: float) -> int:
    """Pending requests on a lane this chain does not have (a shorter chain decided since, a
    `fallback` lane of a spec before) start again on the chosen tier."""
    lanes = [t.lane for t in tiers]
    return conn.execute(
        update(requests)
        .where(requests.c.job_id == job.id, requests.c.state == PENDING, requests.c.lane.not_in(lanes))
        .values(lane=lanes[0], lane_reason=None, lane_base_attempts=requests.c.attempts, updated_at=now)
    ).rowcount


def _text(seconds: float | None) -> str:
    return "unknown" if seconds is None else duration_text(seconds)
