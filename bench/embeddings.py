"""1,000,000 short documents (~40 tokens each) into vectors through `openai-batch` against
`lowtide serve` (echo backend, fast clock), packed: render → persist → pack → upload →
poll → download → unpack → ingest → export (Parquet fixed_size_list<float32>).

    .venv/bin/python bench/embeddings.py               # 1,000,000 documents
    .venv/bin/python bench/embeddings.py --n 50000     # a quick run
    .venv/bin/python bench/embeddings.py --no-packing  # one row per provider request, to compare

Prints the client's wall time per phase, its peak RSS (the server is another process and is
not counted), and how many provider requests (batch lines) and batches it took. Targets
(issue 14): client wall ≤ 120 s and client peak RSS ≤ 300 MB for 1,000,000 documents.
Vectors are `dimensions: 8` so that the server's output files stay small; the client's work
per row hardly depends on the length.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import openai
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).parent))
from batch import cpu_seconds, start_server  # noqa: E402
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.core.spec import build_spec  # noqa: E402
from lowtide.engine.export import export_results  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.runner import drive  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from lowtide.store.schema import dispatches  # noqa: E402
from pipeline import peak_rss_mb  # noqa: E402

WORDS = ["search", "index", "vector", "cluster", "product", "ticket", "customer", "order", "refund", "shipping", "billing", "account", "password"]


def make_docs(path: Path, n: int) -> None:
    """~40 tokens (~160 characters) of text per document, varied per row."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["doc_id", "text"])
        for i in range(n):
            words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(22)]
            w.writerow([f"doc-{i}", f"document {i}: " + " ".join(words)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--no-packing", action="store_true", help="one row per provider request")
    parser.add_argument("--chunk", type=int, default=None, help="rows per batch (the spec's chunk_size)")
    args = parser.parse_args()
    tune_gc()
    n = args.n
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-emb-"))
    server, url = start_server(tmp)
    os.environ["LOWTIDE_BENCH_KEY"] = "bench"
    try:
        make_docs(tmp / "docs.csv", n)
        spec = build_spec({
            "name": "vectors",
            "source": {"path": str(tmp / "docs.csv"), "id_column": "doc_id"},
            "template": {"user": "{{ text }}"},
            "model": "text-embedding-3-small", "endpoint": "embeddings", "params": {"dimensions": 8},
            "route": "openai-batch", "packing": not args.no_packing, "chunk_size": args.chunk,
            "route_options": {"base_url": f"{url}/v1", "api_key_env": "LOWTIDE_BENCH_KEY", "poll_interval": [0.2, 0.5]},
        })  # fmt: skip
        store = Store(str(tmp / "client.db"))
        phases: dict[str, float] = {}
        t = time.perf_counter()
        load_job(store, spec, SystemClock())
        phases["render + persist"] = time.perf_counter() - t
        print(f"  (peak RSS after render + persist: {peak_rss_mb():.0f} MB)")

        async def run():
            async with Engine(store) as engine:
                status = await drive(engine, "vectors")
            assert status.counts == {"succeeded": n}, (status.counts, status.failures, status.events)

        t = time.perf_counter()
        if os.environ.get("BENCH_PROFILE"):  # where the client's run phase spends its time
            import cProfile

            cProfile.runctx("asyncio.run(run())", globals(), {"run": run, "asyncio": asyncio}, os.environ["BENCH_PROFILE"])
        else:
            asyncio.run(run())
        phases["pack, upload, poll, download, unpack, ingest"] = time.perf_counter() - t
        print(f"  (peak RSS after the batches: {peak_rss_mb():.0f} MB)")
        t = time.perf_counter()
        assert export_results(store, "vectors", tmp / "vectors.parquet").rows == n
        phases["export (parquet)"] = time.perf_counter() - t
        with store.begin() as conn:
            batches = conn.execute(select(func.count()).select_from(dispatches)).scalar_one()
            if os.environ.get("BENCH_TIMELINE"):
                for d in conn.execute(select(dispatches.c.created_at, dispatches.c.submitted_at, dispatches.c.ended_at)):
                    print("  dispatch: planned", d.created_at, "submitted +%.1f s" % (d.submitted_at - d.created_at),
                          "ended +%.1f s" % (d.ended_at - d.created_at))
        store.close()
        # Provider requests as the provider counted them: each batch's request_counts.total.
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench")
        lines = sum(b.request_counts.total for b in client.batches.list(limit=100) if b.request_counts)
        total = sum(phases.values())
        print(f"openai-batch against lowtide serve (echo backend): {n:,} documents, packing {'off' if args.no_packing else 'on'}")
        for name, secs in phases.items():
            print(f"  {name:<46} {secs:7.2f} s")
        print(f"  {'total':<46} {total:7.2f} s  {n / total:,.0f} docs/s  (target ≤ 120 s for 1,000,000)")
        print(f"  provider requests (batch lines uploaded): {lines:,} ({n / max(lines, 1):,.0f} rows per request); batches: {batches}")
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        print(f"  client peak RSS {peak_rss_mb():.0f} MB (target ≤ 300 MB); CPU: client {cpu.ru_utime + cpu.ru_stime:.1f} s, "
              f"server {cpu_seconds(server.pid):.1f} s (on {os.cpu_count()} CPUs)")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
