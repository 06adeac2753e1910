"""Provider batches per 1,000 retried requests: do retries scatter into one-request batches?

    .venv/bin/python bench/retry_batches.py --rows 3000 --chunk 100 --fail-share 0.1 --seed 1

A job of `--rows` requests on echo-batch (a provider in a folder), in chunks of `--chunk`;
a seeded `--fail-share` of the requests fail their first attempt (retryable), as a provider's
dropped or failed lines do. The engine runs on a ManualClock advanced `--step` seconds a
tick, with echo-batch's poll interval (1 s first), so batches end at different polls the way
they do at a provider. Prints the batches the first attempts took, the batches the retries
took, and the retries' batches per 1,000 retried requests; then peak RSS.

Runs on any commit with the same public API (load_job, Engine.tick), so the same command
measures the code before a change and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import resource
import tempfile
from pathlib import Path

import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.core.spec import build_spec
from lowtide.engine.control import job_done, job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--fail-share", type=float, default=0.1)
    ap.add_argument("--step", type=float, default=0.25, help="clock seconds a tick")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = folder / "rows.csv"
        ids = [f"r{i}" for i in range(args.rows)]
        with source.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text"])
            writer.writerows([i, f"row {i}"] for i in ids)
        failing = {i: 1 for i in ids if rng.random() < args.fail_share}
        spec = build_spec({
            "name": "retries", "source": {"path": str(source), "id_column": "id"}, "template": {"user": "{{ text }}"},
            "model": "m", "route": "echo-batch", "chunk_size": args.chunk,
            "route_options": {"dir": str(folder / "provider"), "fail_attempts": failing},
            "retry": {"max_attempts": 3, "backoff_seconds": 2},
        })  # fmt: skip
        store = Store(str(folder / "store.db"))
        clock = ManualClock()
        load_job(store, spec, clock)

        async def run() -> int:
            ticks = 0
            async with Engine(store, clock, seed=args.seed) as engine:
                while not job_done(store, "retries"):
                    await engine.tick("retries")
                    clock.advance(args.step)
                    ticks += 1
            return ticks

        ticks = asyncio.run(run())
        status = job_status(store, "retries")
        with store.begin() as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one()
            retried = conn.execute(sa.select(sa.func.count()).select_from(attempts).where(attempts.c.ok.is_(False))).scalar_one()
            ones = conn.execute(sa.select(sa.func.count()).select_from(dispatches).where(dispatches.c.size == 1)).scalar_one()
        store.close()
    first = -(-args.rows // args.chunk)
    print(f"rows {args.rows:,}, chunk {args.chunk}, failed once {retried:,}, ticks {ticks:,}, end state {status.counts}")
    print(f"batches: {first} for first attempts, {total - first} for retries ({ones} of one request)")
    if retried:
        print(f"retry batches per 1,000 retried requests: {(total - first) * 1000 / retried:,.1f}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")


if __name__ == "__main__":
    main()
