"""The whole pipeline on the `echo` route: render → persist → execute → ingest → export.

    .venv/bin/python bench/pipeline.py            # 100,000 requests
    .venv/bin/python bench/pipeline.py --big      # 1,000,000 requests
    .venv/bin/python bench/pipeline.py --n 20000 --db postgresql://postgres@127.0.0.1/test

Prints each phase's wall time, requests/s, CPU (of this process, and of its PostgreSQL
backends when the server runs on this machine), the store's round trips and statements per
request, and the process's peak RSS. Runs in a temporary folder (SQLite store by default) that
is removed afterwards; with --db postgresql://… in a fresh schema, dropped afterwards.

Round trips: calls to the database driver (SQLAlchemy's `before_cursor_execute`, once per
execute or executemany). Statements: what the database runs, an executemany counting once
per row (psycopg pipelines those rows in one round trip, but each is a statement).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import event

from lowtide.core.clock import SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.core.spec import JobSpec, build_spec
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_store import ClientStore  # noqa: E402  (a fresh PostgreSQL schema per run, dropped after)

WORDS = ["invoice", "refund", "login", "password", "delivery", "parcel", "crash", "error", "upgrade", "plan", "seat", "export"]


def make_source(path: Path, n: int) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ticket_id", "channel", "body"])
        for i in range(n):
            body = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))
            w.writerow([f"t{i:07d}", ("email", "chat", "web")[i % 3], f"Customer {i} writes: {body}."])


def bench_spec(path: Path, /, **more) -> JobSpec:
    """The benches' job: classify each ticket of `make_source` on echo (`more` replaces keys)."""
    return build_spec({
        "name": "bench", "source": {"path": str(path), "id_column": "ticket_id"},
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


class StoreMeter:
    """What the store costs per phase: round trips and statements the engine sends (see the
    module doc) and, for a PostgreSQL server on this machine, the CPU its backends for this
    process used (read from /proc; None where it cannot be read)."""

    def __init__(self, store: Store):
        self.calls = self.statements = 0
        self.backends: set[int] = set()
        self.cpu_mark = 0.0
        event.listen(store.engine, "before_cursor_execute", self._on_execute)
        self.sqlite = store.is_sqlite  # its database work is this process's CPU
        if not store.is_sqlite:
            event.listen(store.engine, "connect", self._on_connect)
            store.engine.dispose()  # connections from now on: each one's backend is noted

    def _on_execute(self, conn, cursor, statement, parameters, context, executemany) -> None:
        self.calls += 1
        self.statements += len(parameters) if executemany else 1

    def _on_connect(self, dbapi_conn, _record) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            self.backends.add(cur.fetchone()[0])
        dbapi_conn.commit()

    def _db_cpu(self) -> float | None:
        if self.sqlite:
            return None
        ticks = 0
        for pid in self.backends:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:  # another machine's server, or a backend that ended
                return None
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def taken(self) -> tuple[int, int, float | None]:
        """Round trips, statements and database CPU seconds since the last call."""
        cpu = self._db_cpu()
        out = self.calls, self.statements, None if cpu is None else cpu - self.cpu_mark
        self.calls = self.statements = 0
        self.cpu_mark = cpu or 0.0
        return out


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
        meter = StoreMeter(store)
        meter.taken()  # not opening the store (migrations)
        phases: dict[str, tuple] = {}  # wall, CPU of this process, round trips, statements, database CPU

        t, c = time.perf_counter(), time.process_time()
        report = load_job(store, spec, SystemClock())
        phases["render + persist"] = (time.perf_counter() - t, time.process_time() - c, *meter.taken())

        t, c = time.perf_counter(), time.process_time()
        run_to_end(store, n)
        phases["execute + ingest"] = (time.perf_counter() - t, time.process_time() - c, *meter.taken())

        t, c = time.perf_counter(), time.process_time()
        exported = export_results(store, "bench", tmp / "results.parquet")
        phases["export (parquet)"] = (time.perf_counter() - t, time.process_time() - c, *meter.taken())
        assert exported.rows == n == report.new
        store.close()

        db_cpu = [p[4] for p in phases.values()]
        phases["total"] = (*(sum(p[i] for p in phases.values()) for i in range(4)), None if None in db_cpu else sum(db_cpu))
        print(f"pipeline on echo: {n:,} requests, store {args.db or 'SQLite file'}")
        print(f"  {'phase':<18} {'wall':>8} {'req/s':>10}   {'CPU':>8} {'db CPU':>8}   {'trips/req':>9} {'stmts/req':>9}")
        for name, (wall, cpu, calls, statements, db) in phases.items():
            shown = "-" if db is None else f"{db:7.2f}s"
            print(f"  {name:<18} {wall:7.2f}s {n / wall:>10,.0f}   {cpu:7.2f}s {shown:>8}   {calls / n:9.4f} {statements / n:9.4f}")
        print("  (CPU: this process; db CPU: its PostgreSQL backends, when on this machine; wall includes waiting on")
        print("   the database, I/O and neighbours. trips: calls to the driver; stmts: statements, an executemany's rows each)")
        print(f"  peak RSS {peak_rss_mb():.0f} MB (interpreter and imports before the run: {rss_start:.0f} MB)")
    finally:
        if "place" in locals():
            place.drop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
