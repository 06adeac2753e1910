"""One bench at two commits, interleaved, and the ratio of their CPU and wall time.

    .venv/bin/python bench/compare_commits.py 22d1b94 HEAD -- bench/pipeline.py --n 100000
    .venv/bin/python bench/compare_commits.py HEAD . --rounds 3 -- bench/pipeline.py --n 20000

Each commit is checked out in a git worktree of its own (removed afterwards; `.` is this
checkout as it is, uncommitted changes included) and the bench runs there with this venv's
Python and that tree's `src/` first on `PYTHONPATH`, so each run imports its own commit's
lowtide (checked before the first round) and runs its own copy of the bench script; each
tree's `src/` and `bench/` are byte-compiled first (`compile_tree`), so no run pays for
compiling its tree's modules. Runs
alternate A B A B …, so a neighbour's load falls on both alike. A run's CPU is its process
tree's user + system time (`RUSAGE_CHILDREN`), its wall the time until it exits. Prints each
run, then the median of each side and the ratio B / A: below 1.0, B is cheaper.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout(rev: str, into: Path) -> Path:
    """A worktree of `rev` under `into` (or this checkout for `.`), its sources byte-compiled."""
    tree = ROOT if rev == "." else into / rev.replace("/", "_")
    if rev != ".":
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), rev], check=True, capture_output=True)
    compile_tree(tree)
    return tree


def compile_tree(tree: Path) -> None:
    """Byte-compile the tree's `src/` and `bench/` once, as an installed package is: where
    Python writes no bytecode itself (PYTHONDONTWRITEBYTECODE, set on the development
    machines), every run would compile every module it imports again, and the tree with
    more code would pay more for it (0.2 s a run between 22d1b94 and 2026-12-07's main)."""
    folders = [str(tree / d) for d in ("src", "bench") if (tree / d).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], check=True, capture_output=True)


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(entry_points_of(tree)), *filter(None, [env.get("PYTHONPATH")])])
    return env


def entry_points_of(tree: Path) -> Path:
    """A folder holding a `lowtide` dist-info with `tree`'s own entry points (its
    pyproject.toml's): routes are found by entry point, and the venv's name this checkout's
    modules (routes/ moved to one folder per provider), which an older tree does not have.
    Ahead of site-packages on the path, its distribution is the one importlib.metadata reads."""
    folder = tree / ".compare-entry-points"
    info = folder / "lowtide-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    groups = tomllib.loads((tree / "pyproject.toml").read_text())["project"].get("entry-points", {})
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n" for group, points in groups.items())
    (info / "entry_points.txt").write_text(text)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lowtide\nVersion: 0\n")
    return folder


def imported_from(tree: Path) -> Path:
    out = subprocess.run([sys.executable, "-c", "import lowtide; print(lowtide.__file__)"], env=env_for(tree),
                         cwd=tree, check=True, capture_output=True, text=True)  # fmt: skip
    return Path(out.stdout.strip())


def run_once(tree: Path, argv: list[str], show: bool) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, the bench's output) of one run in `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], env=env_for(tree), cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(argv)} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    if show:
        print(proc.stdout.rstrip())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="the baseline commit (or `.` for this checkout)")
    parser.add_argument("b", help="the commit compared with it (or `.`)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--show", action="store_true", help="print each run's own output")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the bench after --, e.g. -- bench/pipeline.py --n 100000")
    cut = argv.index("--")
    args, bench = parser.parse_args(argv[:cut]), argv[cut + 1 :]

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-compare-"))
    trees: dict[str, Path] = {}
    try:
        for rev in (args.a, args.b):
            trees[rev] = checkout(rev, tmp)
            where = imported_from(trees[rev])
            if not where.is_relative_to(trees[rev]):
                raise SystemExit(f"{rev}: lowtide was imported from {where}, not from its worktree {trees[rev]}")
        times: dict[str, list[tuple[float, float]]] = {args.a: [], args.b: []}
        print(f"{' '.join(bench)}: {args.a} (A) against {args.b} (B), {args.rounds} rounds, interleaved")
        for r in range(args.rounds):
            for rev in (args.a, args.b):
                cpu, wall, _ = run_once(trees[rev], bench, args.show)
                times[rev].append((cpu, wall))
                print(f"  round {r + 1} {rev:<12} CPU {cpu:7.2f}s  wall {wall:7.2f}s", flush=True)
        med = {rev: (statistics.median(c for c, _ in ts), statistics.median(w for _, w in ts)) for rev, ts in times.items()}
        (ca, wa), (cb, wb) = med[args.a], med[args.b]
        print(f"  median A {args.a}: CPU {ca:.2f}s, wall {wa:.2f}s")
        print(f"  median B {args.b}: CPU {cb:.2f}s, wall {wb:.2f}s")
        print(f"  B / A: CPU {cb / ca:.2f}x, wall {wb / wa:.2f}x")
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
