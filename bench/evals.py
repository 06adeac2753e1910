"""An eval of N rows × 6 variants (2 models × 3 prompts) through `openai-batch` against
`lowtide serve` (echo backend, fast clock), then `compare` over its N × 6 results.

    .venv/bin/python bench/evals.py            # 10,000 rows: 60,000 requests
    .venv/bin/python bench/evals.py --n 1000   # a quick run
    .venv/bin/python bench/evals.py --keep /tmp/ev60k --rounds 3              # build once, compare 3 times
    .venv/bin/python bench/evals.py --keep /tmp/ev60k --ab /tmp/wt-base/src   # before/after, interleaved

Prints the wall time and peak RSS of the run (this process: load, submit, poll, ingest), then
times the compare over the eval's N × 6 results two ways, each in a fresh process so that its
figures are its own: `compare()` alone (after the imports), and the whole `lowtide compare
EVAL --json` command (interpreter start and imports included). For each: wall, CPU (user +
system) and peak RSS (VmHWM) (target: ≤ 2 s of CPU and ≤ 300 MB for 60,000 results). The
server is another process and is not counted. Scoring is exact match against `gold`: echo
answers with the user message, so prompt `gold` is always right, `body` never and `guess`
(gold on half the rows) about half the time.

`--keep DIR` builds the store in DIR and keeps it; a later run with the same DIR skips the
run and only compares. `--ab SRC` times the compare of another lowtide source tree (a git
worktree's `src`, say) too, alternating with this checkout's, `--rounds` times each.
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

# The lowtide timed: this checkout's, or (in `--ab`'s children) the tree named by LOWTIDE_BENCH_SRC.
SRC = Path(os.environ.get("LOWTIDE_BENCH_SRC") or Path(__file__).resolve().parent.parent / "src")
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(Path(__file__).parent))
# What the compare child needs; the run's own imports (engine, routes, server) are in build().
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.engine.compare import compare  # noqa: E402
from lowtide.engine.evals import stored_eval  # noqa: E402
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
    t, c = time.perf_counter(), time.process_time()
    store = Store(db)
    report = compare(store, stored_eval(store, name))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"wall": wall, "cpu": cpu, "rss": peak_rss_mb(), "results": sum(v.rows for v in report.variants),
                      "accuracy": {v.variant: v.accuracy for v in report.variants}}))  # fmt: skip


def timed_child(argv: list[str], env: dict) -> tuple[float, float, str]:
    """Run a command; its wall and CPU (user + system: the children's rusage, before and after)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, proc.stdout


def time_compare(db: str, name: str, src: Path) -> dict:
    """`compare()` in a child, then the `lowtide compare` command, both on the lowtide at `src`."""
    env = {**os.environ, "PYTHONPATH": str(src), "LOWTIDE_BENCH_SRC": str(src), "LOWTIDE_DB": db}
    _, _, out = timed_child([sys.executable, __file__, "--compare-only", db, name], env)
    c = json.loads(out.strip().splitlines()[-1])
    wall, cpu, out = timed_child([str(Path(sys.executable).with_name("lowtide")), "compare", name, "--json"], env)
    json.loads(out)  # the whole report came out
    c["cli"] = {"wall": wall, "cpu": cpu}
    return c


def print_compare(c: dict, label: str = "") -> None:
    print(f"compare{label}: {c['wall']:6.2f} s wall, {c['cpu']:5.2f} s CPU over {c['results']:,} results, peak RSS {c['rss']:.0f} MB "
          f"(target ≤ 2 s CPU: {c['cpu'] / 2:.2f}× of it; ≤ 300 MB: {c['rss'] / 300:.2f}× of it)")  # fmt: skip
    print(f"  `lowtide compare --json`, the whole command: {c['cli']['wall']:6.2f} s wall, {c['cli']['cpu']:5.2f} s CPU")


def build(tmp: Path, n: int) -> tuple[str, str]:
    """Run the eval of `n` rows into a store in `tmp`; print the run's figures; (db, eval name)."""
    from batch import start_server
    from lowtide.core.clock import SystemClock
    from lowtide.core.evals import build_eval
    from lowtide.engine.evals import load_eval, run_eval
    from lowtide.engine.tick import Engine

    os.environ.setdefault("OPENAI_API_KEY", "bench")
    os.environ["PYTHONPATH"] = str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc, url = start_server(tmp)
    try:
        source = tmp / "rows.csv"
        make_source(source, n)
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
        total = n * len(ev.members)
        print(f"eval: {n:,} rows × {len(ev.members)} variants = {total:,} requests through openai-batch → lowtide serve (echo)")
        print(f"run:     {t_run:7.1f} s wall ({t_load:.1f} s load), {total / t_run:,.0f} requests/s, {done:,} succeeded, peak RSS {run_rss:.0f} MB")
        return db, ev.name
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="build the store in this folder and keep it (reused when there)")
    parser.add_argument("--rounds", type=int, default=1, help="times the compare is timed (each tree, alternating)")
    parser.add_argument("--ab", type=Path, help="another lowtide src tree whose compare is timed too (before/after)")
    parser.add_argument("--compare-only", nargs=2, metavar=("DB", "EVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    tune_gc()
    if args.compare_only:
        return compare_only(*args.compare_only)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="lowtide-bench-evals-"))
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        if (tmp / "client.db").exists():
            db, name = str(tmp / "client.db"), "bench-eval"
            print(f"eval: the store kept in {tmp} (not run again)")
        else:
            db, name = build(tmp, args.n)
        trees = [("", SRC)] + ([(f" [{args.ab}]", args.ab)] if args.ab else [])
        for _ in range(args.rounds):
            for label, src in trees:
                c = time_compare(db, name, src)
                print_compare(c, label)
        print("accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in c["accuracy"].items()))
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
