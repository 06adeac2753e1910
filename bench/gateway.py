"""The peak-shaving gateway under load: a fake upstream, `lowtide gateway` and a webhook
receiver, each its own process on loopback, driven by this one.

    .venv/bin/python bench/gateway.py                 # the three phases, 60 s of 500 clients
    .venv/bin/python bench/gateway.py --seconds 15    # a shorter last phase

1. passthrough: sequential chat completions straight to the upstream and through the
   gateway, interleaved, on one keep-alive connection each: p50/p99 of each and the
   overhead the gateway adds (target: p50 ≤ 2 ms); 1b: the same for two allow-listed
   calls, `GET /v1/models` (shared) and `GET /v1/batches/{id}` (owned: checked in the store);
2. deferred: concurrent clients send deferrable requests as fast as they are answered;
   how many are durably accepted (202 after their commit) per second (target ≥ 1,000);
3. mixed: 500 concurrent clients for --seconds, a share of them deferrable (some of those
   "prefer real time": shaved while the upstream is loaded), every deferred one with a
   webhook. Then it waits until every accepted request has run and been delivered, and
   counts errors, lost (accepted, not in the store, not finished or never delivered) and
   duplicated (delivered more than once) requests (target: 0, 0, 0).

Clients speak raw HTTP/1.1 over asyncio streams so the measuring process costs little.
Prints each figure, the ratios to the targets and the gateway's peak RSS. Everything runs
in a temporary folder, removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

KEY = "sk-bench-tenant-key"
SECRET = "bench-webhook-secret"
UPSTREAM_ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
}).encode()  # fmt: skip
BODY = json.dumps({"model": "gpt-4o-mini", "max_tokens": 16,
                   "messages": [{"role": "user", "content": "Classify this ticket: my invoice is wrong."}]}).encode()  # fmt: skip


# The other processes: tiny ASGI apps ------------------------------------------------------
def upstream_app():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(UPSTREAM_ANSWER)).encode())]})
        await send({"type": "http.response.body", "body": UPSTREAM_ANSWER})

    return app


def receiver_app():
    seen: Counter[str] = Counter()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        while (await receive()).get("more_body"):
            pass
        if scope["method"] == "POST":
            seen[headers[b"x-lowtide-delivery"].decode()] += 1
            body = b"{}"
        else:
            body = json.dumps(dict(seen)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def serve_role(role: str, port: int) -> None:
    import uvicorn

    app = upstream_app() if role == "upstream" else receiver_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


# A raw HTTP/1.1 keep-alive client ---------------------------------------------------------
class Conn:
    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: bytes = b"", headers: dict[str, str] | None = None, method: str = "POST") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(head.encode() + b"\r\n" + body)
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", raw)
        if m:
            return status, await self.reader.readexactly(int(m.group(1)))
        data = b""  # chunked
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, data
            data += chunk[:-2]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# Driving ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not start")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def passthrough(up: int, gw: int, n: int) -> dict[str, float]:
    direct, via = Conn(up), Conn(gw)
    auth = {"authorization": f"Bearer {KEY}"}
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    for i in range(n + 200):
        for name, conn, headers in (("direct", direct, {}), ("gateway", via, auth)):
            t = time.perf_counter()
            status, _ = await conn.request("/v1/chat/completions", BODY, headers)
            took = (time.perf_counter() - t) * 1000
            assert status == 200, status
            if i >= 200:  # warm-up
                times[name].append(took)
    direct.close()
    via.close()
    out = {f"{k}_p{p}": pct(v, p) for k, v in times.items() for p in (50, 99)}
    out["overhead_p50"] = out["gateway_p50"] - out["direct_p50"]
    out["overhead_p99"] = out["gateway_p99"] - out["direct_p99"]
    return out


async def scoped(up: int, gw: int, n: int) -> dict[str, float]:
    """The allow-listed passthrough: `GET /v1/models` (shared: routing only) and `GET
    /v1/batches/{id}` (owned: an ownership read in the store first), against the upstream
    called directly. The stub upstream answers every call with one JSON object whose id the
    gateway records as the tenant's file, then batch."""
    direct, via = Conn(up), Conn(gw)
    auth = {"authorization": f"Bearer {KEY}"}
    oid = json.loads(UPSTREAM_ANSWER)["id"]
    assert (await via.request("/v1/files", b"{}", auth))[0] == 200
    assert (await via.request("/v1/batches", json.dumps({"input_file_id": oid}).encode(), auth))[0] == 200
    times: dict[str, list[float]] = {}
    for path in ("/v1/models", f"/v1/batches/{oid}"):
        for i in range(n + 100):
            for name, conn, headers in (("direct", direct, {}), ("gateway", via, auth)):
                t = time.perf_counter()
                status, _ = await conn.request(path, b"", headers, method="GET")
                took = (time.perf_counter() - t) * 1000
                assert status == 200, (path, status)
                if i >= 100:
                    times.setdefault(f"{path.split('/')[2]} {name}", []).append(took)
    direct.close()
    via.close()
    out = {f"{k} p{p}": pct(v, p) for k, v in times.items() for p in (50, 99)}
    for what in ("models", "batches"):
        for p in (50, 99):
            out[f"{what} overhead p{p}"] = out[f"{what} gateway p{p}"] - out[f"{what} direct p{p}"]
    return out


