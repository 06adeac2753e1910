"""The dashboard of `lowtide serve`: one page (`GET /dashboard`) and the JSON it polls
(`/dashboard/api/...`), over every job of the server's store — API batches and jobs run by
`lowtide run` or a worker alike.

    GET /dashboard                      the page (a Jinja2 template with its own small JS)
    GET /dashboard/api/jobs             every job: state, progress, cost figures; store-wide
                                        totals, failures by reason, API batches by status
    GET /dashboard/api/jobs/{name}      one job: progress, failures, ETA, cost so far and
                                        its estimate, live batches by phase, the batch
                                        timeline, placement, events, cost by route
    GET /dashboard/api/failed?job=      one page of a job's failed requests (?reason=, ?q=,
                                        ?offset=, ?limit=)
    GET /dashboard/api/series           cost, real-time equivalent and saving per minute,
                                        hour or day, from the attempts' `at` (?job=, ?bucket=)

Progress and failure figures are `lowtide.engine.overview`'s: "failed" is always failed
requests (the reasons add up to it); failed attempts (tries) are shown apart, as such.
Cost figures are `cost_report`'s own (`Figures.as_dict`, the numbers `lowtide report --json`
prints): amounts are decimal strings and an unknown cost is counted apart, never as 0.

With API keys configured, the dashboard and `/metrics` need one too: an `x-api-key` or
`Authorization: Bearer` header, or the cookie `/dashboard?key=KEY` sets (an HMAC of the key,
HttpOnly, so that the key itself is in neither the page nor the cookie jar).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import Integer, and_, case, cast, func, or_, select

from lowtide.core.errors import JobNotFoundError
from lowtide.engine import overview
from lowtide.engine.control import job_status
from lowtide.engine.report import Figures, cost_report
from lowtide.store.db import Store
from lowtide.store.money import from_pico
from lowtide.store.queries import get_job
from lowtide.store.schema import attempts, jobs, serve_batches

router = APIRouter(include_in_schema=False)
ASSETS = Path(__file__).with_name("dashboard_assets")
COOKIE = "lowtide_dashboard"
BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}
MAX_JOBS = 500  # the newest jobs listed; the totals cover every job
_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=True)


# Access -------------------------------------------------------------------------------
def _cookie_value(key: str) -> str:
    """What the cookie holds for a key: proof of it, useless against `/v1`."""
    return hmac.new(key.encode(), b"lowtide dashboard", hashlib.sha256).hexdigest()


def viewer_allowed(request: Request) -> bool:
    """No keys configured: open, as `/v1` is. Otherwise a key in a header, or the cookie."""
    keys = request.app.state.server.config.api_keys
    if not keys:
        return True
    bearer = request.headers.get("authorization", "")
    given = request.headers.get("x-api-key") or (bearer[7:].strip() if bearer.lower().startswith("bearer ") else None)
    if given is not None and any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and any(hmac.compare_digest(cookie, _cookie_value(k)) for k in keys)


def refused(request: Request) -> Response:
    message = "an API key is needed: open /dashboard?key=YOUR_KEY, or send it as x-api-key or Authorization: Bearer"
    if request.url.path == "/dashboard":
        page = _templates.get_template("refused.html").render(message=message)
        return HTMLResponse(page, status_code=401)
    return JSONResponse({"error": message}, status_code=401)


# The page ------------------------------------------------------------------------------
@router.get("/dashboard")
def page(request: Request, key: str | None = None,
         refresh: Annotated[float, Query(allow_inf_nan=False, description="seconds between updates, 0.2 to 60")] = 2.0) -> Response:  # fmt: skip
    """The page; `?key=KEY` (with keys configured) sets the cookie and comes back without it."""
    keys = request.app.state.server.config.api_keys
    if key is not None and keys:
        if not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
            return refused(request)
        rest = request.url.remove_query_params("key")
        response = RedirectResponse(rest.path + (f"?{rest.query}" if rest.query else ""), status_code=303)
        response.set_cookie(COOKIE, _cookie_value(key), httponly=True, samesite="strict", path="/")
        return response
    if not viewer_allowed(request):
        return refused(request)
    refresh_ms = int(min(max(refresh, 0.2), 60.0) * 1000)  # finite (nan, inf: 400), then clamped
    script = (ASSETS / "dashboard.js").read_text(encoding="utf-8")
    html = _templates.get_template("dashboard.html").render(refresh_ms=refresh_ms, script=script)
    return HTMLResponse(html, headers={"cache-control": "no-store"})


# The API -------------------------------------------------------------------------------
@router.get("/dashboard/api/jobs")
def list_jobs(request: Request) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    report = cost_report(store, by="job")
    costs = {g.group: g for g in report.groups}
    with store.begin() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.name, jobs.c.state, jobs.c.route, jobs.c.created_at, jobs.c.updated_at, jobs.c.finished_at)
            .order_by(jobs.c.id.desc())
            .limit(MAX_JOBS)
        ).all()
        progress = overview.progress_by_job(conn)
        failures = overview.failures(conn)
        batches = dict(conn.execute(select(serve_batches.c.status, func.count()).group_by(serve_batches.c.status)).all())
        job_count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
    listed = []
    for row in rows:
        p = progress.get(row.id) or overview.Progress()
        listed.append({
            "name": row.name, "state": row.state, "route": row.route,
            "created_at": row.created_at, "updated_at": row.updated_at, "finished_at": row.finished_at,
            "total": p.total, "done": p.done, "failed": p.failed, "progress": p.as_dict(), "counts": _counts(p),
            "cost": (costs.get(row.name) or Figures(row.name)).as_dict(),
        })  # fmt: skip
    return _json({
        "generated_at": time.time(), "job_count": job_count, "jobs": listed,
        "total": report.total.as_dict(), "failures": failures.by_reason, "failure_figures": failures.as_dict(),
        "api_batches": batches,
    })  # fmt: skip


@router.get("/dashboard/api/jobs/{name:path}")
def job_detail(request: Request, name: str) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    try:
        status = job_status(store, name, events=20)
        report = cost_report(store, job=name, by="route")
        with store.begin() as conn:
            row = get_job(conn, name)
            progress = overview.Progress.of(status.counts)
            failures = overview.failures(conn, row.id)
            eta = overview.eta(conn, row.id, progress)
            estimate = overview.job_estimate(conn, row.id)
            batch_count, batches = overview.batch_timeline(conn, row.id)
    except JobNotFoundError as err:
        return JSONResponse({"error": str(err)}, status_code=404)
    return _json({
        "name": status.name, "state": status.state, "route": status.route,
        "created_at": row.created_at, "updated_at": row.updated_at, "finished_at": row.finished_at,
        "total": progress.total, "done": progress.done, "failed": progress.failed, "progress": progress.as_dict(),
        "counts": status.counts, "phases": status.phases,
        "failures": failures.by_reason, "failure_figures": failures.as_dict(),
        "eta": None if eta is None else asdict(eta), "estimate": overview.estimate_dict(estimate),
        "batch_count": batch_count, "batches": batches,
        "placement": [{"route": r, "reason": why, "state": s, "count": n} for r, why, s, n in status.placement],
        "tiers": [{"tier": t, "state": s, "count": n} for t, s, n in status.tiers],
        "events": status.events,
        "budget_usd": _money(status.budget_usd), "reserved_usd": _money(status.reserved_usd),
        "cost": report.total.as_dict(), "routes": [g.as_dict() for g in report.groups],
    })  # fmt: skip


@router.get("/dashboard/api/failed")
def failed(request: Request, job: str, reason: str | None = None, q: str | None = None,
           offset: Annotated[int, Query(ge=0)] = 0,
           limit: Annotated[int, Query(ge=1, le=overview.MAX_PAGE)] = 50) -> Response:  # fmt: skip
    """One page of a job's failed requests, filtered by reason and by text."""
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    try:
        with store.begin() as conn:
            found = overview.failed_rows(conn, get_job(conn, job).id, reason=reason or None, search=q or None, offset=offset, limit=limit)
    except JobNotFoundError as err:
        return JSONResponse({"error": str(err)}, status_code=404)
    return _json({"job": job, "reason": reason or None, "q": q or None} | asdict(found))


