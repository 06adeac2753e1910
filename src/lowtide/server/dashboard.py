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
    GET /dashboard/api/answers?job=     one page of a job's succeeded requests: each answer
                                        and the text of the request it answered, cut at 2,000
                                        characters (?q=, ?offset=, ?limit=)
    GET /dashboard/api/series           cost, real-time equivalent and saving per minute,
                                        hour or day, from the attempts' `at` (?job=, ?bucket=)

Progress and failure figures are `lowtide.engine.overview`'s: "failed" is always failed
requests (the reasons add up to it); failed attempts (tries) are shown apart, as such.
Cost figures are `cost_report`'s own (`Figures.as_dict`, the numbers `lowtide report --json`
prints): amounts are decimal strings and an unknown cost is counted apart, never as 0.
The page's "saving" is what the succeeded attempts saved (`succeeded_saving_usd`): a failed
attempt's spend, however discounted, is never shown as a saving.

Serve's own API jobs (one per API batch, named after it: server/intake.py) are listed with
the rest under `lowtide serve`. `lowtide dashboard` (server/dashboard_app.py: this dashboard
alone, over any store) leaves them out, of the list, the totals, the failures and the series,
and answers 404 for one by name; `?api_jobs=true` (on the page, or any endpoint) shows them,
`?api_jobs=false` hides them under serve too.

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
from sqlalchemy import Select, case, exists, func, select

from lowtide.core.errors import JobNotFoundError
from lowtide.engine import overview
from lowtide.engine.control import job_status
from lowtide.engine.job_figures import added_reasons
from lowtide.engine.report import Figures, cost_report, summed
from lowtide.server.kept import BUCKETS, kept_of, slots, spans
from lowtide.store.db import Store
from lowtide.store.money import from_pico
from lowtide.store.queries import get_job
from lowtide.store.schema import jobs, serve_batches

router = APIRouter(include_in_schema=False)
ASSETS = Path(__file__).with_name("dashboard_assets")
COOKIE = "lowtide_dashboard"
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


# Serve's API jobs ------------------------------------------------------------------------
ApiJobs = Annotated[bool | None, Query(description="list serve's own API batch jobs (default: yes under lowtide serve, no under lowtide dashboard)")]


def serve_job(dialect: str) -> Any:
    """True for a job `lowtide serve` runs one of its API batches as: named as the batch
    (`batch_…`, `msgbatch_…`, `lt…`), or the batch id then `.1`, `.2`, … for its other
    models (server/intake.py). A batch id holds no dot. Correlates with `jobs`."""
    name = jobs.c.name
    dot = func.instr(name, ".") if dialect == "sqlite" else func.strpos(name, ".")
    return exists().where(serve_batches.c.id == case((dot > 0, func.substr(name, 1, dot - 1)), else_=name))


def hiding(request: Request, api_jobs: bool | None) -> Select | None:
    """The ids of the jobs shown when serve's API jobs are left out; None: every job."""
    if api_jobs if api_jobs is not None else getattr(request.app.state, "api_jobs", True):
        return None
    store: Store = request.app.state.server.store
    return select(jobs.c.id).where(~serve_job(store.engine.dialect.name))


def hidden(conn: Any, shown: Select | None, name: str) -> Response | None:
    """The 404 for a job by name that is one of serve's API jobs left out, or None."""
    if shown is None or not conn.execute(select(jobs.c.id).where(jobs.c.name == name, serve_job(conn.dialect.name))).first():
        return None
    return JSONResponse({"error": f"job {name!r} is one of lowtide serve's API batches, not listed here; add ?api_jobs=true to see it"},
                        status_code=404)  # fmt: skip


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
def list_jobs(request: Request, api_jobs: ApiJobs = None) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    shown = hiding(request, api_jobs)
    # A finished job's figures are read once, not on every refresh (engine/job_figures.py).
    figures = kept_of(request).figures.read(store, shown)
    where = [] if shown is None else [jobs.c.id.in_(shown)]
    with store.read() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.name, jobs.c.state, jobs.c.route, jobs.c.created_at, jobs.c.updated_at, jobs.c.finished_at)
            .where(*where)
            .order_by(jobs.c.id.desc())
            .limit(MAX_JOBS)
        ).all()
        names = dict(conn.execute(select(jobs.c.id, jobs.c.name)).all())
        batches = dict(conn.execute(select(serve_batches.c.status, func.count()).group_by(serve_batches.c.status)).all())
        every = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
        job_count = every if shown is None else conn.execute(select(func.count()).select_from(jobs).where(*where)).scalar_one()
    report = summed((row for f in figures.values() for row in f.ledger), "job", {j: (n, None) for j, n in names.items()})
    costs = {g.group: g for g in report.groups}
    reasons = added_reasons(figures.values())
    failures = overview.Failures(sum(reasons.values()), reasons, report.total.failures, report.total.billed_failures)
    listed = []
    for row in rows:
        p = overview.Progress.of(figures[row.id].counts) if row.id in figures else overview.Progress()
        listed.append({
            "name": row.name, "state": row.state, "route": row.route,
            "created_at": row.created_at, "updated_at": row.updated_at, "finished_at": row.finished_at,
            "total": p.total, "done": p.done, "failed": p.failed, "progress": p.as_dict(), "counts": _counts(p),
            "cost": (costs.get(row.name) or Figures(row.name)).as_dict(),
        })  # fmt: skip
    return _json({
        "generated_at": time.time(), "job_count": job_count, "jobs": listed,
        "total": report.total.as_dict(), "failures": failures.by_reason, "failure_figures": failures.as_dict(),
        "api_batches": batches, "api_jobs": shown is None, "api_jobs_hidden": every - job_count,
    })  # fmt: skip