async def deferred_rate(gw: int, clients: int, seconds: float) -> tuple[int, float, int]:
    headers = {"authorization": f"Bearer {KEY}", "x-lowtide-defer": "1h"}
    accepted = errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal accepted, errors
        conn = Conn(gw)
        while time.perf_counter() < stop:
            try:
                status, _ = await conn.request("/v1/chat/completions", BODY, headers)
            except (OSError, asyncio.IncompleteReadError):
                errors += 1
                conn.close()
                continue
            if status == 202:
                accepted += 1
            else:
                errors += 1
        conn.close()

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return accepted, time.perf_counter() - t, errors


async def mixed(gw: int, hook_url: str, clients: int, seconds: float, share: float) -> dict[str, object]:
    auth = {"authorization": f"Bearer {KEY}"}
    defer = {**auth, "x-lowtide-defer": "1h", "x-lowtide-callback": hook_url}
    prefer = {**defer, "x-lowtide-prefer": "realtime"}
    ids: list[str] = []
    counts: Counter[str] = Counter()
    stop = time.perf_counter() + seconds
    rng = random.Random(7)

    async def client() -> None:
        conn = Conn(gw)
        while time.perf_counter() < stop:
            roll = rng.random()
            headers = auth if roll >= share else (defer if roll < share / 2 else prefer)
            try:
                status, body = await conn.request("/v1/chat/completions", BODY, headers)
            except (OSError, asyncio.IncompleteReadError) as err:
                counts[f"error {type(err).__name__}"] += 1
                conn.close()
                continue
            if status == 202:
                ids.append(json.loads(body)["id"])
                counts["202"] += 1
            elif status == 200:
                counts["200"] += 1
            else:
                counts[f"error {status}"] += 1
        conn.close()

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"ids": ids, "counts": counts, "wall": time.perf_counter() - t}


async def get_json(port: int, path: str) -> object:
    conn = Conn(port)
    status, body = await conn.request(path, method="GET", headers={"authorization": f"Bearer {KEY}"})
    conn.close()
    return json.loads(body) if path != "/metrics" else body.decode()


