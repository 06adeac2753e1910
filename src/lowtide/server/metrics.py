"""Prometheus metrics of `lowtide serve` at `GET /metrics` (text exposition format 0.0.4),
read from the store at each scrape with a few GROUP BY queries: every job of the store, not
only API batches.

    lowtide_jobs{state}                               gauge    jobs by state
    lowtide_requests{job, route, state}               gauge    requests by state and the route
                                                               they last ran on (the job's if none)
    lowtide_attempts_total{job}                       counter  attempts recorded in the ledger
    lowtide_tokens_total{job, kind}                   counter  input | cached_input | cache_write |
                                                               output | reasoning (as `lowtide report`)
    lowtide_cost_usd_total{job, route}                counter  the known cost of the attempts
    lowtide_cost_unknown_attempts_total{job}          counter  attempts whose cost is unknown (never 0 USD)
    lowtide_realtime_equivalent_usd_total{job}        counter  the same attempts at real-time prices
    lowtide_savings_usd_total{job}                    counter  real-time equivalent − cost
    lowtide_batches{job, route, phase}                gauge    live dispatches by the provider's phase
    lowtide_poll_errors_total{job}                    counter  failed polls of provider batches
    lowtide_api_batches{api, status}                  gauge    the server's own API batches by status

Money is in USD, written as the exact decimal the ledger sums to. With API keys configured a
scrape needs one (`Authorization: Bearer KEY`, or `x-api-key`); see `server/dashboard.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from sqlalchemy import func, select

from lowtide.engine.report import summed
from lowtide.server.dashboard import refused, viewer_allowed
from lowtide.server.kept import Kept, kept_of
from lowtide.store.db import Store
from lowtide.store.money import from_pico
from lowtide.store.queries import LIVE_DISPATCH_STATES
from lowtide.store.schema import dispatches, jobs, serve_batches

router = APIRouter(include_in_schema=False)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOKEN_KINDS = ("input", "cached_input", "cache_write", "output", "reasoning")

BACKSLASH, NEWLINE, ESCAPED_NEWLINE = "\\", "\n", "\\n"
Sample = tuple[dict[str, str], int | float | Decimal]


class Exposition:
    """Prometheus text exposition: `family(...)` per metric, then `text()`."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: Iterable[Sample]) -> None:
        self._lines.append(f"# HELP {name} {help_.replace(BACKSLASH, BACKSLASH * 2).replace(NEWLINE, ESCAPED_NEWLINE)}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in sorted(samples, key=lambda s: tuple(s[0].values())):
            inner = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
            self._lines.append(f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def escape(value: str) -> str:
    """A label value: backslash, newline and double quote escaped."""
    return value.replace(BACKSLASH, BACKSLASH * 2).replace(NEWLINE, ESCAPED_NEWLINE).replace('"', '\\"')


def _number(value: int | float | Decimal) -> str:
    if isinstance(value, Decimal):
        return str(value)  # exact; "1E-9" parses as a float too
    return str(value) if isinstance(value, int) else repr(float(value))


@router.get("/metrics")
def metrics(request: Request) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    return PlainTextResponse(render(request.app.state.server.store, kept_of(request)), media_type=CONTENT_TYPE)


def render(store: Store, kept: Kept | None = None) -> str:
    """The exposition; `kept`: a long-lived server's, whose settled jobs are read once
    (engine/job_figures.py), not on every scrape (2.2-2.4 s at a hundred jobs of 10,000
    requests, bench/nights.py)."""
    kept = kept or Kept()
    figures = kept.figures.read(store)
    by_route_state = kept.routes_states.read(store)
    poll_errors = kept.poll_errors.read(store)
    d = dispatches.c
    with store.begin() as conn:
        names = dict(conn.execute(select(jobs.c.id, jobs.c.name)).all())
        job_states = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
        phase = func.coalesce(d.phase, d.state)
        live = conn.execute(
            select(d.job_id, d.route, phase, func.count())
            .where(d.state.in_(LIVE_DISPATCH_STATES), d.cut_at.is_(None))
            .group_by(d.job_id, d.route, phase)
        ).all()
        api_batches = conn.execute(
            select(serve_batches.c.api, serve_batches.c.status, func.count())
            .group_by(serve_batches.c.api, serve_batches.c.status)
        ).all()
    # Tokens, cost and savings exactly as `lowtide report` sums them.
    report = summed((row for f in figures.values() for row in f.ledger), "job", {j: (n, None) for j, n in names.items()})
    by_state = sorted((j, route, state, n) for j, rows in by_route_state.items() for route, state, n in rows)
    costs: dict[tuple[int, str], int] = {}  # known cost by job and route (an unknown one is counted apart)
    for j, f in figures.items():
        for row in f.ledger:
            if row.cost is not None:
                costs[(j, row.route)] = costs.get((j, row.route), 0) + int(row.cost)

    def job(job_id: int | None) -> str:
        return names.get(job_id, str(job_id))

    groups = report.groups
    out = Exposition()
    out.family("lowtide_jobs", "gauge", "Jobs by state.", [({"state": s}, n) for s, n in job_states])
    out.family("lowtide_requests", "gauge", "Requests by state and the route they last ran on (the job's route if none yet).",
               (({"job": job(j), "route": rt, "state": s}, n) for j, rt, s, n in by_state))  # fmt: skip
    out.family("lowtide_attempts_total", "counter", "Attempts recorded in the ledger.",
               [({"job": g.group}, g.attempts) for g in groups])  # fmt: skip
    out.family("lowtide_tokens_total", "counter", "Tokens of the attempts by kind; input counts every prompt token (lowtide report).",
               [({"job": g.group, "kind": k}, getattr(g, f"{k}_tokens")) for g in groups for k in TOKEN_KINDS])  # fmt: skip
    out.family("lowtide_cost_usd_total", "counter", "USD: the known cost of the attempts (unknown costs are counted apart).",
               (({"job": job(j), "route": rt}, from_pico(c)) for (j, rt), c in sorted(costs.items())))  # fmt: skip
    out.family("lowtide_cost_unknown_attempts_total", "counter", "Billed attempts whose cost is unknown.",
               [({"job": g.group}, g.unknown) for g in groups])  # fmt: skip
    out.family("lowtide_realtime_equivalent_usd_total", "counter",
               "USD: the attempts of known cost at the same provider's real-time prices.",
               [({"job": g.group}, g.realtime_usd) for g in groups])  # fmt: skip
    out.family("lowtide_savings_usd_total", "counter", "USD: real-time equivalent minus cost.",
               [({"job": g.group}, g.saving_usd) for g in groups])  # fmt: skip
    out.family("lowtide_batches", "gauge", "Live dispatches (provider batches, direct groups) by the provider's phase.",
               (({"job": job(j), "route": rt, "phase": p}, n) for j, rt, p, n in live))  # fmt: skip
    out.family("lowtide_poll_errors_total", "counter", "Polls of a provider batch that failed.",
               (({"job": job(j)}, n) for j, n in sorted(poll_errors.items()) if n))  # fmt: skip
    out.family("lowtide_api_batches", "gauge", "Batches of this server's Batch APIs by status.",
               (({"api": api, "status": s}, n) for api, s, n in api_batches))  # fmt: skip
    return out.text()
