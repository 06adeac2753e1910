"""What `lowtide prune` gives back: a finished job on the `echo` route, pruned.

    .venv/bin/python bench/retention.py            # 100,000 requests
    .venv/bin/python bench/retention.py --n 20000

Builds one finished job of N requests (as bench/pipeline.py does: render, persist, run on
echo), copies the SQLite store, then on one copy `prune --archive` (everything: payloads,
responses, answers) followed by `--vacuum`, and on the other `prune --keep-results` and
`--vacuum`. Prints the store's bytes (file and WAL) at each point, per 100,000 requests and
as a ratio of the finished job's store; the archive's bytes; each step's wall time; and the
process's peak RSS: over the whole run, and within the prune (the archive is streamed, so
that stays flat as N grows). Runs in a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lowtide.core.clock import ManualClock, SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.engine.retention import prune
from lowtide.store.db import Store
from lowtide.store.space import reclaim, store_bytes

sys.path.insert(0, str(Path(__file__).parent))
from pipeline import bench_spec, make_source, run_to_end  # noqa: E402  (the pipeline bench's job)

DAY = 86400.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux), so a step's own peak can be read after it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def status_mb(key: str) -> float | None:
    """VmHWM (peak since the last reset) or VmRSS (now) of this process, in MB (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def file_bytes(store: Store) -> int:
    """The database file alone, without its WAL."""
    return Path(store.describe()).stat().st_size


def build(folder: Path, n: int) -> Path:
    source = folder / "tickets.csv"
    make_source(source, n)
    path = folder / "bench.db"
    with Store(str(path)) as store:
        load_job(store, bench_spec(source), SystemClock())
        run_to_end(store, n)
        reclaim(store)  # checkpoint the WAL: the baseline is the file as a finished job leaves it once settled
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    tune_gc()
    n = args.n
    per = 100_000 / n
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-"))
    try:
        t = time.perf_counter()
        built = build(tmp, n)
        build_s = time.perf_counter() - t
        rows: list[tuple[str, int, int, float | None]] = []  # (what, bytes with the WAL, file alone, seconds)
        with Store(str(built)) as store:
            base = store_bytes(store)
            rows.append(("finished job (before prune)", base, file_bytes(store), None))
        later = ManualClock(time.time() + 40 * DAY)  # the job ended 40 days before this clock

        full = tmp / "full.db"
        shutil.copy(built, full)
        with Store(str(full)) as store:
            report = cost_report(store).as_dict()
            archive = tmp / "archive"
            rss_before = status_mb("VmRSS")
            reset_peak()
            t = time.perf_counter()
            done = prune(store, later, 30 * DAY, archive=archive)
            rows.append(("after prune --archive", store_bytes(store), file_bytes(store), time.perf_counter() - t))
            prune_peak = status_mb("VmHWM")
            assert done.requests == n, done
            t = time.perf_counter()
            reclaim(store)
            rows.append(("after --vacuum", store_bytes(store), file_bytes(store), time.perf_counter() - t))
            assert cost_report(store).as_dict() == report  # prune never changes report totals
        archive_bytes = sum(p.stat().st_size for p in archive.iterdir())

        keep = tmp / "keep.db"
        shutil.copy(built, keep)
        with Store(str(keep)) as store:
            t = time.perf_counter()
            prune(store, later, 30 * DAY, keep_results=True)
            rows.append(("after prune --keep-results", store_bytes(store), file_bytes(store), time.perf_counter() - t))
            t = time.perf_counter()
            reclaim(store)
            rows.append(("after --keep-results --vacuum", store_bytes(store), file_bytes(store), time.perf_counter() - t))

        print(f"retention on echo: {n:,} requests (built in {build_s:.1f} s), SQLite store; bytes: the file and its WAL")
        print(f"  {'store':<32} {'bytes':>14} {'per 100k req':>14} {'ratio':>7} {'file alone':>14} {'step':>8}")
        for what, size, alone, secs in rows:
            step = f"{secs:7.2f}s" if secs is not None else ""
            print(f"  {what:<32} {size:>14,} {size * per:>14,.0f} {size / base:>7.3f} {alone:>14,} {step:>8}")
        print(f"  {'archive (Parquet, zstd)':<32} {archive_bytes:>14,} {archive_bytes * per:>14,.0f} {archive_bytes / base:>7.3f}")
        print(f"  peak RSS {peak_rss_mb():.0f} MB over the run (building the job included)")
        if prune_peak is not None and rss_before is not None:
            print(f"  prune --archive: RSS {rss_before:.0f} MB before it, peak {prune_peak:.0f} MB during it (+{prune_peak - rss_before:.0f} MB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
