"""The CPU a live progress bar costs while a job runs: `JobProgress` as `lowtide run` draws
it on a terminal, updated once a second for `--seconds`, drawn when its counts change
(today) and, for comparison, also redrawn 10 times a second by Rich's refresh thread (before).

    .venv/bin/python bench/progress_bar.py              # 20 s each, one after the other
    .venv/bin/python bench/progress_bar.py --seconds 60

CPU is the process's (all threads), so the refresh thread's work counts.
"""

from __future__ import annotations

import argparse
import io
import time

from rich.console import Console
from rich.progress import Progress

from lowtide.engine.control import JobStatus
from lowtide.engine.progress import JobProgress


def bar_cpu(seconds: int, refresh_thread: bool) -> float:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    status = JobStatus(name="bench", state="running", route="openai-batch", counts={"pending": 50_000, "succeeded": 50_000},
                       phases={"in_progress": 3}, dispatched={}, dispatches={"in_progress": 3, "ended": 7})  # fmt: skip
    original = Progress.__init__

    def with_thread(self, *args, **kwargs):  # Rich's default: a thread redrawing 10 times a second
        kwargs.pop("auto_refresh", None)
        original(self, *args, **kwargs)

    if refresh_thread:
        Progress.__init__ = with_thread
    try:
        started = time.process_time()
        with JobProgress(console, "run bench") as progress:
            for _ in range(seconds):
                progress.update(status)
                time.sleep(1.0)
        return time.process_time() - started
    finally:
        Progress.__init__ = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    before = bar_cpu(args.seconds, refresh_thread=True)
    after = bar_cpu(args.seconds, refresh_thread=False)
    print(f"a live bar over {args.seconds} s of a run: {before:.2f} s CPU with Rich's refresh thread (before), "
          f"{after:.2f} s drawn on each update (today): {after / before:.2f}x, "
          f"{(before - after) / args.seconds * 100:.1f} % of a core saved")  # fmt: skip


if __name__ == "__main__":
    main()
