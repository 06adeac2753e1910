"""100,000 requests through `openai-batch` against `lowtide serve` (echo backend, fast clock):
render → persist → chunk → upload → poll → download → ingest → export.

    .venv/bin/python bench/batch.py              # 100,000 requests
    .venv/bin/python bench/batch.py --n 20000 --route anthropic-batch
    .venv/bin/python bench/batch.py --structured  # response_format + tools on every line

Prints the client's wall and CPU time per phase and its peak RSS (the server is another
process and is not counted; its CPU is printed apart). CPU seconds compare runs on a busy
machine better than wall time does. Runs in a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.runtime import tune_gc  # noqa: E402
from lowtide.core.spec import build_spec  # noqa: E402
from lowtide.engine.export import export_results  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.runner import drive  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from pipeline import make_source, peak_rss_mb  # noqa: E402


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lowtide = Path(sys.executable).with_name("lowtide")
    proc = subprocess.Popen(
        [str(lowtide), "serve", "--backend", "echo", "--port", str(port), "--time-scale", "3600",
         "--db", str(tmp / "server.db"), "--data-dir", str(tmp / "server-data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # a bare connect until it listens: an httpx client per try costs CPU
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            httpx.get(f"{url}/v1/batches", timeout=5)
            return proc, url
        except (OSError, httpx.TransportError):
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("lowtide serve did not start")


# A structured-extraction job as users send it: a strict JSON Schema answer and a tool.
STRUCTURED = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "ticket", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["label", "urgent"],
        "properties": {"label": {"type": "string", "enum": ["billing", "technical", "account", "shipping"]},
                       "urgent": {"type": "boolean"}}}}},
    "tools": [{"type": "function", "function": {"name": "escalate", "description": "Escalate the ticket to a human.",
               "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}}}],
    "tool_choice": "auto",
}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--route", default="openai-batch", choices=["openai-batch", "anthropic-batch"])
    parser.add_argument("--structured", action="store_true", help="every line carries response_format and tools (openai-batch)")
    args = parser.parse_args()
    tune_gc()  # as lowtide's commands do (core/runtime.py)
    n = args.n

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-batch-"))
    server, url = start_server(tmp)
    server_startup_cpu = cpu_seconds(server.pid)  # imports and the SDK types it checks lines against
    os.environ["LOWTIDE_BENCH_KEY"] = "bench"
    try:
        make_source(tmp / "tickets.csv", n)
        base = f"{url}/v1" if args.route == "openai-batch" else url
        options = {"base_url": base, "api_key_env": "LOWTIDE_BENCH_KEY", "poll_interval": [0.2, 0.5]}
        if args.route == "anthropic-batch":
            options["find_window"] = 10**7  # the server's clock runs fast
        phases: dict[str, tuple[float, float]] = {}
        t, c = time.perf_counter(), time.process_time()
        spec = build_spec(
            {
                "name": "bench",
                "source": {"path": str(tmp / "tickets.csv"), "id_column": "ticket_id"},
                "template": {"system": "Classify the ticket.", "user": "Channel: {{ channel }}\n{{ body }}"},
                "model": "gpt-4o-mini",
                "route": args.route,
                "route_options": options,
                "params": {"max_tokens": 64, **(STRUCTURED if args.structured else {})},
            }
        )
        phases["check the spec"] = (time.perf_counter() - t, time.process_time() - c)

        def timed(name: str, t: float, c: float) -> None:
            phases[name] = (time.perf_counter() - t, time.process_time() - c)

        store = Store(str(tmp / "client.db"))
        t, c = time.perf_counter(), time.process_time()
        load_job(store, spec, SystemClock())
        timed("render + persist", t, c)
        print(f"  (peak RSS after render + persist: {peak_rss_mb():.0f} MB)")

        async def run():
            async with Engine(store) as engine:
                status = await drive(engine, "bench")
            assert status.counts == {"succeeded": n}, (status.counts, status.failures, status.events)

        t, c = time.perf_counter(), time.process_time()
        asyncio.run(run())
        timed("chunk, upload, poll, download, ingest", t, c)
        t, c = time.perf_counter(), time.process_time()
        assert export_results(store, "bench", tmp / "results.parquet").rows == n
        timed("export (parquet)", t, c)
        store.close()

        total = sum(wall for wall, _ in phases.values())
        total_cpu = sum(cpu for _, cpu in phases.values())
        what = " with response_format + tools on every line" if args.structured else ""
        print(f"{args.route} against lowtide serve (echo backend): {n:,} requests{what}")
        print(f"  {'phase':<38} {'wall':>7}   {'CPU':>7}")
        for name, (wall, cpu) in phases.items():
            print(f"  {name:<38} {wall:7.2f} s {cpu:7.2f} s")
        print(f"  {'total':<38} {total:7.2f} s {total_cpu:7.2f} s  {n / total:,.0f} req/s")
        client_cpu = resource.getrusage(resource.RUSAGE_SELF)
        print(f"  client peak RSS {peak_rss_mb():.0f} MB; CPU: client {client_cpu.ru_utime + client_cpu.ru_stime:.1f} s, "
              f"server {cpu_seconds(server.pid) - server_startup_cpu:.1f} s "
              f"(+{server_startup_cpu:.1f} s starting) (on {os.cpu_count()} CPUs)")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
