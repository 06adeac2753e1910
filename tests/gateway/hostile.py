"""Webhook receivers that misbehave, on raw loopback sockets (an HTTP framework would not
let them misbehave this way): each reads the request, then answers as its `mode` says.

    drip     a status line, then header lines, one byte every `interval` seconds for ever:
             a per-read timeout never fires
    flood    `200 OK` and a body of `flood_bytes` (600 MB by default), as fast as it is read
    hold     nothing until `release` is set, then `200 OK`
    ok       `200 OK` at once

It counts the connections it has open and the body bytes the network took from it (what
was written past its own buffer), so a test can bound what the gateway read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

CHUNK = b"\0" * (1 << 20)
STATUS = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


@dataclass
class Hostile:
    mode: str = "ok"
    interval: float = 0.05
    flood_bytes: int = 600 * (1 << 20)
    url: str = ""
    requests: int = 0  # requests read whole
    open: int = 0  # connections open now
    most_open: int = 0
    sent: int = 0  # body bytes handed to the network (flood)
    release: threading.Event = field(default_factory=threading.Event)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:  # one request after another on a kept-alive connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                self.requests += 1
                if self.mode == "drip":
                    line = b"HTTP/1.1 200 OK\r\n"
                    while True:  # a status line, then header lines for ever, at the adversary's pace
                        for byte in line:
                            writer.write(bytes([byte]))
                            await writer.drain()
                            await asyncio.sleep(self.interval)
                        line = b"x-drip: 1\r\n"
                if self.mode == "flood":
                    writer.write(STATUS % self.flood_bytes)
                    left = self.flood_bytes
                    while left > 0:
                        piece = CHUNK[: min(left, len(CHUNK))]
                        writer.write(piece)
                        await writer.drain()  # returns once the network took it (below the buffer's mark)
                        self.sent += len(piece)
                        left -= len(piece)
                    continue
                if self.mode == "hold":
                    await asyncio.to_thread(self.release.wait, 60)
                writer.write(STATUS % 2 + b"{}")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the gateway hung up: what it is meant to do
        finally:
            self.open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextmanager
def hostile(mode: str, **kw: object) -> Iterator[Hostile]:
    """A Hostile receiver on a loopback port, its own event loop on a thread."""
    receiver = Hostile(mode, **kw)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    server: asyncio.Server | None = None

    async def serve() -> None:
        nonlocal server
        server = await asyncio.start_server(receiver._answer, "127.0.0.1", 0)
        receiver.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    started.wait(10)
    try:
        yield receiver
    finally:
        receiver.release.set()

        async def stop() -> None:
            assert server is not None
            server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
