"""Sending a big job's trace: a 100,000-request echo job, exported over OTLP/HTTP to a
receiver on loopback (another process, which decodes every span and counts them).

    .venv/bin/python bench/traces.py               # 100,000 requests
    .venv/bin/python bench/traces.py --n 20000 --chunk 500

Prints the wall time and spans/s of reading the trace from the store alone (no
OpenTelemetry) and of the whole export, and this process's peak RSS before and during the
export (Linux: the peak mark is reset before each step). Needs the otel extra. Runs in a
temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from lowtide.core.clock import SystemClock
from lowtide.core.runtime import tune_gc
from lowtide.engine.loader import load_job
from lowtide.engine.otlp import export_trace
from lowtide.engine.traces import PAGE, job_trace
from lowtide.store.db import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline import bench_spec, make_source, run_to_end  # noqa: E402  (the pipeline bench's job)
from retention import reset_peak, status_mb  # noqa: E402


def receive(ports: mp.Queue) -> None:
    """An OTLP/HTTP receiver: decodes each POST /v1/traces; GET /count answers the spans seen."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    seen = {"spans": 0, "bytes": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            message = ExportTraceServiceRequest.FromString(body)
            seen["spans"] += sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
            seen["bytes"] += len(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            answer = f"{seen['spans']} {seen['bytes']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ports.put(server.server_address[1])
    server.serve_forever()


def build(folder: Path, n: int) -> Store:
    source = folder / "tickets.csv"
    make_source(source, n)
    store = Store(str(folder / "bench.db"))
    load_job(store, bench_spec(source, choices=None, template={"system": "Classify the ticket.", "user": "{{ body }}"}), SystemClock())
    run_to_end(store, n)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=PAGE, help=f"spans per OTLP request (default {PAGE})")
    args = parser.parse_args()
    tune_gc()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-"))
    spawn = mp.get_context("spawn")  # a fresh interpreter: none of this process's memory
    ports = spawn.Queue()
    receiver = spawn.Process(target=receive, args=(ports,), daemon=True)
    try:
        started = time.perf_counter()
        store = build(tmp, args.n)
        print(f"job of {args.n:,} echo requests run in {time.perf_counter() - started:.1f} s; RSS now {status_mb('VmRSS'):.0f} MB")

        reset_peak()
        started = time.perf_counter()
        trace = job_trace(store, "bench", now=time.time(), page=args.chunk)
        records = 1 + sum(len(page) for page in trace.pages())
        took = time.perf_counter() - started
        print(f"read from the store: {records:,} span records in {took:.2f} s ({records / took:,.0f}/s); "
              f"peak RSS {status_mb('VmHWM'):.0f} MB")  # fmt: skip

        receiver.start()
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        reset_peak()
        started = time.perf_counter()
        sent = export_trace("bench", store, endpoint=url, chunk=args.chunk)
        took = time.perf_counter() - started
        import urllib.request

        spans, size = map(int, urllib.request.urlopen(url + "/count").read().split())
        assert spans == sent.spans == records, (spans, sent.spans, records)
        print(f"exported over OTLP/HTTP: {sent.spans:,} spans in {took:.2f} s ({sent.spans / took:,.0f}/s), "
              f"{size / 1e6:.1f} MB of protobuf in chunks of {args.chunk}; peak RSS {status_mb('VmHWM'):.0f} MB")  # fmt: skip
        store.close()
    finally:
        if receiver.is_alive():
            receiver.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
