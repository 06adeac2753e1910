"""The hundredth night: what the dashboard's refresh and a `/metrics` scrape cost in a store
of many finished jobs.

    .venv/bin/python bench/nights.py                         # 100 jobs of 10,000 requests (echo)
    .venv/bin/python bench/nights.py --jobs 30 --n 5000 --db postgresql://postgres@127.0.0.1/test

Loads and runs N jobs on `echo` (a night each), then times, through the dashboard's own
app (FastAPI's TestClient) and `server.metrics.render`: the page's two reads of every job
(`/dashboard/api/jobs`, `/dashboard/api/series`) and a scrape, each first on a server just
started (which reads every row, as every refresh did before engine/job_figures.py) and then
warm (the median of --repeat: a finished job's figures are kept). Prints seconds, the
cold/warm ratio and the process's peak RSS. A temporary folder (SQLite by default) is
removed afterwards; with --db postgresql://… a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from fastapi.testclient import TestClient

from lowtide.core.clock import SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.server import metrics
from lowtide.server.context import ServeConfig
from lowtide.server.dashboard_app import create_dashboard_app
from lowtide.server.kept import Kept
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_store import ClientStore  # noqa: E402  (a fresh PostgreSQL schema per run, dropped after)
from pipeline import bench_spec, make_source, peak_rss_mb  # noqa: E402


def run_nights(store: Store, source: Path, jobs: int) -> None:
    for night in range(jobs):
        name = f"night-{night:03d}"
        load_job(store, bench_spec(source, name=name), SystemClock())

        async def run(name: str = name) -> None:
            async with Engine(store) as engine:
                status = await drive(engine, name)
            assert set(status.counts) == {"succeeded"}, status.counts

        asyncio.run(run())


def timed(read) -> float:
    started = time.perf_counter()
    read()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100, help="finished jobs (nights)")
    parser.add_argument("--n", type=int, default=10_000, help="requests a job")
    parser.add_argument("--repeat", type=int, default=5, help="warm reads, their median printed")
    parser.add_argument("--db", help="store location (default: a SQLite file in the temp folder)")
    args = parser.parse_args()
    tune_gc()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-nights-"))
    try:
        source = tmp / "tickets.csv"
        make_source(source, args.n)
        place = ClientStore(tmp, args.db)
        store = Store(place.url)
        started = time.perf_counter()
        run_nights(store, source, args.jobs)
        print(f"{args.jobs} finished jobs of {args.n:,} requests ({args.jobs * args.n:,} in all) in {time.perf_counter() - started:.0f} s")
        rows = []
        with TestClient(create_dashboard_app(ServeConfig(db=place.url)), base_url="http://127.0.0.1") as client:
            for path in ("/dashboard/api/jobs", "/dashboard/api/series"):

                def get(path: str = path) -> None:
                    assert client.get(path).status_code == 200

                client.app.state.dashboard_kept = None  # a server just started
                cold = timed(get)
                warm = statistics.median(timed(get) for _ in range(args.repeat))
                rows.append((f"GET {path}", cold, warm))
        kept = Kept()
        cold = timed(lambda: metrics.render(store, kept))
        warm = statistics.median(timed(lambda: metrics.render(store, kept)) for _ in range(args.repeat))
        rows.append(("/metrics scrape", cold, warm))
        print(f"  {'read':28} {'cold':>9} {'warm':>9} {'cold/warm':>10}")
        for what, cold, warm in rows:
            print(f"  {what:28} {cold:8.3f}s {warm:8.3f}s {cold / warm:9.0f}×")
        print("  (cold: a server just started, which reads every row, as each refresh and scrape did before;")
        print("   warm: the median of --repeat, a finished job's figures kept: engine/job_figures.py)")
        for flags in ([], ["--json"]):  # a command reads every job each time; the table leaves out placement
            command = [str(Path(sys.executable).with_name("lowtide")), "--db", place.url, "status", *flags]
            took = statistics.median(timed(partial(subprocess.run, command, check=True, capture_output=True)) for _ in range(3))
            print(f"  lowtide status {' '.join(flags) or '(table)':14} {took:6.2f}s, the command whole (median of 3)")
        print(f"  peak RSS {peak_rss_mb():.0f} MB")
        store.close()
    finally:
        if "place" in locals():
            place.drop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
