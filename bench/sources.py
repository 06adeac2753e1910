"""Reading a partitioned Parquet source from an S3 server against reading it from local disk.

    .venv/bin/python bench/sources.py                  # 10,000,000 rows in 30 daily partitions
    .venv/bin/python bench/sources.py --quick          # 1,000,000 rows
    .venv/bin/python bench/sources.py --rows 3000000 --partitions 10 --repeat 2

Writes a Hive-partitioned dataset (`dt=2026-11-01/part-0.parquet`, ...) with pyarrow, one row
group at a time (never the whole table in memory), starts moto's S3 server on loopback (as
tests/objectstores.py does), uploads the dataset there, then reads it through lowtide's own
read path, `source_at(spec.source).chunks()` (what `lowtide run` loads), three ways:

- from local disk (`source.path: /tmp/.../tickets/`),
- from S3 (`source.path: s3://bench/tickets/`, credentials and endpoint from the environment),
- from S3, filtered to one partition (`source.filter: [[dt, "=", ...]]`).

Each read runs in a fresh process, which reports its rows/s, its CPU time and its own peak
RSS (`ru_maxrss`), so one read's memory is never another's. Prints rows/s, the ratio S3/local
and each reader's peak RSS against the targets: RSS <= 300 MB, S3 >= 0.8x local. Each read
runs `--repeat` times, round-robin, and its fastest run counts (the machine is shared). The
S3 server runs in this process, on the same cores as the reader: the S3 figure includes its
cost of answering, which a real store does not put on the reader's machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ROW_GROUP = 100_000
CHANNELS = ["email", "chat", "web", "phone"]
WORDS = ["invoice", "refund", "login", "password", "delivery", "parcel", "crash", "error", "upgrade", "plan", "seat", "export"]
RSS_TARGET_MB = 300
RATIO_TARGET = 0.8


def peak_rss_mb() -> float:
    """This process's own peak RSS. On Linux `ru_maxrss` survives fork and exec, so a reader
    started by this bench would report at least the bench's own RSS (the S3 server's objects
    held in it); VmHWM belongs to the process's current memory map and starts afresh at exec."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def days(n: int) -> list[str]:
    start = date(2026, 11, 1)
    return [(start + timedelta(days=i)).isoformat() for i in range(n)]


def write_dataset(root: Path, rows: int, partitions: int) -> int:
    """`rows` tickets in `partitions` daily folders, one file each; returns the bytes written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    bodies = pa.array([" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(6 + i % 9)) + f" (case {i})" for i in range(997)])
    channels = pa.array(CHANNELS)
    schema = pa.schema([("ticket_id", pa.string()), ("channel", pa.string()), ("body", pa.string()), ("priority", pa.int64())])
    size = 0
    done = 0
    for p, day in enumerate(days(partitions)):
        n = rows // partitions + (1 if p < rows % partitions else 0)
        folder = root / f"dt={day}"
        folder.mkdir(parents=True)
        with pq.ParquetWriter(folder / "part-0.parquet", schema) as writer:
            for start in range(0, n, ROW_GROUP):
                k = min(ROW_GROUP, n - start)
                ids = range(done + start, done + start + k)
                idx = np.arange(done + start, done + start + k)
                writer.write_table(pa.table({
                    "ticket_id": pa.array([f"t{i:09d}" for i in ids]),
                    "channel": channels.take(pa.array(idx % len(CHANNELS))),
                    "body": bodies.take(pa.array(idx % len(bodies))),
                    "priority": pa.array(idx % 5),
                }, schema=schema))  # fmt: skip
        done += n
        size += (folder / "part-0.parquet").stat().st_size
    return size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3():
    """moto's S3 server on loopback, in this process; its endpoint."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def upload(local: Path, endpoint: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="bench", secret="bench")
    fs.mkdir(bucket)
    for f in sorted(local.rglob("*.parquet")):
        fs.put_file(str(f), f"{bucket}/tickets/{f.relative_to(local).as_posix()}")


