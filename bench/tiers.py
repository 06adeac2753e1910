"""What a `route: auto` chain's per-tick pass costs (engine/tiers.py), beside the two-lane
deadline cut-over (engine/fallback.py) on the same requests.

    .venv/bin/python bench/tiers.py              # 100,000 pending requests
    .venv/bin/python bench/tiers.py --n 20000 --repeat 5

Each job's requests are written straight into a SQLite store (no route is called). Timed,
in CPU seconds (time.process_time, this process only: nothing else runs):

    quiet   one pass well before any hand-over: nothing moves (the chain finds which
            lanes have waiting requests, one index seek each; the cut-over reads the
            batch route's turnaround)
    cut     one pass at the (first) hand-over: every pending request changes lane

A/B runs are interleaved, `--repeat` times; medians and the chain / cut-over ratio are
printed, with peak RSS.

    .venv/bin/python bench/tiers.py --quiet                       # 100,000 and 1,000,000 pending
    .venv/bin/python bench/tiers.py --quiet --sizes 100000 --ticks 50 --pg postgresql://…

`--quiet`: what a chain job's quiet tick costs as its pending requests grow. Its requests
wait on the chosen (batch) tier for a retry an hour away, so nothing moves, is planned or
claimed; per size, `--ticks` ticks of each are timed and the median per tick printed, in
CPU ms (this process; on PostgreSQL the server's own work is not in it, so wall ms too):

    step    tiers.step alone (the chain's pass)
    tick    a whole Engine.tick of the job (the pass, then each tier's plan or claim)

`--pg ADMIN_URL` runs on PostgreSQL, in a schema of its own dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).parent))
from lowtide.core.clock import ManualClock  # noqa: E402
from lowtide.core.spec import JobSpec  # noqa: E402
from lowtide.core.types import Request  # noqa: E402
from lowtide.engine import tiers  # noqa: E402
from lowtide.engine.context import JobContext  # noqa: E402
from lowtide.engine.fallback import cut_over  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from lowtide.store.queries import save_job  # noqa: E402
from lowtide.store.schema import jobs, requests  # noqa: E402

NOW = 1_700_000_000.0
HOUR = 3600.0


def _spec(name: str, chain: bool) -> JobSpec:
    base = {
        "name": name, "source": {"path": "unused.csv", "id_column": "id"}, "template": {"user": "{{ body }}"},
        "model": "team-model", "route": "echo-batch", "params": {"max_tokens": 16},
        "deadline": datetime.fromtimestamp(NOW + 2 * HOUR, UTC).isoformat(),
    }  # fmt: skip
    if chain:
        candidates = [{"route": "echo-batch"}, {"route": "echo", "route_options": {"answer": "message"}}, {"route": "echo"}]
        tiers_ = [{"route": "echo-batch", "margin": 0}, {"route": "echo", "route_options": {"answer": "message"}, "margin": 600},
                  {"route": "echo", "margin": 60}]  # fmt: skip
        base["auto"] = {"max_wait": "2h", "chosen": "echo-batch", "candidates": candidates, "chain": tiers_}
    else:
        base["fallback"] = {"route": "echo", "safety_margin": 600, "expected_turnaround": 1}
    return JobSpec.model_validate(base)


def _job(store: Store, spec: JobSpec, n: int, not_before: float = 0.0) -> JobContext:
    payload = json.dumps(Request.chat("x", spec.model, [{"role": "user", "content": "y" * 200}], max_tokens=16).to_payload())
    with store.begin() as conn:
        conn.execute(sa.delete(requests))
        conn.execute(sa.delete(jobs))
        job_id, _ = save_job(conn, spec.name, spec.model_dump_json(), spec.route, NOW)
        for start in range(0, n, 10_000):
            conn.execute(sa.insert(requests), [
                {"job_id": job_id, "custom_id": f"r{i}", "source_key": f"r{i}", "source_row": i + 1, "payload": payload,
                 "state": "pending", "attempts": 0, "not_before": not_before, "model": spec.model}
                for i in range(start, min(n, start + 10_000))
            ])  # fmt: skip
        return JobContext.from_row(conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one())


def _timed(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


@contextmanager
def _store(tmp: str, pg: str | None):
    """A SQLite store in `tmp`, or one in a new PostgreSQL schema (dropped after)."""
    if pg is None:
        store = Store(str(Path(tmp) / "lowtide.db"))
        try:
            yield store
        finally:
            store.close()
        return
    schema = f"lowtide_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    store = Store(f"{pg}?options=-csearch_path%3D{schema}")
    try:
        yield store
    finally:
        store.close()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _per_tick(fn, ticks: int) -> tuple[float, float]:
    """Median CPU and wall milliseconds of `ticks` calls of `fn`."""
    cpu, wall = [], []
    for _ in range(ticks):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def quiet_ticks(sizes: list[int], ticks: int, pg: str | None) -> None:
    kinds = ["batch", "direct", "direct"]
    clock = ManualClock(NOW)
    with tempfile.TemporaryDirectory() as tmp, _store(tmp, pg) as store:
        os.environ["LOWTIDE_ECHO_BATCH_DIR"] = str(Path(tmp) / "echo-batch")
        print(f"quiet ticks of a chain job ({'PostgreSQL' if pg else 'SQLite'}), median of {ticks}: CPU ms (wall ms)")
        for n in sizes:
            job = _job(store, _spec("bench", True), n, not_before=NOW + HOUR)  # a retry an hour away
            step_ms = _per_tick(lambda: tiers.step(store, job, kinds, clock), ticks)  # noqa: B023

            async def engine_ticks() -> tuple[float, float]:
                async with Engine(store, clock, seed=1) as engine:
                    await engine.tick("bench")  # builds the routes
                    loop = asyncio.get_running_loop()
                    out = []
                    for _ in range(ticks):
                        c, w = time.process_time(), loop.time()
                        report = await engine.tick("bench")
                        out.append(((time.process_time() - c) * 1000, (loop.time() - w) * 1000))
                        assert not report.busy, report
                    return statistics.median(x for x, _ in out), statistics.median(y for _, y in out)

            tick_ms = asyncio.run(engine_ticks())
            print(f"  {n:>9,} pending   step {step_ms[0]:8.2f} ({step_ms[1]:8.2f})   tick {tick_ms[0]:8.2f} ({tick_ms[1]:8.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quiet", action="store_true", help="time quiet ticks of a chain job at each of --sizes")
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--pg", help="PostgreSQL admin URL (with --quiet): run there, in a schema of its own")
    args = ap.parse_args()
    if args.quiet:
        quiet_ticks([int(x) for x in args.sizes.split(",")], args.ticks, args.pg)
        return
    results: dict[str, list[float]] = {k: [] for k in ("chain quiet", "cut-over quiet", "chain cut", "cut-over cut")}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "lowtide.db"))
        for _ in range(args.repeat):
            for kind in ("chain", "cut-over"):
                job = _job(store, _spec("bench", kind == "chain"), args.n)
                quiet, cut = ManualClock(NOW), ManualClock(NOW + 2 * HOUR - 600)
                if kind == "chain":
                    kinds = ["batch", "direct", "direct"]
                    results["chain quiet"].append(_timed(lambda: tiers.step(store, job, kinds, quiet)))  # noqa: B023
                    results["chain cut"].append(_timed(lambda: tiers.step(store, job, kinds, cut)))  # noqa: B023
                else:
                    results["cut-over quiet"].append(_timed(lambda: cut_over(store, job, "batch", "echo-batch", quiet)))  # noqa: B023
                    results["cut-over cut"].append(_timed(lambda: cut_over(store, job, "batch", "echo-batch", cut)))  # noqa: B023
        store.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{args.n:,} pending requests, median of {args.repeat} (CPU seconds, this process)")
    for k, v in med.items():
        print(f"  {k:<15} {v:8.4f} s   ({', '.join(f'{x:.4f}' for x in results[k])})")
    for phase in ("quiet", "cut"):
        base = med[f"cut-over {phase}"]
        print(f"  chain / cut-over, {phase}: {med[f'chain {phase}'] / base:.2f}x" if base else f"  {phase}: cut-over took 0 s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
