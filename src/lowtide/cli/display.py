"""Rich renderings shared by commands: progress of a running job, status tables."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lowtide.cli.tables import Col, fitted_table
from lowtide.core.states import RequestState
from lowtide.engine.control import JobStatus
from lowtide.engine.progress import DONE, done_count, progress_detail  # noqa: F401  (the commands' names for them)


def job_progress(console: Console | None = None, disable: bool = False) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        transient=False,
        console=console,
        disable=disable,
    )


def money(usd: Decimal) -> str:
    if usd == 0:
        return "$0"
    if abs(usd) < Decimal("0.01"):
        return f"${usd:.6f}"
    return f"${usd:,.4f}" if abs(usd) < 1 else f"${usd:,.2f}"


def spent(status: JobStatus) -> str:
    """The job's known cost, "+ N unknown" where some is not known, and "/ budget"."""
    text = money(status.spent_usd)
    if status.unknown_costs:
        text += f" + {status.unknown_costs} unknown"
    if status.budget_usd is not None:
        text += f" / {money(status.budget_usd)}"
    return text


STATUS_COLUMNS = [
    Col("job"), Col("state"), Col("route", drop=3), Col("total", figure=True), Col("succeeded", figure=True),
    Col("failed", figure=True), Col("cancelled", figure=True, drop=1), Col("queued", figure=True, drop=2),
    Col("in flight", figure=True), Col("batches", drop=4), Col("spent", figure=True),
]  # fmt: skip


def status_table(statuses: list[JobStatus], console: Console) -> Table:
    rows = []
    for s in statuses:
        phases = ", ".join(f"{n} {p}" for p, n in sorted(s.phases.items())) or "-"
        rows.append([
            s.name, s.state, s.route, f"{s.total:,}", f"{s.count(RequestState.SUCCEEDED):,}",
            f"{s.count(RequestState.FAILED):,}", f"{s.count(RequestState.CANCELLED):,}", f"{s.queued:,}",
            f"{s.in_flight:,}", phases, spent(s),
        ])  # fmt: skip
    return fitted_table(console, STATUS_COLUMNS, rows, title="jobs")


def placement_table(status: JobStatus, console: Console) -> Table:
    """Where the job's requests ran, and why they moved to the fallback route."""
    rows = [
        [route, why or "the job's route" if route != "-" else "not sent yet", state, f"{n:,}"]
        for route, why, state, n in status.placement
    ]
    cols = [Col("route"), Col("why there"), Col("state"), Col("requests", figure=True)]
    return fitted_table(console, cols, rows, title="where requests ran")


def tiers_table(status: JobStatus, console: Console) -> Table:
    """A `route: auto` job's requests by the tier of its chain they are on (docs/routing.md)."""
    rows = [[tier, state, f"{n:,}"] for tier, state, n in status.tiers]
    cols = [Col("tier"), Col("state"), Col("requests", figure=True)]
    return fitted_table(console, cols, rows, title="requests by tier")


def status_json(s: JobStatus) -> dict[str, Any]:
    """The documented `--json` shape of one job's status (docs/cli.md); amounts as strings."""
    return {
        "job": s.name, "state": s.state, "route": s.route, "total": s.total,
        "requests": {state.value: s.count(state) for state in RequestState},
        "queued": s.queued, "in_flight": s.in_flight,
        "batches": {"by_state": dict(sorted(s.dispatches.items())), "live_by_phase": dict(sorted(s.phases.items()))},
        "failures": dict(sorted(s.failures.items())),
        "tokens": {k: s.tokens.get(k, 0) for k in ("input_tokens", "output_tokens", "attempts")},
        "spent_usd": str(s.spent_usd), "unknown_costs": s.unknown_costs,
        "budget_usd": None if s.budget_usd is None else str(s.budget_usd), "reserved_usd": str(s.reserved_usd),
        "placement": [{"route": r, "why": why, "state": st, "requests": n} for r, why, st, n in s.placement],
        "tiers": [{"tier": t, "state": st, "requests": n} for t, st, n in s.tiers],
        "events": list(s.events),
        "notifications": dict(sorted(s.notifications.items())),
        "done": s.done,
    }  # fmt: skip