@router.get("/dashboard/api/jobs/{name:path}")
def job_detail(request: Request, name: str, api_jobs: ApiJobs = None) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    with store.read() as conn:
        if (gone := hidden(conn, hiding(request, api_jobs), name)) is not None:
            return gone
    try:
        status = job_status(store, name, events=20)
        report = cost_report(store, job=name, by="route")
        with store.read() as conn:
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
           limit: Annotated[int, Query(ge=1, le=overview.MAX_PAGE)] = 50, api_jobs: ApiJobs = None) -> Response:  # fmt: skip
    """One page of a job's failed requests, filtered by reason and by text."""
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    try:
        with store.read() as conn:
            if (gone := hidden(conn, hiding(request, api_jobs), job)) is not None:
                return gone
            found = overview.failed_rows(conn, get_job(conn, job).id, reason=reason or None, search=q or None, offset=offset, limit=limit)
    except JobNotFoundError as err:
        return JSONResponse({"error": str(err)}, status_code=404)
    return _json({"job": job, "reason": reason or None, "q": q or None} | asdict(found))


@router.get("/dashboard/api/answers")
def answers(request: Request, job: str, q: str | None = None, offset: Annotated[int, Query(ge=0)] = 0,
            limit: Annotated[int, Query(ge=1, le=overview.MAX_PAGE)] = 20, api_jobs: ApiJobs = None) -> Response:  # fmt: skip
    """One page of a job's succeeded requests, each answer with its request's text (read a
    page at a time); `q` keeps those whose custom_id or answer contains it (any case)."""
    if not viewer_allowed(request):
        return refused(request)
    store: Store = request.app.state.server.store
    try:
        with store.read() as conn:
            if (gone := hidden(conn, hiding(request, api_jobs), job)) is not None:
                return gone
            found = overview.answer_rows(conn, get_job(conn, job).id, search=q, offset=offset, limit=limit)
    except JobNotFoundError as err:
        return JSONResponse({"error": str(err)}, status_code=404)
    return _json({"job": job, "q": q or None, "max_chars": overview.MAX_ANSWER} | asdict(found))


@router.get("/dashboard/api/series")
def series(request: Request, job: str | None = None, bucket: str = "auto", api_jobs: ApiJobs = None) -> Response:
    """Per time bucket: attempts, failures, known cost and its real-time equivalent (as
    `cost_report` counts them), the saving of the succeeded attempts (as the page's saving),
    and attempts of unknown cost. Of every job: summed from each job's own, a settled job's
    read once (engine/job_figures.py)."""
    if not viewer_allowed(request):
        return refused(request)
    if bucket != "auto" and bucket not in BUCKETS:
        return JSONResponse({"error": f"bucket {bucket!r}: use auto, {', '.join(BUCKETS)}"}, status_code=400)
    store: Store = request.app.state.server.store
    shown = hiding(request, api_jobs)
    kept = kept_of(request)
    if job is None:
        if bucket == "auto":
            seen = [span for span in kept.spans.read(store, shown).values() if span[0] is not None]
            bucket = _bucket(min((s[0] for s in seen), default=None), max((s[1] for s in seen), default=None))
        seconds = BUCKETS[bucket]
        summed_slots: dict[int, list[int]] = {}
        for rows in kept.series(seconds).read(store, shown).values():
            for slot, *figures in rows:
                into = summed_slots.setdefault(slot, [0] * len(figures))
                for i, n in enumerate(figures):
                    into[i] += n
        rows = [(slot, *summed_slots[slot]) for slot in sorted(summed_slots)]
    else:
        with store.read() as conn:
            if (gone := hidden(conn, shown, job)) is not None:
                return gone
            job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == job)).scalar()
            if job_id is None:
                return JSONResponse({"error": f'no job named "{job}"'}, status_code=404)
            if bucket == "auto":
                bucket = _bucket(*spans(conn, [job_id]).get(job_id, (None, None)))
            seconds = BUCKETS[bucket]
            rows = slots(conn, seconds, [job_id]).get(job_id, [])
    points = [
        {
            "t": int(slot) * seconds, "attempts": n, "failures": failures,
            "cost_usd": _money(from_pico(cost)), "realtime_usd": _money(from_pico(realtime)),
            "saving_usd": _money(from_pico(saving)), "unknown_cost_attempts": unknown,
        }  # fmt: skip
        for slot, n, failures, cost, realtime, saving, unknown in rows
    ]
    return _json({"job": job, "bucket": bucket, "seconds": seconds, "points": points})


def _bucket(first: float | None, last: float | None) -> str:
    """The bucket whose points fit the span of the attempts."""
    span = (last - first) if first is not None and last is not None else 0.0
    return "minute" if span <= 3 * 3600 else "hour" if span <= 7 * 86400 else "day"


# Helpers -------------------------------------------------------------------------------
def _counts(p: overview.Progress) -> dict[str, int]:
    """Requests by state, the states with none left out."""
    by_state = {"succeeded": p.succeeded, "failed": p.failed, "cancelled": p.cancelled, "pending": p.waiting, "dispatched": p.in_flight}
    return {state: n for state, n in by_state.items() if n}


def _money(usd: Any) -> str | None:
    return None if usd is None else str(usd)


def _json(data: dict[str, Any]) -> JSONResponse:
    return JSONResponse(data, headers={"cache-control": "no-store"})
