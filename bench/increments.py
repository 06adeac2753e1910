"""A nightly increment on a job with a long history: what a night costs once the job holds
N requests already (`source.since`, one CSV file that grows by M rows a night, on `echo`).

    .venv/bin/python bench/increments.py                      # 200,000 stored, 10,000 a night
    .venv/bin/python bench/increments.py --history 1000000

Loads and runs the history first (not timed), then times two nights as `lowtide run` has them
(load, run, export of the job's results): one with nothing new, one with M new rows. Prints
each phase's CPU and wall, the night's CPU per new request, and the process's peak RSS. A
file has no index: every night reads the whole file to find the rows past the watermark; the
export writes every request of the job, the history included (docs/scale.md, "The hundredth
night"). Runs in a temporary folder (SQLite), removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lowtide.core.clock import SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline import WORDS, bench_spec, make_source, peak_rss_mb, run_to_end  # noqa: E402


def append_rows(path: Path, start: int, n: int) -> None:
    """Rows `start`.. of `make_source`'s, added at the end of the file."""
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        for i in range(start, start + n):
            body = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))
            w.writerow([f"t{i:07d}", ("email", "chat", "web")[i % 3], f"Customer {i} writes: {body}."])


def run_night(store: Store, total: int) -> None:
    """Drive the job to its end as `lowtide run` does (its final status without placement,
    which the command's table does not show)."""

    async def go() -> None:
        async with Engine(store) as engine:
            status = await drive(engine, "nightly", placement=False)
        assert status.counts == {"succeeded": total}, status.counts

    asyncio.run(go())


def timed(phases: dict, name: str, work) -> object:
    t, c = time.perf_counter(), time.process_time()
    out = work()
    phases[name] = (time.perf_counter() - t, time.process_time() - c)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=200_000, help="requests the job holds before the nights")
    parser.add_argument("--night", type=int, default=10_000, help="new rows a night")
    args = parser.parse_args()
    tune_gc()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-increments-"))
    try:
        source = tmp / "tickets.csv"
        make_source(source, args.history)
        spec = bench_spec(source, name="nightly", source={"path": str(source), "id_column": "ticket_id", "since": {"column": "ticket_id"}})
        store = Store(str(tmp / "lowtide.db"))
        started = time.perf_counter()
        load_job(store, spec, SystemClock())
        run_to_end(store, args.history, "nightly")
        print(f"history: {args.history:,} requests loaded and run in {time.perf_counter() - started:.0f} s")
        total = args.history
        for night, new in (("nothing new", 0), (f"{args.night:,} new", args.night)):
            append_rows(source, total, new)
            total += new
            phases: dict[str, tuple[float, float]] = {}
            report = timed(phases, "load", lambda: load_job(store, spec, SystemClock()))
            assert report.new == new, report
            timed(phases, "run", lambda n=total: run_night(store, n))
            exported = timed(phases, "export (parquet)", lambda: export_results(store, "nightly", tmp / "results.parquet"))
            assert exported.rows == total
            cpu = sum(c for _, c in phases.values())
            print(f"night with {night}: {cpu:.2f} s CPU" + (f", {cpu / new * 1e6:,.0f} µs per new request" if new else ""))
            for name, (wall, c) in phases.items():
                print(f"  {name:<18} CPU {c:7.2f} s   wall {wall:7.2f} s")
        print(f"  peak RSS {peak_rss_mb():.0f} MB")
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
