"""What a long-lived server keeps of settled jobs for its reads of every job: the
dashboard's jobs list and series (server/dashboard.py) and `/metrics` (server/metrics.py).
Each reader here reads its figures per job, of the jobs given or of every job; what is kept
of each, and when it is read again, is engine/job_figures.py's."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from sqlalchemy import Integer, and_, case, cast, func, or_, select

from lowtide.engine.job_figures import FiguresCache, KeptPerJob
from lowtide.store.bulk import among
from lowtide.store.schema import attempts, events, jobs, requests

BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}


def spans(conn: Any, ids: list[int] | None) -> dict[int, tuple[float, float]]:
    """job id -> the times of its first and last attempt (jobs `ids`; None: every job)."""
    a = attempts.c
    where = [] if ids is None else [among(conn, a.job_id, ids)]
    return {j: (first, last) for j, first, last in conn.execute(
        select(a.job_id, func.min(a.at), func.max(a.at)).where(*where).group_by(a.job_id))}  # fmt: skip


def slots(conn: Any, seconds: int, ids: list[int] | None) -> dict[int, list[tuple[int, ...]]]:
    """job id -> its attempts per time slot of `seconds`: (slot, attempts, failures, cost,
    real-time equivalent, the succeeded attempts' saving, attempts of unknown cost), in
    picodollars, the slots in order (jobs `ids`; None: every job)."""
    a = attempts.c
    # `at` is positive: SQLite's CAST truncates, which is floor; PostgreSQL's rounds.
    slot = cast(a.at / seconds, Integer) if conn.dialect.name == "sqlite" else func.floor(a.at / seconds)
    known = a.cost_picousd.is_not(None)
    saved = and_(known, a.ok.is_(True))
    unknown = and_(a.cost_picousd.is_(None), or_(a.billed.is_(None), a.billed.is_(True)))
    where = [] if ids is None else [among(conn, a.job_id, ids)]
    out: dict[int, list[tuple[int, ...]]] = {}
    for r in conn.execute(
        select(
            a.job_id, slot.label("slot"), func.count().label("n"),
            func.sum(case((a.ok.is_(False), 1), else_=0)).label("failures"),
            func.coalesce(func.sum(a.cost_picousd), 0).label("cost"),
            func.coalesce(func.sum(case((known, a.realtime_picousd), else_=None)), 0).label("realtime"),
            func.coalesce(func.sum(case((saved, func.coalesce(a.realtime_picousd, 0) - a.cost_picousd), else_=None)), 0).label("saving"),
            func.sum(case((unknown, 1), else_=0)).label("unknown"),
        ).where(*where).group_by(a.job_id, slot).order_by(a.job_id, slot)
    ):  # fmt: skip
        out.setdefault(r.job_id, []).append(
            (int(r.slot), r.n, int(r.failures), int(r.cost), int(r.realtime), int(r.saving), int(r.unknown))
        )
    return out


def routes_states(conn: Any, ids: list[int] | None) -> dict[int, list[tuple[str, str, int]]]:
    """job id -> (the route its requests last ran on, else the job's; state; requests)."""
    r = requests.c
    route = func.coalesce(r.route, jobs.c.route)
    where = [] if ids is None else [among(conn, r.job_id, ids)]
    out: dict[int, list[tuple[str, str, int]]] = {}
    for job_id, on, state, n in conn.execute(
        select(r.job_id, route, r.state, func.count()).select_from(requests.join(jobs, jobs.c.id == r.job_id))
        .where(*where).group_by(r.job_id, route, r.state)
    ):  # fmt: skip
        out.setdefault(job_id, []).append((on, state, n))
    return out


def poll_errors(conn: Any, ids: list[int] | None) -> dict[int, int]:
    """job id -> polls of its provider batches that failed."""
    where = [] if ids is None else [among(conn, events.c.job_id, ids)]
    return dict(conn.execute(select(events.c.job_id, func.count()).where(events.c.kind == "poll_error", *where).group_by(events.c.job_id)).all())


class Kept:
    """What the dashboard and /metrics keep of settled jobs between reads (engine/job_figures.py)."""

    def __init__(self) -> None:
        self.figures = FiguresCache()
        self.spans = KeptPerJob(spans, (None, None))
        self.routes_states = KeptPerJob(routes_states, [])
        self.poll_errors = KeptPerJob(poll_errors, 0)
        self._series = {s: KeptPerJob(lambda conn, ids, s=s: slots(conn, s, ids), []) for s in BUCKETS.values()}

    def series(self, seconds: int) -> KeptPerJob:
        return self._series[seconds]


def kept_of(request: Request) -> Kept:
    """The app's own: one per dashboard or serve process."""
    kept = getattr(request.app.state, "dashboard_kept", None)
    if kept is None:
        kept = request.app.state.dashboard_kept = Kept()
    return kept
