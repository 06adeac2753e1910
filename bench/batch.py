"""100,000 requests through `openai-batch` against `lowtide serve` (echo backend, fast clock):
render → persist → chunk → upload → poll → download → ingest → export.

    .venv/bin/python bench/batch.py              # 100,000 requests
    .venv/bin/python bench/batch.py --n 20000 --route anthropic-batch
    .venv/bin/python bench/batch.py --structured  # response_format + tools on every line
    .venv/bin/python bench/batch.py --cli         # then the same job by `lowtide run`, CPU beside the API's
    .venv/bin/python bench/batch.py --cli --cli-terminal --export csv   # ... its live bar drawn; both write CSV

Prints the client's wall and CPU time per phase and its peak RSS (the server is another
process and is not counted; its CPU is printed apart). CPU seconds compare runs on a busy
machine better than wall time does. Runs in a temporary folder that is removed afterwards.

`--cli` then runs the same job again, in a store of its own against the same server, the
way a user does: `lowtide run SPEC --out results.<export>` in a child process, and prints
its CPU (start-up and imports included, as the API process's total includes its own) beside
the API path's. `--cli-terminal` makes it draw its live progress as on a terminal
(TTY_COMPATIBLE=1); otherwise it writes the plain lines it writes to a pipe. `--serve-src
DIR` runs the server from another source folder (e.g. today's `src` while the client runs
from a git worktree of an older commit), so that a client's before/after meets one server.
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
import yaml

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


def start_server(tmp: Path, src: str | None = None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lowtide = Path(sys.executable).with_name("lowtide")
    proc = subprocess.Popen(
        [str(lowtide), "serve", "--backend", "echo", "--port", str(port), "--time-scale", "3600",
         "--db", str(tmp / "server.db"), "--data-dir", str(tmp / "server-data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | ({"PYTHONPATH": str(Path(src).resolve())} if src else {}),
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
    parser.add_argument("--export", default="parquet", choices=["parquet", "csv"], help="the results file both paths write")
    parser.add_argument("--cli", action="store_true", help="then run the same job by `lowtide run` and compare its CPU")
    parser.add_argument("--cli-terminal", action="store_true", help="`lowtide run` draws its live bar, as on a terminal")
    parser.add_argument("--serve-src", help="run the server from this source folder (PYTHONPATH)")
    parser.add_argument("--cli-src", action="append", help="run `lowtide run` from this source folder (repeatable: "
                        "runs alternate, --rounds times, against the one server; implies --cli)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of `lowtide run` runs")
    args = parser.parse_args()
    tune_gc()  # as lowtide's commands do (core/runtime.py)
    n = args.n

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-batch-"))
    server, url = start_server(tmp, args.serve_src)
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
        fields = {
            "name": "bench",
            "source": {"path": str(tmp / "tickets.csv"), "id_column": "ticket_id"},
            "template": {"system": "Classify the ticket.", "user": "Channel: {{ channel }}\n{{ body }}"},
            "model": "gpt-4o-mini",
            "route": args.route,
            "route_options": options,
            "params": {"max_tokens": 64, **(STRUCTURED if args.structured else {})},
        }
        spec = build_spec(fields)
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
        assert export_results(store, "bench", tmp / f"results.{args.export}").rows == n
        timed(f"export ({args.export})", t, c)
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
        api_cpu = client_cpu.ru_utime + client_cpu.ru_stime
        print(f"  client peak RSS {peak_rss_mb():.0f} MB; CPU: client {api_cpu:.1f} s, "
              f"server {cpu_seconds(server.pid) - server_startup_cpu:.1f} s "
              f"(+{server_startup_cpu:.1f} s starting) (on {os.cpu_count()} CPUs)")
        if args.cli or args.cli_src:
            runs = 0
            for _ in range(args.rounds):
                for src in args.cli_src or [None]:
                    runs += 1
                    run_cli(tmp / f"cli-{runs}", fields, args, n, api_cpu, src)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def run_cli(folder: Path, fields: dict, args: argparse.Namespace, n: int, api_cpu: float, src: str | None = None) -> None:
    """The same job by `lowtide run`, in a store of its own: its wall, CPU and exit code."""
    spec_path = folder / "bench.yaml"
    folder.mkdir()
    spec_path.write_text(yaml.safe_dump(fields | {"output": {"path": f"results.{args.export}"}}))
    env = os.environ | {"LOWTIDE_DB": str(folder / "client.db")}
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    if args.cli_terminal:
        env |= {"TTY_COMPATIBLE": "1", "COLUMNS": "120"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("lowtide")), "run", str(spec_path)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, f"lowtide run exited with {done.returncode}"
    assert (folder / f"results.{args.export}").exists()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    shown = "its live bar drawn" if args.cli_terminal else "plain lines, as to a pipe"
    print(f"lowtide run{f' from {src}' if src else ''}, the same {n:,} requests ({shown}; results.{args.export}): wall {wall:.2f} s, CPU {cpu:.1f} s, "
          f"{cpu / api_cpu:.2f}x the API path's {api_cpu:.1f} s (each process's total: start-up and imports too)")


if __name__ == "__main__":
    main()
