"""The progress of a running job, for both faces (the CLI and the Python API): item counts,
and apart from them the provider phase of its batches (validating / in_progress /
finalizing), batches done of total and an ETA from the measured rate. While a job runs, the
display reads `progress_status`, a few indexed counts, at most once a second (`watch`), not
`job_status`, whose scans over the whole job cost more than the run's own bookkeeping at
100,000 requests. On a terminal it is a
Rich progress display; in a pipe, a log file or a notebook it is a plain line now and then
(and whenever the batches change phase): Rich's live display needs ipywidgets in a notebook,
and without them prints a warning and an empty box in every cell. A run from Python ends
with one summary line: what was done, what failed, and what it cost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from lowtide.core.states import DispatchState, RequestState
from lowtide.engine.control import SENT_DISPATCH_STATES, JobStatus
from lowtide.store.db import Store
from lowtide.store.queries import dispatch_phases, get_job, request_counts
from lowtide.store.schema import dispatches, requests

PLAIN_EVERY = 30.0  # seconds between plain lines when nothing changes phase
REFRESH = 1.0  # seconds between reads of a running job's counts
READ_SHARE = 0.05  # ... or longer, so that reading them takes at most this share of the run
ENDED_DISPATCHES = (DispatchState.ENDED, DispatchState.FAILED, DispatchState.CANCELLED, DispatchState.ABANDONED)
DONE = (RequestState.SUCCEEDED, RequestState.FAILED, RequestState.CANCELLED)


def progress_status(store: Store, name: str) -> JobStatus:
    """What a progress display shows of a job: its state, requests by state, requests in
    flight, batches by state and live ones by phase. Counted on indexes (requests by job and
    state; dispatched requests through their dispatch); the rest of `job_status` (placement,
    tiers, failures, tokens and cost, events) is left empty: it is read once, at the end."""
    with store.read() as conn:
        job = get_job(conn, name)
        sent = conn.execute(
            select(dispatches.c.state, func.count())
            .select_from(requests.join(dispatches, requests.c.dispatch_id == dispatches.c.id))
            .where(requests.c.job_id == job.id, requests.c.state == RequestState.DISPATCHED.value,
                   dispatches.c.state.in_(SENT_DISPATCH_STATES))
            .group_by(dispatches.c.state)
        ).all()  # fmt: skip
        by_state = conn.execute(
            select(dispatches.c.state, func.count()).where(dispatches.c.job_id == job.id).group_by(dispatches.c.state)
        ).all()
        return JobStatus(name=job.name, state=job.state, route=job.route, counts=request_counts(conn, job.id),
                         phases=dispatch_phases(conn, job.id), dispatched=dict(sent), dispatches=dict(by_state))  # fmt: skip


def done_count(status: JobStatus) -> int:
    return sum(status.count(s) for s in DONE)


def progress_detail(status: JobStatus) -> str:
    """Item counts, and apart from them the provider phase of live batches (Rich markup)."""
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


def counts_line(s: JobStatus) -> str:
    """`1,000 of 1,200 done (990 ok, 10 failed)`, plain text."""
    counts = f"{s.count(RequestState.SUCCEEDED):,} ok"
    if s.count(RequestState.FAILED):
        counts += f", {s.count(RequestState.FAILED):,} failed"
    if s.count(RequestState.CANCELLED):
        counts += f", {s.count(RequestState.CANCELLED):,} cancelled"
    return f"{done_count(s):,} of {s.total:,} done ({counts})"


def summary_line(label: str, s: JobStatus) -> str:
    """The line a run ends with: its state, counts, spend and the commonest failure."""
    spent = f"spent ${s.spent_usd:,.6f}".rstrip("0").rstrip(".") if s.spent_usd else "spent $0"
    if s.unknown_costs:
        spent += f" (+ {s.unknown_costs:,} attempt(s) of unknown cost)"
    line = f"{label}: {s.state}, {counts_line(s)}; {spent}"
    if s.failures:
        reason, n = max(s.failures.items(), key=lambda kv: kv[1])
        line += f"; most failures: {reason} ({n:,})"
    return line


def batches_line(s: JobStatus) -> str:
    """`batches 3 of 20 done (2 validating, 15 in_progress)`, or "" for a job without any."""
    total = sum(s.dispatches.values())
    if not total:
        return ""
    done = sum(s.dispatches.get(d.value, 0) for d in ENDED_DISPATCHES)
    phases = ", ".join(f"{n} {p}" for p, n in sorted(s.phases.items()))
    return f"batches {done:,} of {total:,} done" + (f" ({phases})" if phases else "")


class Eta:
    """Time left from the rate measured since the first update that saw progress."""

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.start: tuple[float, int] | None = None

    def __call__(self, done: int, total: int) -> str:
        t = self.now()
        if self.start is None:
            self.start = (t, done)
            return ""
        t0, done0 = self.start
        if done >= total or done <= done0 or t <= t0:
            return ""
        left = (total - done) * (t - t0) / (done - done0)
        return f"ETA {_duration(left)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class JobProgress:
    """`with JobProgress(console, "run tickets") as p: p.update(status)`."""

    def __init__(self, console: Console, label: str, every: float = PLAIN_EVERY, now: Callable[[], float] = time.monotonic,
                 summary: bool = False):  # fmt: skip
        """`summary`: end with `summary_line` (the CLI prints its status table instead)."""
        self.console = console
        self.summary = summary
        self.label = label
        self.every = every
        self.now = now
        self.eta = Eta(now)
        self.live = console.is_terminal and not console.is_dumb_terminal and not console.is_jupyter
        self.progress: Progress | None = None
        self.last_line: tuple[float, str] | None = None
        self.last: JobStatus | None = None

    def __enter__(self) -> JobProgress:
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=self.console,
                auto_refresh=False,  # drawn when the counts change (`update`), not 10 times a second by a thread
            )  # fmt: skip
            self.progress.__enter__()
            self.requests = self.progress.add_task(self.label, total=None, detail="")
            self.batches = self.progress.add_task("  batches", total=None, detail="", visible=False)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(exc_type, *exc)
        if self.summary and exc_type is None and self.last is not None:
            self.console.print(summary_line(self.label, self.last), markup=False, highlight=False, soft_wrap=True)

    async def watch(self, run: Awaitable[JobStatus], store: Store, name: str, refresh: float = REFRESH) -> JobStatus:
        """Await `run` (driving job `name` to its end: `runner.drive`), showing its progress
        from `progress_status` meanwhile; shows and returns the final status `run` returns."""
        follow = asyncio.ensure_future(self._follow(store, name, refresh))
        try:
            status = await run
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        self.update(status)
        return status

    async def _follow(self, store: Store, name: str, refresh: float) -> None:
        wait = 0.0  # the first look at once: the bar has its total from the start
        while True:
            await asyncio.sleep(wait)
            started = time.perf_counter()
            self.update(progress_status(store, name))
            wait = max(refresh, (time.perf_counter() - started) / READ_SHARE)

    def update(self, s: JobStatus) -> None:
        self.last = s
        done = done_count(s)
        eta = self.eta(done, s.total)
        if self.progress is not None:
            self.progress.update(self.requests, total=s.total, completed=done, detail=_join(progress_detail(s), eta))
            total = sum(s.dispatches.values())
            if total:
                ended = sum(s.dispatches.get(d.value, 0) for d in ENDED_DISPATCHES)
                phases = ", ".join(f"{n} {p}" for p, n in sorted(s.phases.items()))
                self.progress.update(self.batches, total=total, completed=ended, detail=f"[cyan]{phases}[/]", visible=True)
            self.progress.refresh()
            return
        self.plain(s, done, eta)

    def plain(self, s: JobStatus, done: int, eta: str) -> None:
        """One line, when the phases changed or `every` seconds went by since the last."""
        key = batches_line(s)
        t = self.now()
        if self.last_line is not None and self.last_line[1] == key and t - self.last_line[0] < self.every and done < s.total:
            return
        self.last_line = (t, key)
        line = f"{self.label}: {counts_line(s)}, {s.in_flight:,} in flight, {s.queued:,} queued"
        self.console.print(_join(line, key, eta, sep="; "), markup=False, highlight=False, soft_wrap=True)


def _join(*parts: str, sep: str = "  ") -> str:
    return sep.join(p for p in parts if p)
