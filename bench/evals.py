"""An eval of N rows × 6 variants (2 models × 3 prompts) through `openai-batch` against
`lowtide serve` (echo backend, fast clock), then `compare` over its N × 6 results.

    .venv/bin/python bench/evals.py            # 10,000 rows: 60,000 requests
    .venv/bin/python bench/evals.py --n 1000   # a quick run

Prints the wall time and peak RSS of the run (this process: load, submit, poll, ingest) and
of the compare, which runs in a fresh process so that its peak RSS is its own (target: ≤ 2 s
and ≤ 300 MB for 60,000 results). The server is another process and is not counted. Scoring
is exact match against `gold`: echo answers with the user message, so prompt `gold` is always
right, `body` never and `guess` (gold on half the rows) about half the time.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(Path(__file__).parent))
from batch import start_server  # noqa: E402
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.evals import build_eval  # noqa: E402
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.engine.compare import compare  # noqa: E402
from lowtide.engine.evals import load_eval, run_eval, stored_eval  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402

LABELS = ["billing", "technical", "account", "shipping", "feedback"]


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM (ru_maxrss would carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_source(path: Path, n: int) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ticket_id", "body", "gold", "guess"])
        for i in range(n):
            gold = LABELS[i % 5]
            w.writerow([f"t{i:07d}", f"Customer {i} writes about their {gold} problem.", gold, gold if i % 2 else LABELS[(i + 1) % 5]])


def eval_data(source: Path, url: str) -> dict:
    opts = {"base_url": f"{url}/v1"}
    return {
        "name": "bench-eval",
        "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Sort the ticket."},
        "params": {"max_tokens": 16},
        "variants": {
            "models": [{"name": "mini", "model": "gpt-4o-mini", "route": "openai-batch", "route_options": opts},
                       {"name": "big", "model": "gpt-4o", "route": "openai-batch", "route_options": opts}],
            "prompts": [{"name": "gold", "user": "{{ gold }}"}, {"name": "body", "user": "{{ body }}"}, {"name": "guess", "user": "{{ guess }}"}],
        },
        "scoring": {"method": "exact", "expected": "gold"},
    }  # fmt: skip


def compare_only(db: str, name: str) -> None:
    """The child process: time `compare` alone and print its figures as JSON."""
    t = time.perf_counter()
    store = Store(db)
    report = compare(store, stored_eval(store, name))
    wall = time.perf_counter() - t
    print(json.dumps({"wall": wall, "rss": peak_rss_mb(), "results": sum(v.rows for v in report.variants),
                      "accuracy": {v.variant: v.accuracy for v in report.variants}}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--compare-only", nargs=2, metavar=("DB", "EVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    tune_gc()
    if args.compare_only:
        return compare_only(*args.compare_only)
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-evals-"))
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    os.environ["PYTHONPATH"] = str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc, url = start_server(tmp)
    try:
        source = tmp / "rows.csv"
        make_source(source, args.n)
        db = str(tmp / "client.db")
        store = Store(db)
        ev = build_eval(eval_data(source, url), where="bench")
        t0 = time.perf_counter()
        load_eval(store, ev, SystemClock())
        t_load = time.perf_counter() - t0

        async def go():
            async with Engine(store) as engine:
                return await run_eval(engine, ev, SystemClock())

        statuses = asyncio.run(go())
        t_run = time.perf_counter() - t0
        run_rss = peak_rss_mb()
        store.close()
        done = sum(s.counts.get("succeeded", 0) for s in statuses)
        child = subprocess.run([sys.executable, __file__, "--compare-only", db, ev.name], capture_output=True, text=True, check=True)
        c = json.loads(child.stdout.strip().splitlines()[-1])
        total = args.n * len(ev.members)
        print(f"eval: {args.n:,} rows × {len(ev.members)} variants = {total:,} requests through openai-batch → lowtide serve (echo)")
        print(f"run:     {t_run:7.1f} s wall ({t_load:.1f} s load), {total / t_run:,.0f} requests/s, {done:,} succeeded, peak RSS {run_rss:.0f} MB")
        print(f"compare: {c['wall']:7.2f} s wall over {c['results']:,} results, peak RSS {c['rss']:.0f} MB "
              f"(target ≤ 2 s: {c['wall'] / 2:.2f}× of it; ≤ 300 MB: {c['rss'] / 300:.2f}× of it)")  # fmt: skip
        print("accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in c["accuracy"].items()))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
