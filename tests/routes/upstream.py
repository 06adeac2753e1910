"""A real HTTP/1.1 server on loopback that speaks just enough of OpenAI's
`/v1/chat/completions` and Anthropic's `/v1/messages` for the direct routes' tests.

It runs its own event loop in a thread. Requests are told apart by the content of their
last user message (the tests put the custom_id there). For each such key the test can
script replies in order (`plan(key, Reply(...), ...)`): a status with headers, a delay, a
dropped connection; once a key's script is used up, it answers 200. Every request is
recorded (`seen`) with the server's monotonic arrival and answer times, and the most
requests it ever had in flight (`max_in_flight`).

Latency for unscripted answers: `latency` seconds, or with `batching=(base, k)` the
latency of a continuous-batching server, base + k × requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

OPENAI_USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 5,
    "total_tokens": 16,
    "prompt_tokens_details": {"cached_tokens": 3},
    "completion_tokens_details": {"reasoning_tokens": 2},
}
ANTHROPIC_USAGE = {"input_tokens": 11, "output_tokens": 5, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 4}
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 408: "Request Timeout",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable", 529: "Overloaded"}  # fmt: skip


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float | None = None
    drop: bool = False
    # The error's message and code; "{key}" in the message becomes the API key the client sent.
    message: str = "scripted failure"
    code: str | None = None


@dataclass
class Seen:
    path: str
    key: str
    body: dict[str, Any]
    headers: dict[str, str]
    arrived: float
    answered: float | None = None
    status: int | None = None


class Upstream:
    def __init__(self, *, latency: float = 0.0, batching: tuple[float, float] | None = None, total_slots: int | None = None):
        self.latency = latency
        self.batching = batching
        self.total_slots = total_slots
        self.script: dict[str, list[Reply]] = {}
        self.seen: list[Seen] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    # -- for tests --------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def plan(self, key: str, *replies: Reply) -> None:
        self.script.setdefault(key, []).extend(replies)

    def arrivals(self, key: str) -> list[Seen]:
        return [s for s in self.seen if s.key == key]

    def __enter__(self) -> Upstream:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- the server -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            for task in self._handlers:  # requests still being answered: stop them cleanly
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if not await self._answer(method, path, headers, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection was dropped."""
        if method == "GET" and path == "/props":
            if self.total_slots is None:
                return await self._write(writer, 404, {"error": "not found"})
            return await self._write(writer, 200, {"total_slots": self.total_slots})
        body = json.loads(raw or b"{}")
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        key = users[-1]["content"] if users else ""
        seen = Seen(path, key, body, headers, time.monotonic())
        self.seen.append(seen)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            script = self.script.get(key)
            reply = script.pop(0) if script else Reply()
            delay = reply.delay
            if delay is None:
                delay = self.batching[0] + self.batching[1] * self.in_flight if self.batching else self.latency
            if delay:
                await asyncio.sleep(delay)
            if reply.drop:
                writer.transport.abort()
                return False
            anthropic = path.endswith("/messages")
            if reply.status == 200:
                payload = _anthropic_ok(body, key) if anthropic else _openai_ok(body, key)
            else:
                sent_key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
                message = reply.message.replace("{key}", sent_key)
                payload = (
                    {"type": "error", "error": {"type": reply.code or "api_error", "message": message}}
                    if anthropic
                    else {"error": {"message": message, "type": None, "param": None, "code": reply.code}}
                )
            seen.status = reply.status
            return await self._write(writer, reply.status, payload, reply.headers)
        finally:
            seen.answered = time.monotonic()
            self.in_flight -= 1

    async def _write(self, writer: asyncio.StreamWriter, status: int, payload: Any, headers: dict[str, str] | None = None) -> bool:
        data = json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n{extra}\r\n".encode()
            + data
        )
        await writer.drain()
        return True


def _openai_ok(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"ok {key}"}, "finish_reason": "stop"}],
        "usage": OPENAI_USAGE,
        # The tier it served at, as OpenAI reports it: the one asked for, "auto" (or none) as "default".
        "service_tier": "default" if body.get("service_tier") in (None, "auto") else body["service_tier"],
    }


def _anthropic_ok(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [{"type": "text", "text": f"ok {key}"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {**ANTHROPIC_USAGE, "service_tier": "standard"},
    }
