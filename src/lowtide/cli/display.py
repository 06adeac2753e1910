"""Rich renderings shared by commands: progress of a running job, status tables."""

from __future__ import annotations

from decimal import Decimal

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lowtide.core.states import RequestState
from lowtide.engine.control import JobStatus

DONE = (RequestState.SUCCEEDED, RequestState.FAILED, RequestState.CANCELLED)


def job_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        transient=False,
    )


def progress_detail(status: JobStatus) -> str:
    """Item counts, and apart from them the provider phase of live batches."""
    parts = [f"[green]{status.count(RequestState.SUCCEEDED)} ok[/]"]
    if status.count(RequestState.FAILED):
        parts.append(f"[red]{status.count(RequestState.FAILED)} failed[/]")
    waiting = status.count(RequestState.PENDING)
    if waiting:
        parts.append(f"{waiting} waiting")
    if status.phases:
        phases = ", ".join(f"{n} {p}" for p, n in sorted(status.phases.items()))
        parts.append(f"[cyan]batches: {phases}[/]")
    return "  ".join(parts)


def done_count(status: JobStatus) -> int:
    return sum(status.count(s) for s in DONE)


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


def status_table(statuses: list[JobStatus]) -> Table:
    table = Table(title="jobs")
    for col in ("job", "state", "route", "total", "succeeded", "failed", "cancelled", "in flight", "batches", "spent"):
        table.add_column(col, justify="right" if col not in ("job", "state", "route", "batches") else "left")
    for s in statuses:
        in_flight = s.count(RequestState.PENDING) + s.count(RequestState.DISPATCHED)
        phases = ", ".join(f"{n} {p}" for p, n in sorted(s.phases.items())) or "-"
        table.add_row(
            s.name, s.state, s.route, str(s.total), str(s.count(RequestState.SUCCEEDED)),
            str(s.count(RequestState.FAILED)), str(s.count(RequestState.CANCELLED)), str(in_flight), phases, spent(s),
        )  # fmt: skip
    return table


def placement_table(status: JobStatus) -> Table:
    """Where the job's requests ran, and why they moved to the fallback route."""
    table = Table(title="where requests ran")
    for col in ("route", "why there", "state", "requests"):
        table.add_column(col, justify="right" if col == "requests" else "left")
    for route, why, state, n in status.placement:
        table.add_row(route, why or "the job's route" if route != "-" else "not sent yet", state, str(n))
    return table
