"""CPU of one progress read of a 100,000-request job: `job_status` (what `lowtide run` read
after each tick before) against `engine.progress.progress_status` (what it reads now, at
most once a second). 20 reads each, with the job all pending and then all finished.

    .venv/bin/python bench/progress_reads.py            # 100,000 requests on echo
    .venv/bin/python bench/progress_reads.py --n 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.engine.control import job_status  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.progress import progress_status  # noqa: E402
from lowtide.engine.runner import drive  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from pipeline import bench_spec, make_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    tune_gc()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-progress-"))
    try:
        make_source(tmp / "tickets.csv", args.n)
        store = Store(str(tmp / "client.db"))
        load_job(store, bench_spec(tmp / "tickets.csv"), SystemClock())

        def per_read(read) -> float:
            started = time.process_time()
            for _ in range(args.reads):
                read(store, "bench")
            return (time.process_time() - started) / args.reads * 1000

        def show(when: str) -> None:
            print(f"  {when:<9} job_status {per_read(job_status):7.1f} ms CPU   progress_status {per_read(progress_status):7.1f} ms CPU")

        print(f"one progress read of a job of {args.n:,} requests (mean of {args.reads})")
        show("pending")

        async def run() -> None:
            async with Engine(store) as engine:
                await drive(engine, "bench")

        asyncio.run(run())
        show("finished")
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
