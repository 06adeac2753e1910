"""What a page or a scrape that covers every job reads of each (the dashboard's jobs list and
series, `/metrics`), kept between reads for the jobs that can no longer change.

Read whole, each refresh read every request and attempt of the store: 1.4-2.4 s at a hundred
finished jobs of 10,000 requests (SQLite), ten times that after a hundred nights of 100,000,
every 2 s while a page is open (bench/nights.py). A *settled* job (finished or cancelled,
none of its dispatches live or watched for a late bill) changes only after it moves to
`active` (a retry, new rows, a resubmission), and every move of a job counts in its row
(`jobs.moves`, store/transitions.py `move_job`). What is read of it is kept under that count
(and its route, which a resubmission may change with nothing to move), read before and after
(two reads that agree: nothing moved in between), and read again once they differ. A deleted
job is forgotten; a job whose id came back (SQLite reuses the highest) differs by name or
`created_at`. Any other job is read on each refresh, by its id alone. The simulation checks,
after steps taken as a page refreshes, that what is kept equals a fresh read
(tests/sim/invariants.py `figures_current`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Select, exists, func, or_, select

from lowtide.core.states import TERMINAL_DISPATCH_STATES, JobState, RequestState
from lowtide.engine.report import ledger_rows
from lowtide.store.bulk import among
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, jobs, requests

SETTLED = (JobState.FINISHED.value, JobState.CANCELLED.value)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobFigures:
    counts: dict[str, int]  # requests by state
    ledger: tuple[Any, ...]  # the job's `report.ledger_rows`
    reasons: dict[str, int]  # failed requests by error code ("unknown" where none)


def job_keys(conn: Connection) -> dict[int, tuple]:
    """job id -> what a settled job's figures are kept under (the module doc), its last
    item whether it is settled."""
    d = dispatches.c
    busy = exists().where(d.job_id == jobs.c.id, or_(d.state.not_in([s.value for s in TERMINAL_DISPATCH_STATES]),
                                                     d.watch_until.is_not(None)))  # fmt: skip
    stmt = select(jobs.c.id, jobs.c.name, jobs.c.created_at, jobs.c.moves, jobs.c.route, jobs.c.state, busy)
    return {row[0]: (*row[1:-1], row.state in SETTLED and not row[-1]) for row in conn.execute(stmt)}


def read_figures(conn: Connection, ids: list[int] | None) -> dict[int, JobFigures]:
    """The figures of the jobs `ids` (None: every job), read now."""
    r = requests.c
    of_requests = [] if ids is None else [among(conn, r.job_id, ids)]
    counts: dict[int, dict[str, int]] = {}
    for job_id, state, n in conn.execute(select(r.job_id, r.state, func.count()).where(*of_requests).group_by(r.job_id, r.state)):
        counts.setdefault(job_id, {})[state] = n
    reasons: dict[int, dict[str, int]] = {}
    failed = select(r.job_id, r.error_code, func.count()).where(r.state == RequestState.FAILED.value, *of_requests)
    for job_id, code, n in conn.execute(failed.group_by(r.job_id, r.error_code)):
        by_code = reasons.setdefault(job_id, {})
        by_code[code or "unknown"] = by_code.get(code or "unknown", 0) + n
    ledger: dict[int, list[Any]] = {}
    for row in ledger_rows(conn, *([] if ids is None else [among(conn, attempts.c.job_id, ids)])):
        ledger.setdefault(row.job_id, []).append(row)
    wanted = set(counts) | set(ledger) if ids is None else ids
    return {j: JobFigures(counts.get(j, {}), tuple(ledger.get(j, ())), reasons.get(j, {})) for j in wanted}


class KeptPerJob(Generic[T]):
    """What `reader` (conn, job ids or None for every job -> job id -> value) reads of each
    job, kept for settled jobs across reads: one per long-lived process (the dashboard)."""

    def __init__(self, reader: Callable[[Connection, list[int] | None], dict[int, T]], empty: T) -> None:
        self.reader, self.empty = reader, empty
        self.kept: dict[int, tuple[tuple, T]] = {}
        self.lock = threading.Lock()  # the server's threads read at once

    def read(self, store: Store, shown: Select | None = None) -> dict[int, T]:
        """job id -> value, of the jobs whose ids `shown` selects (None: every job); a job
        the reader found nothing of is left out."""
        with store.read() as conn:
            keys = job_keys(conn)
            wanted = keys if shown is None else {j: keys[j] for j in conn.scalars(shown) if j in keys}
            stale = [j for j, key in wanted.items() if self.kept.get(j, (None,))[0] != key]
            fresh: dict[int, T] = {}
            again = keys
            if stale:
                fresh = self.reader(conn, None if len(stale) == len(keys) else stale)
                again = job_keys(conn)
        with self.lock:
            for job_id in stale:
                key = keys[job_id]
                if key[-1] and again.get(job_id) == key:  # settled, and nothing moved while it was read
                    self.kept[job_id] = (key, fresh.get(job_id, self.empty))
                else:
                    self.kept.pop(job_id, None)
            for gone in self.kept.keys() - keys.keys():  # deleted
                del self.kept[gone]
            kept = {j: self.kept[j][1] for j in wanted if j in self.kept and self.kept[j][0] == wanted[j]}
        return {j: fresh[j] if j in fresh else kept[j] for j in wanted if j in fresh or j in kept}


class FiguresCache(KeptPerJob[JobFigures]):
    """Settled jobs' `read_figures`, kept across reads."""

    def __init__(self) -> None:
        super().__init__(read_figures, JobFigures({}, (), {}))


def added_reasons(figures: Iterable[JobFigures]) -> dict[str, int]:
    """Failed requests by reason over `figures`, the commonest first."""
    total: dict[str, int] = {}
    for f in figures:
        for code, n in f.reasons.items():
            total[code] = total.get(code, 0) + n
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))
