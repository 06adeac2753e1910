"""The whole pipeline on the `echo` route: render → persist → execute → ingest → export.

    .venv/bin/python bench/pipeline.py            # 100,000 requests
    .venv/bin/python bench/pipeline.py --big      # 1,000,000 requests
    .venv/bin/python bench/pipeline.py --n 20000 --db postgresql://postgres@127.0.0.1/test

Prints each phase's wall time, requests/s and the process's peak RSS. Runs in a temporary
folder (SQLite store by default) that is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lowtide.core.clock import SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.core.spec import JobSpec, build_spec
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from killtest import ClientStore  # noqa: E402  (a fresh PostgreSQL schema per run, dropped after)

WORDS = ["invoice", "refund", "login", "password", "delivery", "parcel", "crash", "error", "upgrade", "plan", "seat", "export"]


def make_source(path: Path, n: int) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ticket_id", "channel", "body"])
        for i in range(n):
            body = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))
            w.writerow([f"t{i:07d}", ("email", "chat", "web")[i % 3], f"Customer {i} writes: {body}."])


def bench_spec(source: Path, **more) -> JobSpec:
    """The benches' job: classify each ticket of `make_source` on echo (`more` replaces keys)."""
    return build_spec({
        "name": "bench", "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Channel: {{ channel }}\n{{ body }}"},
        "model": "echo", "route": "echo", "choices": ["billing", "technical", "account", "shipping", "feedback"],
    } | more)  # fmt: skip


def run_to_end(store: Store, n: int, name: str = "bench") -> None:
    """Drive the job until every request has ended; all `n` must have succeeded."""

    async def run() -> None:
        async with Engine(store) as engine:
            status = await drive(engine, name)
        assert status.counts == {"succeeded": n}, status.counts

    asyncio.run(run())


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--big", action="store_true", help="1,000,000 requests")
    parser.add_argument("--db", help="store location (default: a SQLite file in the temp folder)")
    args = parser.parse_args()
    tune_gc()  # as lowtide's commands do (core/runtime.py)
    n = 1_000_000 if args.big else args.n

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-"))
    try:
        source = tmp / "tickets.csv"
        make_source(source, n)
        rss_start = peak_rss_mb()
        spec = bench_spec(source)
        place = ClientStore(tmp, args.db)  # PostgreSQL: a fresh schema, dropped at the end
        store = Store(place.url)
        phases: dict[str, tuple[float, float]] = {}  # wall, CPU of this process

        t, c = time.perf_counter(), time.process_time()
        report = load_job(store, spec, SystemClock())
        phases["render + persist"] = (time.perf_counter() - t, time.process_time() - c)

        t, c = time.perf_counter(), time.process_time()
        run_to_end(store, n)
        phases["execute + ingest"] = (time.perf_counter() - t, time.process_time() - c)

        t, c = time.perf_counter(), time.process_time()
        exported = export_results(store, "bench", tmp / "results.parquet")
        phases["export (parquet)"] = (time.perf_counter() - t, time.process_time() - c)
        assert exported.rows == n == report.new
        store.close()

        phases["total"] = (sum(w for w, _ in phases.values()), sum(c for _, c in phases.values()))
        print(f"pipeline on echo: {n:,} requests, store {args.db or 'SQLite file'}")
        print(f"  {'phase':<18} {'wall':>8} {'req/s':>10}   {'CPU':>8}   (CPU: this process alone; wall includes waiting on I/O and neighbours)")
        for name, (wall, cpu) in phases.items():
            print(f"  {name:<18} {wall:7.2f}s {n / wall:>10,.0f}   {cpu:7.2f}s")
        print(f"  peak RSS {peak_rss_mb():.0f} MB (interpreter and imports before the run: {rss_start:.0f} MB)")
    finally:
        if "place" in locals():
            place.drop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
