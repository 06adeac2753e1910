"""Benchmark of the embedded embedding model: lowtide's batching against one document at a time.

    .venv/bin/python bench/embed_local.py [--n 4000] [--serial-n 400] [--repeat 2]
                                          [--batch-sizes 8,32,64] [--threads N]

Documents are synthetic support tickets of 8 to 80 tokens (about 40 on average, the issue's
"short documents"), made from a fixed seed. Runs, in one process, three copies of the model:

- lowtide's (`Embedder(files)`): `embed(all --n documents)`, sorted by length, cut into
  mini-batches of `batch_size` padded to their own longest document, the mini-batches run
  side by side, one lane per core; for the default and each of `--batch-sizes`;
- one run at a time on every thread (`lanes=1`, how one calls a model without lowtide):
  `embed([doc])` for each of `--serial-n` documents, and the same mini-batches one after
  another (what the lanes add);
- on one thread (`threads=1`): one at a time and batched. Batching cannot use more than every
  core, so `cores x (batched rate on one thread)` bounds what it can reach on this machine;
  the bench prints that ceiling beside the speed-up, so a figure below the target says
  whether the model or the batching is the limit.

One at a time is judged at its best: the faster of every thread and one thread.
Each configuration runs `--repeat` times, round-robin, and its fastest run is reported
(the development machines are shared; a neighbour taking a core skews single runs).
Checks that the batched vectors equal the one-at-a-time ones (max abs difference), then
prints documents/s, tokens/s, the speed-up of batching (target >= 3x), CPU time per
document (the steadier figure on a shared machine) and peak RSS.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lowtide.routes.own.local_embed import Embedder  # noqa: E402
from lowtide.routes.own.local_embed.files import default_files  # noqa: E402

OPENERS = [
    "I was charged twice for my subscription this month",
    "The app crashes every time I open the settings page",
    "I cannot log in because the reset email never arrives",
    "My parcel has not arrived after two weeks of waiting",
    "Love the new dashboard design, it is much easier to use",
    "Please refund the last invoice, the amount is wrong",
]
TAILS = [
    "and I would like someone to look into it as soon as possible",
    "which is the third time this has happened since I signed up",
    "even though I already contacted support by phone last Tuesday",
    "so could you tell me what the next steps are",
    "and the tracking page still shows the same status as before",
    "thanks in advance for your help with this",
]


def make_docs(n: int, seed: int = 14) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join([rng.choice(OPENERS)] + rng.sample(TAILS, rng.randint(0, 4))) + "."
        for _ in range(n)
    ]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def timed_cpu(fn) -> tuple[float, float, object]:
    """Wall and CPU seconds of `fn()`: CPU time barely moves when neighbours take the cores."""
    cpu = time.process_time()
    wall, out = timed(fn)
    return wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000, help="documents embedded in batches")
    parser.add_argument("--serial-n", type=int, default=400, help="documents one at a time")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch-sizes", default="8,64", help="extra batch sizes to compare")
    parser.add_argument("--threads", type=int, default=None, help="default: every CPU")
    args = parser.parse_args()

    files = default_files()
    load_s, model = timed(lambda: Embedder(files, args.threads))
    rss_loaded = peak_rss_mb()
    docs = make_docs(args.n)
    serial_docs = docs[: args.serial_n]
    tokens = [model.count_tokens(d) for d in docs]
    print(
        f"{model.model_name} ({model.dimensions} dims) on {model.threads} thread(s) in "
        f"{model.lanes} lane(s), loaded in {load_s:.2f} s; {args.n} documents, "
        f"{np.mean(tokens):.1f} tokens on average ({min(tokens)}-{max(tokens)}), "
        f"{args.serial_n} of them one at a time"
    )

    default = model.batch_size
    sizes = [default] + [int(s) for s in args.batch_sizes.split(",") if s and int(s) != default]
    # The ways to call the model: lowtide's (`model`: mini-batches side by side), one run at
    # a time on every thread (`whole`, how one calls a model without lowtide), and one thread.
    whole = Embedder(files, model.threads, lanes=1) if model.lanes > 1 else model
    single = Embedder(files, 1) if model.threads > 1 else None
    configs: dict[str, tuple[Embedder, int | None]] = {"one at a time": (whole, None)}
    configs |= {f"batched, batch_size={b}": (model, b) for b in sizes}
    if whole is not model:
        configs["batched, one run at a time"] = (whole, default)
    if single is not None:
        configs |= {"one at a time, 1 thread": (single, None), "batched, 1 thread": (single, default)}
    best: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.repeat):
        for name, (runner, size) in configs.items():
            if size is None:
                work = serial_docs
                seconds, cpu, out = timed_cpu(
                    lambda runner=runner: np.array([runner.embed([d])[0] for d in serial_docs])
                )
            else:
                work = docs
                runner.batch_size = size
                seconds, cpu, out = timed_cpu(lambda runner=runner: runner.embed_array(docs))
            best[name] = max(best.get(name, 0.0), len(work) / seconds)
            cpu_ms[name] = min(cpu_ms.get(name, float("inf")), 1000 * cpu / len(work))
            vectors[name] = out
    model.batch_size = default

    # One at a time is judged at its best: on every thread or on one, whichever is faster.
    serial_name = max((n for n in configs if n.startswith("one at a time")), key=best.__getitem__)
    serial_rate = best[serial_name]
    batched_name = f"batched, batch_size={default}"
    diff = np.abs(vectors[batched_name][: args.serial_n] - vectors["one at a time"]).max()
    mean_tokens = float(np.mean(tokens))
    print(f"{'':28}{'docs/s':>10}{'tokens/s':>12}{'vs one at a time':>18}{'CPU ms/doc':>12}")
    for name in configs:
        rate = best[name]
        print(
            f"{name:28}{rate:10.1f}{rate * mean_tokens:12.0f}{rate / serial_rate:17.2f}x"
            f"{cpu_ms[name]:12.2f}"
        )
    ratio = best[batched_name] / serial_rate
    cpu_ratio = cpu_ms[serial_name] / cpu_ms[batched_name]
    verdict = "meets" if ratio >= 3 else "MISSES"
    print(
        f"batching speed-up (default batch_size={default}, against {serial_name!r}): "
        f"{ratio:.2f}x in documents/s ({verdict} the 3x target), "
        f"{cpu_ratio:.2f}x in CPU time per document"
    )
    if single is not None:
        ceiling = model.threads * best["batched, 1 thread"] / serial_rate
        per_core = best["batched, 1 thread"] / best["one at a time, 1 thread"]
        print(
            f"ceiling on {model.threads} cores: {ceiling:.2f}x ({model.threads} x the batched rate "
            f"on one thread, over one at a time at its best); on one core batching gains "
            f"{per_core:.2f}x"
        )
    print(f"batched vectors vs one at a time: max abs difference {diff:.2e}")
    more = ", with the other copies loaded after that" if whole is not model or single else ""
    print(f"peak RSS {peak_rss_mb():.0f} MB (after loading the model: {rss_loaded:.0f} MB{more})")


if __name__ == "__main__":
    main()
