"""The `openai-compatible` direct route against OpenAI-compatible servers on loopback.

    .venv/bin/python bench/direct.py              # (a) 20,000 requests, (b) adaptive vs a sweep
    .venv/bin/python bench/direct.py --n 5000     # a shorter (a)

(a) Client speed. The server is a minimal asyncio HTTP/1.1 server in a separate process that
    answers every request at once with one fixed JSON body, so what is measured is the
    client. Requests/s sustained by the route's `execute`, then by a naive client
    (AsyncOpenAI + asyncio.gather under a semaphore of the same concurrency, parsing the
    SDK's models), with the CPU time each spent per request.
(b) The adaptive controller. The server simulates continuous batching whose throughput
    peaks and then falls: latency = base × (1 + (in flight / best)²), so throughput
    (in flight / latency) is highest at `best` in flight. A sweep of fixed concurrencies
    finds the best fixed throughput; the adaptive route then runs from a start below and a
    start above the peak. Figures are for the whole run (including finding the peak) and for
    its second half (where it holds).

Prints requests/s, ratios and the process's peak RSS. The server runs in its own process,
so on a 2-core machine client and server each have about one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

INSTANT_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "billing"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
    }
).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(INSTANT_BODY),
    INSTANT_BODY,
)
BASE, BEST = 0.05, 48  # (b): 50 ms alone; throughput peaks at 48 in flight


# -- the server (runs in its own process: `bench/direct.py --serve MODE`) ------------------------


def serve(mode: str) -> None:
    in_flight = 0

    class Http(asyncio.Protocol):
        def connection_made(self, transport):  # type: ignore[no-untyped-def]
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            nonlocal in_flight
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                if mode == "instant":
                    self.transport.write(RESPONSE)
                    continue
                in_flight += 1
                latency = BASE * (1 + (in_flight / BEST) ** 2)
                loop.call_later(latency, self.reply)

        def reply(self) -> None:
            nonlocal in_flight
            in_flight -= 1
            if not self.transport.is_closing():
                self.transport.write(RESPONSE)

    async def main() -> None:
        server = await loop.create_server(Http, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())


class Server:
    def __init__(self, mode: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", mode], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().strip()}/v1"

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- the clients ------------------------------------------------------------------------------------


def requests(n: int):  # type: ignore[no-untyped-def]
    from lowtide.core.types import Request

    return [
        Request.chat(
            custom_id=f"t{i:07d}",
            model="bench",
            messages=[
                {"role": "system", "content": "Classify the ticket: billing, technical, account, shipping."},
                {"role": "user", "content": f"Customer {i} writes: my invoice shows a double charge."},
            ],
            max_tokens=4,
        )
        for i in range(n)
    ]


async def run_route(url: str, n: int, options: dict) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, second-half requests/s, final limit)"""
    from lowtide.routes.openai.direct import OpenAIChatRoute

    route = OpenAIChatRoute("openai-compatible", {"base_url": url, **options})
    work = requests(n)
    done = 0
    half_at = 0.0
    t, c = time.perf_counter(), time.process_time()
    async for outcome in route.execute(work):
        assert outcome.ok, outcome.error_message
        done += 1
        if done == n // 2:
            half_at = time.perf_counter()
    end, cpu = time.perf_counter(), time.process_time() - c
    limit = route.controller.limit
    await route.aclose()
    return end - t, cpu, (n - n // 2) / (end - half_at), limit


async def run_naive(url: str, n: int, concurrency: int) -> tuple[float, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="no-key", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(r) -> str:  # type: ignore[no-untyped-def]
        async with gate:
            answer = await client.chat.completions.create(model=r.model, messages=r.messages, max_tokens=r.output_limit)
            assert answer.usage is not None
            return answer.choices[0].message.content or ""

    work = requests(n)
    t, c = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(r) for r in work))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    await client.close()
    return wall, cpu


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000, help="requests in (a)")
    parser.add_argument("--concurrency", type=int, default=64, help="in flight in (a), for both clients")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    print(f"direct routes on loopback; load average before the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    n, c = args.n, args.concurrency
    with Server("instant") as server:
        asyncio.run(run_route(server.url, 500, {"concurrency": c, "adaptive": False}))  # warm up
        wall, cpu, _, _ = asyncio.run(run_route(server.url, n, {"concurrency": c, "adaptive": False}))
        naive_wall, naive_cpu = asyncio.run(run_naive(server.url, n, c))
        a_wall, a_cpu, _, a_limit = asyncio.run(run_route(server.url, n, {"concurrency": c}))
    print(f"(a) instant server, {n:,} requests, {c} in flight")
    print(f"  {'client':<34} {'req/s':>8} {'CPU/req':>9}")
    print(f"  {'openai-compatible execute':<34} {n / wall:>8,.0f} {cpu / n * 1e6:>7,.0f}µs")
    adaptive = f"  same, adaptive (ended at {a_limit})"
    print(f"  {adaptive:<34} {n / a_wall:>8,.0f} {a_cpu / n * 1e6:>7,.0f}µs")
    print(f"  {'naive AsyncOpenAI + gather':<34} {n / naive_wall:>8,.0f} {naive_cpu / n * 1e6:>7,.0f}µs")
    print(f"  route / naive: {naive_wall / wall:.2f}x requests/s   (target: ≥ 2,000 req/s and ≥ 1.5x)")

    print(f"(b) continuous-batching server: latency {BASE * 1000:.0f} ms × (1 + (in flight / {BEST})²)")
    sweep = {}
    with Server("batching") as server:
        for fixed in (16, 24, 32, 48, 64, 96, 128):
            count = 1500
            wall, _, _, _ = asyncio.run(run_route(server.url, count, {"concurrency": fixed, "adaptive": False}))
            sweep[fixed] = count / wall
        best_c = max(sweep, key=sweep.__getitem__)
        best = sweep[best_c]
        print("  fixed: " + "  ".join(f"{k}: {v:,.0f}" for k, v in sweep.items()) + "  (req/s)")
        print(f"  best fixed: {best:,.0f} req/s at {best_c} in flight (model optimum {BEST}: {BEST / (2 * BASE):,.0f} req/s)")
        for start in (8, 128):
            count = 6000
            wall, _, late, limit = asyncio.run(run_route(server.url, count, {"concurrency": start, "max_concurrency": 512}))
            print(
                f"  adaptive from {start:>3}: whole run {count / wall:,.0f} req/s ({count / wall / best:.0%} of best fixed), "
                f"second half {late:,.0f} req/s ({late / best:.0%}), ended at {limit} in flight   (target: within 10 %)"
            )
    print(f"  peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
