"""100,000 requests through `gemini-batch` against `lowtide serve` (echo backend, fast clock),
side by side with `openai-batch` on the same job in the same run: render → persist → chunk
→ submit (inline or an uploaded file) → poll → download → ingest.

    .venv/bin/python bench/gemini_batch.py            # 100,000 requests, each route
    .venv/bin/python bench/gemini_batch.py --n 5000   # a quick run
    .venv/bin/python bench/gemini_batch.py --inline-bytes 0   # every gemini chunk as a file

Each route runs in its own child process (so each peak RSS is that route's alone) with its
own server, on the same source rows and template (bench/batch.py's machinery). Prints the
client's wall time, requests per second and peak RSS per route, the client's and the
server's CPU seconds (steadier than wall time on a shared machine), and the ratios. The
engine's default chunk is 10,000 requests, which go inline (about 3 MB, under
`inline_bytes`); `--inline-bytes 0` runs the upload / download path instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from batch import start_server  # noqa: E402
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.core.spec import build_spec  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.runner import drive  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from pipeline import make_source, peak_rss_mb  # noqa: E402

ROUTES = {"openai-batch": "gpt-4o-mini", "gemini-batch": "gemini-2.5-flash"}


def run_one(route: str, n: int, inline_bytes: int | None = None) -> dict:
    tune_gc()
    tmp = Path(tempfile.mkdtemp(prefix=f"lowtide-bench-{route}-"))
    server, url = start_server(tmp)
    os.environ["LOWTIDE_BENCH_KEY"] = "bench"
    try:
        make_source(tmp / "tickets.csv", n)
        base = f"{url}/v1" if route == "openai-batch" else url
        spec = build_spec({
            "name": "bench", "source": {"path": str(tmp / "tickets.csv"), "id_column": "ticket_id"},
            "template": {"system": "Classify the ticket.", "user": "Channel: {{ channel }}\n{{ body }}"},
            "model": ROUTES[route], "route": route, "params": {"max_tokens": 64},
            "route_options": {"base_url": base, "api_key_env": "LOWTIDE_BENCH_KEY", "poll_interval": [0.2, 0.5],
                              "max_requests": 50_000}
                             | ({"inline_bytes": inline_bytes} if route == "gemini-batch" and inline_bytes is not None else {}),
        })  # fmt: skip
        store = Store(str(tmp / "client.db"))
        t = time.perf_counter()
        load_job(store, spec, SystemClock())
        persist = time.perf_counter() - t

        async def run():
            async with Engine(store) as engine:
                status = await drive(engine, "bench")
            assert status.counts == {"succeeded": n}, (status.counts, status.failures, status.events)

        t = time.perf_counter()
        asyncio.run(run())
        batch = time.perf_counter() - t
        store.close()
        result = {"route": route, "n": n, "persist_s": persist, "batch_s": batch, "rss_mb": peak_rss_mb(),
                  "client_cpu_s": cpu_s(resource.RUSAGE_SELF)}  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    result["server_cpu_s"] = cpu_s(resource.RUSAGE_CHILDREN)  # the server, reaped above
    return result


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--inline-bytes", type=int, help="gemini-batch's inline_bytes (0: every chunk as an uploaded file)")
    parser.add_argument("--only", choices=list(ROUTES), help=argparse.SUPPRESS)  # a child's one route
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args.only, args.n, args.inline_bytes)))
        return
    results = {}
    for route in ROUTES:
        more = ["--inline-bytes", str(args.inline_bytes)] if args.inline_bytes is not None else []
        out = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--only", route, *more], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{route} failed:\n{out.stderr[-3000:]}")
        results[route] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.n:,} requests against lowtide serve (echo backend, fast clock), one child process per route")
    print(f"  {'route':<14} {'render+persist':>15} {'submit..ingest':>15} {'total':>8} {'req/s':>8} {'peak RSS':>9}"
          f" {'client CPU':>11} {'server CPU':>11}")  # fmt: skip
    for route, r in results.items():
        total = r["persist_s"] + r["batch_s"]
        print(f"  {route:<14} {r['persist_s']:>13.2f} s {r['batch_s']:>13.2f} s {total:>6.2f} s {r['n'] / total:>8,.0f} {r['rss_mb']:>6.0f} MB"
              f" {r['client_cpu_s']:>9.2f} s {r['server_cpu_s']:>9.2f} s")  # fmt: skip
    g, o = results["gemini-batch"], results["openai-batch"]
    print(f"  gemini-batch / openai-batch: wall {(g['persist_s'] + g['batch_s']) / (o['persist_s'] + o['batch_s']):.2f}x, "
          f"client CPU {g['client_cpu_s'] / o['client_cpu_s']:.2f}x, server CPU {g['server_cpu_s'] / o['server_cpu_s']:.2f}x, "
          f"peak RSS {g['rss_mb'] / o['rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
