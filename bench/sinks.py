"""Exporting a finished job's results to an S3 server against exporting them to local disk.

    .venv/bin/python bench/sinks.py                    # 1,000,000 results, Parquet
    .venv/bin/python bench/sinks.py --quick            # 100,000
    .venv/bin/python bench/sinks.py --format csv --rows 300000 --repeat 2

Builds a real SQLite store holding one finished job of N succeeded requests exactly as
bench/pipeline.py does: its CSV source of tickets, loaded by the real loader (`load_job`),
then run to the end by the real engine on the `echo` route, so every result column (output,
parsed answer, usage, attempts, the stored response the answer columns are read from) is
what ingestion writes, not an imitation of it (1,000,000 requests take about a minute on an
idle 2-core machine). Then starts moto's S3 server on loopback (as bench/sources.py and
tests/objectstores.py do) and exports the job with lowtide's own write path,
`export_results(store, job, out, fmt)` (what `lowtide results JOB --out` runs), twice:

- to local disk (`/tmp/.../results.parquet`),
- to S3 (`s3://bench/results.parquet`, credentials and endpoint from the environment).

Each export runs in a fresh process, which reports its rows/s, its CPU time and its own peak
RSS (VmHWM, from /proc/self/status: `ru_maxrss` survives fork and exec, so it would report
at least this process's RSS, the S3 server's objects included). Prints rows/s, the ratio
S3/local, the object's size against the local file's, and each exporter's peak RSS against
the target: RSS <= 300 MB. Each export runs `--repeat` times, round-robin, and its fastest
run counts (the machine is shared). The S3 server runs in this process, on the same cores as
the exporter: the S3 figure includes its cost of taking the upload.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from retention import build  # noqa: E402  (the pipeline bench's job, run to the end in a SQLite store)
from sources import peak_rss_mb, start_s3  # noqa: E402  (VmHWM; moto's server on loopback)

RSS_TARGET_MB = 300
EXTENSIONS = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}


def export_once(db: str, out: str, fmt: str) -> dict:
    """In the exporting process: write the job's results as `lowtide results` does."""
    from lowtide.core.runtime import tune_gc
    from lowtide.engine.export import export_results
    from lowtide.store.db import Store

    tune_gc()
    t, c = time.perf_counter(), time.process_time()
    with Store(db) as store:
        report = export_results(store, "bench", out, fmt)
    seconds, cpu = time.perf_counter() - t, time.process_time() - c
    return {"rows": report.rows, "states": report.states, "seconds": seconds, "cpu": cpu, "rss_mb": peak_rss_mb()}


def measure(db: Path, out: str, fmt: str, env: dict[str, str]) -> dict:
    """One export in a fresh process."""
    args = [sys.executable, __file__, "--export", str(db), out, "--format", fmt]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"exporting to {out} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    parser.add_argument("--format", choices=sorted(EXTENSIONS), default="parquet")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each export; the fastest counts")
    parser.add_argument("--export", nargs=2, metavar=("DB", "OUT"), help=argparse.SUPPRESS)  # the exporting process
    args = parser.parse_args()
    if args.export:
        print(json.dumps(export_once(*args.export, args.format)))
        return
    from lowtide.core.runtime import tune_gc

    tune_gc()
    rows = 100_000 if args.quick else args.rows
    ext = EXTENSIONS[args.format]

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-sinks-"))
    server = None
    try:
        t = time.perf_counter()
        db = build(tmp, rows)
        print(f"store: {rows:,} succeeded requests on echo (load_job + engine), {db.stat().st_size / 2**20:.0f} MiB SQLite, built in {time.perf_counter() - t:.1f}s")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs each request
        server, endpoint = start_s3()
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="bench", secret="bench")
        fs.mkdir("bench")
        print(f"moto's S3 server at {endpoint}")

        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        local_out = tmp / f"results.{ext}"
        targets = {"local disk": str(local_out), "S3 (moto)": f"s3://bench/results.{ext}"}
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, out in targets.items():
                got = measure(db, out, args.format, env)
                if name not in best or got["seconds"] < best[name]["seconds"]:
                    best[name] = got

        print(f"\nexport_results(store, job, out, {args.format!r}), each in a fresh process (fastest of {args.repeat})")
        print(f"  {'target':<12} {'rows':>12} {'seconds':>8} {'rows/s':>12} {'CPU s':>7} {'peak RSS':>9}")
        for name, got in best.items():
            print(f"  {name:<12} {got['rows']:>12,} {got['seconds']:>8.2f} {got['rows'] / got['seconds']:>12,.0f} {got['cpu']:>7.2f} {got['rss_mb']:>6.0f} MB")
        local, s3 = best["local disk"], best["S3 (moto)"]
        assert local["rows"] == s3["rows"] == rows and s3["states"] == {"succeeded": rows}, (local, s3)
        fs.invalidate_cache()
        size_local, size_s3 = local_out.stat().st_size, fs.info(f"bench/results.{ext}")["size"]
        assert size_local == size_s3, (size_local, size_s3)
        assert fs.find("bench") == [f"bench/results.{ext}"], fs.find("bench")  # no temporary key left
        ratio = (s3["rows"] / s3["seconds"]) / (local["rows"] / local["seconds"])
        rss = max(g["rss_mb"] for g in best.values())
        print(f"\n  object {size_s3 / 2**20:.1f} MiB, the local file's size; S3 / local throughput {ratio:.2f}x "
              f"(CPU time {local['cpu'] / s3['cpu']:.2f}x; wall time includes waiting on neighbours and on the S3 server)")
        print(f"  S3 exporter peak RSS {s3['rss_mb']:.0f} MB, highest {rss:.0f} MB ({'meets' if rss <= RSS_TARGET_MB else 'MISSES'} the {RSS_TARGET_MB} MB target)")
        print(f"  (this process, holding the S3 server's objects: peak RSS {peak_rss_mb():.0f} MB)")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