@router.get("/dashboard/api/series")
def series(request: Request, job: str | None = None, bucket: str = "auto") -> Response:
    """Per time bucket: attempts, failures, known cost, its real-time equivalent and saving
    (as `cost_report` counts them), and attempts of unknown cost."""
    if not viewer_allowed(request):
        return refused(request)
    if bucket != "auto" and bucket not in BUCKETS:
        return JSONResponse({"error": f"bucket {bucket!r}: use auto, {', '.join(BUCKETS)}"}, status_code=400)
    store: Store = request.app.state.server.store
    a = attempts.c
    with store.begin() as conn:
        where = []
        if job is not None:
            job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == job)).scalar()
            if job_id is None:
                return JSONResponse({"error": f'no job named "{job}"'}, status_code=404)
            where.append(a.job_id == job_id)
        if bucket == "auto":
            first, last = conn.execute(select(func.min(a.at), func.max(a.at)).where(*where)).one()
            span = (last - first) if first is not None else 0.0
            bucket = "minute" if span <= 3 * 3600 else "hour" if span <= 7 * 86400 else "day"
        seconds = BUCKETS[bucket]
        # `at` is positive: SQLite's CAST truncates, which is floor; PostgreSQL's rounds.
        slot = cast(a.at / seconds, Integer) if conn.dialect.name == "sqlite" else func.floor(a.at / seconds)
        known = a.cost_picousd.is_not(None)
        unknown = and_(a.cost_picousd.is_(None), or_(a.billed.is_(None), a.billed.is_(True)))
        rows = conn.execute(
            select(
                slot.label("slot"), func.count().label("n"),
                func.sum(case((a.ok.is_(False), 1), else_=0)).label("failures"),
                func.coalesce(func.sum(a.cost_picousd), 0).label("cost"),
                func.coalesce(func.sum(case((known, a.realtime_picousd), else_=None)), 0).label("realtime"),
                func.sum(case((unknown, 1), else_=0)).label("unknown"),
            ).where(*where).group_by(slot).order_by(slot)
        ).all()  # fmt: skip
    points = [
        {
            "t": int(r.slot) * seconds, "attempts": r.n, "failures": int(r.failures),
            "cost_usd": _money(from_pico(r.cost)), "realtime_usd": _money(from_pico(r.realtime)),
            "saving_usd": _money(from_pico(int(r.realtime) - int(r.cost))), "unknown_cost_attempts": int(r.unknown),
        }  # fmt: skip
        for r in rows
    ]
    return _json({"job": job, "bucket": bucket, "seconds": seconds, "points": points})


# Helpers -------------------------------------------------------------------------------
def _counts(p: overview.Progress) -> dict[str, int]:
    """Requests by state, the states with none left out."""
    by_state = {"succeeded": p.succeeded, "failed": p.failed, "cancelled": p.cancelled, "pending": p.waiting, "dispatched": p.in_flight}
    return {state: n for state, n in by_state.items() if n}


def _money(usd: Any) -> str | None:
    return None if usd is None else str(usd)


def _json(data: dict[str, Any]) -> JSONResponse:
    return JSONResponse(data, headers={"cache-control": "no-store"})