def store_rows(db: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(db, timeout=60) as conn:
        return {i: (s, d) for i, s, d in conn.execute("select id, state, delivery from gateway_requests")}


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the 500-client phase")
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--share", type=float, default=0.4, help="deferrable share of the mixed phase")
    parser.add_argument("--latency-n", type=int, default=2000, help="sequential requests per path in phase 1")
    parser.add_argument("--scoped-n", type=int, default=500, help="sequential GETs per path in phase 1b (0: skip it)")
    parser.add_argument("--deferred-seconds", type=float, default=10.0)
    parser.add_argument("--deferred-clients", type=int, default=64)
    parser.add_argument("--upstream-connections", type=int, default=64, help="the gateway's upstreams.openai.max_connections")
    parser.add_argument("--role", choices=["upstream", "receiver"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return serve_role(args.role, args.port)

    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-gateway-"))
    procs: list[subprocess.Popen] = []
    try:
        up, rec, gw = free_port(), free_port(), free_port()
        for role, port in (("upstream", up), ("receiver", rec)):
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", role, "--port", str(port)]))
            wait_port(port, procs[-1], role)
        config = {
            "data_dir": str(tmp / "data"),
            "upstreams": {"openai": {"base_url": f"http://127.0.0.1:{up}/v1", "max_connections": args.upstream_connections,
                                     "limits": {"max_in_flight": 100, "threshold": 0.8}}},
            "batch": {"openai": {"route": "echo-batch", "route_options": {"dir": str(tmp / "provider"), "max_requests": 50000},
                                 "expected_turnaround": 5, "fallback": "none"}},
            "collector": {"flush_size": 5000, "flush_age": 2},
            "tenants": [{"name": "bench", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
            "callbacks": {"allow_loopback": True},
            "webhooks": {"secret_env": "LOWTIDE_BENCH_WEBHOOK_SECRET", "concurrency": 64},
        }
        (tmp / "gateway.yaml").write_text(json.dumps(config))
        db = tmp / "gateway.db"
        lowtide = str(Path(sys.executable).with_name("lowtide"))
        env = {**os.environ, "LOWTIDE_BENCH_WEBHOOK_SECRET": SECRET}
        procs.append(subprocess.Popen([lowtide, "--db", str(db), "gateway", "--config", str(tmp / "gateway.yaml"), "--port", str(gw)],
                                      env=env, stderr=subprocess.DEVNULL))  # fmt: skip
        gateway = procs[-1]
        wait_port(gw, gateway, "lowtide gateway")

        print(f"gateway bench: upstream, receiver and `lowtide gateway` on loopback; {os.cpu_count()} CPU(s); SQLite store")
        cpu = cpu_seconds(gateway.pid)
        lat = asyncio.run(passthrough(up, gw, args.latency_n))
        cpu, used = cpu_seconds(gateway.pid), cpu_seconds(gateway.pid) - cpu
        print(f"1. passthrough, {args.latency_n} sequential requests each way (ms):")
        print(f"   direct  p50 {lat['direct_p50']:.2f}  p99 {lat['direct_p99']:.2f}")
        print(f"   gateway p50 {lat['gateway_p50']:.2f}  p99 {lat['gateway_p99']:.2f}")
        print(f"   overhead p50 {lat['overhead_p50']:.2f}  p99 {lat['overhead_p99']:.2f}   "
              f"(target p50 ≤ 2 ms: {lat['overhead_p50'] / 2:.2f}× the budget)")  # fmt: skip
        print(f"   gateway CPU {used * 1000 / args.latency_n:.2f} ms per forwarded request")
        if args.scoped_n:
            sc = asyncio.run(scoped(up, gw, args.scoped_n))
            cpu = cpu_seconds(gateway.pid)
            print(f"1b. allow-listed passthrough, {args.scoped_n} sequential GETs each way (ms overhead over direct):")
            print(f"   /v1/models (shared)        p50 {sc['models overhead p50']:.2f}  p99 {sc['models overhead p99']:.2f}")
            print(f"   /v1/batches/{{id}} (owned)   p50 {sc['batches overhead p50']:.2f}  p99 {sc['batches overhead p99']:.2f}")

        n, wall, errors = asyncio.run(deferred_rate(gw, args.deferred_clients, args.deferred_seconds))
        cpu, used = cpu_seconds(gateway.pid), cpu_seconds(gateway.pid) - cpu
        rate = n / wall
        print(f"2. deferred: {n:,} accepted in {wall:.1f} s by {args.deferred_clients} clients = {rate:,.0f}/s, "
              f"{errors} errors   (target ≥ 1,000/s: {rate / 1000:.2f}×)")  # fmt: skip
        print(f"   gateway CPU {used * 1000 / max(n, 1):.2f} ms per accepted request (collector included): "
              f"{max(n, 1) / max(used, 1e-9):,.0f} accepted per CPU-second")  # fmt: skip

        hook = f"http://127.0.0.1:{rec}/hook"
        cpu, up_cpu, me = cpu_seconds(gateway.pid), cpu_seconds(procs[0].pid), time.process_time()
        run = asyncio.run(mixed(gw, hook, args.clients, args.seconds, args.share))
        cpu, used = cpu_seconds(gateway.pid), cpu_seconds(gateway.pid) - cpu
        ids, counts = run["ids"], run["counts"]
        total = sum(counts.values())
        errors = sum(v for k, v in counts.items() if k.startswith("error"))
        print(f"3. mixed: {args.clients} clients for {run['wall']:.0f} s, {args.share:.0%} deferrable: {total:,} requests "
              f"({total / run['wall']:,.0f}/s): {counts['200']:,} real time, {counts['202']:,} deferred, {errors} errors {dict(counts) if errors else ''}")  # fmt: skip
        print(f"   gateway CPU {used * 1000 / max(total, 1):.2f} ms per request ({used / run['wall']:.0%} of a core); "
              f"upstream {(cpu_seconds(procs[0].pid) - up_cpu) / run['wall']:.0%}, the clients {(time.process_time() - me) / run['wall']:.0%}")  # fmt: skip
        metrics = asyncio.run(get_json(gw, "/metrics"))
        shaved = re.search(r"^lowtide_gateway_shaved_ratio (\S+)$", metrics, re.M)
        print(f"   shaved share (whole run): {float(shaved.group(1)) if shaved else float('nan'):.1%}")

        t = time.monotonic()
        all_ids = set(ids)
        while time.monotonic() - t < 600:
            rows = store_rows(db)
            delivered = asyncio.run(get_json(rec, "/ids"))
            finished = sum(1 for i in all_ids if rows.get(i, ("", ""))[1] == "delivered")
            if finished == len(all_ids) and all(i in delivered for i in all_ids):
                break
            time.sleep(1)
        drained = time.monotonic() - t
        rows = store_rows(db)
        lost = [i for i in all_ids if rows.get(i, ("", ""))[0] != "succeeded" or i not in delivered]
        dups = {i: c for i, c in delivered.items() if c > 1}
        print(f"   drained in {drained:.0f} s: {len(all_ids):,} deferred accepted, lost {len(lost)}, "
              f"duplicated deliveries {len(dups)}, id clashes {len(ids) - len(all_ids)}")  # fmt: skip
        print(f"   gateway peak RSS {peak_rss_mb(gateway.pid):.0f} MB; store {db.stat().st_size / 2**20:.0f} MB")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
