"""A big job loaded into a PostgreSQL store whose statistics describe it as it was.

    .venv/bin/python bench/pg_statistics.py                    # 45,000 requests
    .venv/bin/python bench/pg_statistics.py --n 100000 --db postgresql://postgres@127.0.0.1/test

In a fresh schema (dropped afterwards): a 5-request job run to the end and the store
analyzed, as autovacuum may have left it; then a job of N requests on echo-batch loaded and
ticked twice (each tick sends two batches of 10,000). Prints the load's and the two ticks'
wall time, and the planner's estimate of pending requests after the load. Before the load
refreshed the statistics (`Store.added_pending`), the ticks of 45,000 took 89 s; with
`--no-refresh` the refresh is turned off to show that again.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_store import ClientStore  # noqa: E402  (a fresh PostgreSQL schema, dropped after)
from lowtide.core.clock import ManualClock  # noqa: E402
from lowtide.core.spec import build_spec  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.runner import drive  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402


def source(folder: Path, name: str, n: int, start: int) -> Path:
    path = folder / f"{name}.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["ticket_id", "body"])
        out.writerows([f"T{start + i}", f"ticket {start + i} about billing"] for i in range(n))
    return path


def spec(folder: Path, name: str, n: int, start: int, route: str = "echo-batch"):
    options = {"dir": str(folder / "provider"), "max_requests": 50_000} if route == "echo-batch" else {}
    return build_spec({
        "name": name, "source": {"path": str(source(folder, name, n, start)), "id_column": "ticket_id"},
        "template": {"user": "Ticket: {{ body }}"}, "model": "gpt-4o-mini", "route": route, "route_options": options,
    })  # fmt: skip


def estimated_pending(store: Store) -> int:
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) SELECT id FROM requests WHERE state = 'pending'").scalar()
    return plan[0]["Plan"]["Plan Rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=45_000)
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-refresh", action="store_true", help="turn the refresh after a load off")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        place = ClientStore(folder, args.db)
        store = Store(place.url)
        try:
            if args.no_refresh:
                store.added_pending = lambda count: None  # type: ignore[method-assign]
            clock = ManualClock()
            load_job(store, spec(folder, "earlier", 5, 0, route="echo"), clock)

            async def run_earlier() -> None:
                async with Engine(store, clock) as engine:
                    await drive(engine, "earlier")

            asyncio.run(run_earlier())
            with store.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE requests")
            t = time.monotonic()
            load_job(store, spec(folder, "tonight", args.n, 1_000_000), clock)
            loaded = time.monotonic() - t
            estimate = estimated_pending(store)

            async def two_ticks() -> None:
                async with Engine(store, clock) as engine:
                    await engine.tick("tonight")
                    await engine.tick("tonight")

            t = time.monotonic()
            asyncio.run(two_ticks())
            ticked = time.monotonic() - t
        finally:
            store.close()
            place.drop()
    refresh = "off" if args.no_refresh else "on"
    print(f"{args.n:,} requests after a 5-request store was analyzed (refresh {refresh}): load {loaded:.2f} s, "
          f"planner's pending estimate {estimate:,}, two ticks {ticked:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