def read_once(path: str, filter_: list | None) -> dict:
    """In the reading process: load the source as `lowtide run` does, count the rows."""
    from lowtide.core.runtime import tune_gc
    from lowtide.core.sources import SourceSpec, source_at

    tune_gc()
    t, c = time.perf_counter(), time.process_time()
    source = source_at(SourceSpec(path=path, id_column="ticket_id", filter=filter_ or []))
    rows = 0
    for chunk in source.chunks():
        rows += len(chunk)
    seconds, cpu = time.perf_counter() - t, time.process_time() - c
    return {"rows": rows, "seconds": seconds, "cpu": cpu, "rss_mb": peak_rss_mb()}


def measure(path: str, filter_: list | None, env: dict[str, str]) -> dict:
    """One read in a fresh process."""
    args = [sys.executable, __file__, "--read", path]
    if filter_:
        args += ["--filter", json.dumps(filter_)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"reading {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=30, help="daily dt=... folders, one file each")
    parser.add_argument("--quick", action="store_true", help="1,000,000 rows")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each read; the fastest counts")
    parser.add_argument("--read", help=argparse.SUPPRESS)  # the reading process
    parser.add_argument("--filter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        print(json.dumps(read_once(args.read, json.loads(args.filter) if args.filter else None)))
        return
    rows = 1_000_000 if args.quick else args.rows

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-sources-"))
    server = None
    try:
        t = time.perf_counter()
        size = write_dataset(tmp / "tickets", rows, args.partitions)
        print(f"dataset: {rows:,} rows in {args.partitions} partitions, {size / 2**20:.0f} MiB of Parquet (written in {time.perf_counter() - t:.1f}s)")
        server, endpoint = start_s3()
        t = time.perf_counter()
        upload(tmp / "tickets", endpoint, "bench")
        print(f"uploaded to moto's S3 server at {endpoint} in {time.perf_counter() - t:.1f}s")

        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        one_day = days(args.partitions)[args.partitions // 2]
        reads = {
            "local disk": (str(tmp / "tickets") + "/", None),
            "S3 (moto)": ("s3://bench/tickets/", None),
            f"S3, dt = {one_day}": ("s3://bench/tickets/", [["dt", "=", one_day]]),
        }
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, (path, filter_) in reads.items():
                got = measure(path, filter_, env)
                if name not in best or got["seconds"] < best[name]["seconds"]:
                    best[name] = got

        print(f"\nreads through source_at(...).chunks(), each in a fresh process (fastest of {args.repeat})")
        print(f"  {'source':<26} {'rows':>12} {'seconds':>8} {'rows/s':>12} {'CPU s':>7} {'peak RSS':>9}")
        for name, got in best.items():
            print(f"  {name:<26} {got['rows']:>12,} {got['seconds']:>8.2f} {got['rows'] / got['seconds']:>12,.0f} {got['cpu']:>7.2f} {got['rss_mb']:>6.0f} MB")
        local, s3 = best["local disk"], best["S3 (moto)"]
        assert local["rows"] == s3["rows"] == rows, (local["rows"], s3["rows"], rows)
        ratio = (s3["rows"] / s3["seconds"]) / (local["rows"] / local["seconds"])
        cpu_ratio = local["cpu"] / s3["cpu"]
        rss = max(g["rss_mb"] for g in best.values())
        print(f"\n  S3 / local throughput {ratio:.2f}x ({'meets' if ratio >= RATIO_TARGET else 'MISSES'} the {RATIO_TARGET}x target); "
              f"in the reader's CPU time {cpu_ratio:.2f}x (wall time includes waiting on neighbours and on the S3 server)")
        print(f"  highest reader peak RSS {rss:.0f} MB ({'meets' if rss <= RSS_TARGET_MB else 'MISSES'} the {RSS_TARGET_MB} MB target)")
        print(f"  (this process, holding the S3 server's objects: peak RSS {peak_rss_mb():.0f} MB)")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
