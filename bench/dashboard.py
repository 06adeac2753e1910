"""What one dashboard refresh reads from the store, on a job whose every row failed.

    .venv/bin/python bench/dashboard.py                 # 100,000 rows (200,000 failed attempts)
    .venv/bin/python bench/dashboard.py --n 20000 --db postgresql://postgres@127.0.0.1/test

The job runs on `echo` with a schema its answers do not meet (`answer: message`), so every
row fails `invalid_output` after its one repair. Then each read behind `/dashboard/api/...`
is timed (the median of --repeat runs): the jobs list, one job's page (status, cost report,
progress, failures, ETA, estimate — first and cached — and the batch timeline) and pages of
its failed rows (first, last, a text search). Prints milliseconds, ms per 1,000 rows, and
the process's peak RSS. Runs in a temporary folder (SQLite by default), removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lowtide.core.clock import SystemClock
from lowtide.core.spec import build_spec
from lowtide.engine import overview
from lowtide.engine.control import job_status
from lowtide.engine.job_figures import FiguresCache
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_store import ClientStore  # noqa: E402  (a fresh PostgreSQL schema per run, dropped after)
from lowtide.store.queries import get_job

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def build(folder: Path, n: int, db: str | None) -> Store:
    source = folder / "rows.csv"
    with source.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["ticket_id", "body"])
        out.writerows([f"t{i:07d}", f"customer {i} writes about an invoice"] for i in range(n))
    spec = build_spec({
        "name": "allbad", "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"user": "Ticket: {{ body }}"}, "model": "test-model", "route": "echo",
        "route_options": {"answer": "message"}, "response_schema": SCHEMA, "params": {"max_tokens": 32},
    })  # fmt: skip
    store = Store(db or f"sqlite:///{folder / 'bench.db'}")
    load_job(store, spec, SystemClock())

    async def go():
        async with Engine(store) as engine:
            await drive(engine, "allbad")

    asyncio.run(go())
    return store


def timed(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--db", help="a store URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lowtide-bench-dash-"))
    try:
        start = time.perf_counter()
        place = ClientStore(folder, args.db)  # PostgreSQL: a fresh schema, dropped at the end
        store = build(folder, args.n, place.url if args.db else None)
        print(f"built: {args.n:,} rows, all failed, in {time.perf_counter() - start:.1f} s")
        with store.begin() as conn:
            job_id = get_job(conn, "allbad").id

        def read(fn):
            def run():
                with store.begin() as conn:
                    return fn(conn)
            return run

        def list_jobs():  # as a server just started reads every job (a finished one is kept after: bench/nights.py)
            FiguresCache().read(store)

        def detail():
            job_status(store, "allbad", events=20)
            cost_report(store, job="allbad", by="route")
            read(lambda c: (overview.failures(c, job_id), overview.eta(c, job_id, overview.Progress.of({})),
                            overview.job_estimate(c, job_id), overview.batch_timeline(c, job_id)))()  # fmt: skip

        overview._estimates.clear()
        first_estimate = timed(read(lambda c: overview.job_estimate(c, job_id)), 1)
        rows = [
            ("jobs list", timed(list_jobs, args.repeat)),
            ("job page (estimate cached)", timed(detail, args.repeat)),
            ("job estimate, first", first_estimate),
            ("failed rows, first page", timed(read(lambda c: overview.failed_rows(c, job_id)), args.repeat)),
            ("failed rows, last page", timed(read(lambda c: overview.failed_rows(c, job_id, offset=args.n - 50)), args.repeat)),
            ("failed rows, text search", timed(read(lambda c: overview.failed_rows(c, job_id, search="t00001")), args.repeat)),
        ]
        for name, ms in rows:
            print(f"{name:30s} {ms:9.1f} ms  {ms * 1000 / args.n:7.2f} ms per 1,000 rows")
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        store.close()
    finally:
        if "place" in locals():
            if "store" in locals():
                store.close()
            place.drop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
