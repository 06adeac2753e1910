"""Real servers on loopback ports: a fake upstream that speaks OpenAI's chat completions and
Anthropic's messages (streamed too, and 429 on demand), a webhook receiver, and the gateway
itself (uvicorn in a thread each). Nothing is patched: every call is real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lowtide.core.clock import ManualClock
from lowtide.server.gateway import build_gateway_config, create_gateway_app
from lowtide.server.gateway.tenants import sha256_hex
from tests.conftest import wait_until

KEYS = {"acme": "sk-acme-raw-key-0001", "globex": "sk-globex-raw-key-0002"}
UPSTREAM_KEY = "sk-upstream-secret-9999"
SECRET = "whsec-test-secret-4242"


@contextmanager
def serving(app: Any) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="a server to start")
    assert thread.is_alive(), "the server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# The upstream ---------------------------------------------------------------------------
@dataclass
class Upstream:
    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    rate_limited: int = 0  # answer this many next calls with 429
    seen: list[str] = field(default_factory=list)  # "METHOD raw-path" of every request that arrived, any path

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def everything(request: Request, call_next):
            self.seen.append(f"{request.method} {request.scope.get('raw_path', b'').decode('latin-1')}")
            return await call_next(request)

        def record(request: Request, body: dict[str, Any]) -> JSONResponse | None:
            self.calls.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
            if self.rate_limited > 0:
                self.rate_limited -= 1
                return JSONResponse({"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                                               "code": "rate_limit_exceeded"}}, status_code=429, headers={"retry-after": "1"})
            return None

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            if (refused := record(request, body)) is not None:
                return refused
            text = "upstream: " + body["messages"][-1]["content"]
            if body.get("stream"):
                async def events():
                    for i, piece in enumerate(text.split(" ")):
                        chunk = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                                 "choices": [{"index": 0, "delta": {"content": (" " if i else "") + piece}, "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                        await asyncio.sleep(0)
                    last = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                    yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n"
                return StreamingResponse(events(), media_type="text/event-stream")
            return {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                                 "logprobs": {"content": [{"token": "up", "logprob": -0.25, "bytes": None, "top_logprobs": []}]}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                    "system_fingerprint": "fp_upstream"}  # fmt: skip

        @app.post("/v1/messages")
        async def messages(request: Request):
            body = await request.json()
            if (refused := record(request, body)) is not None:
                return refused
            text = "upstream: " + body["messages"][-1]["content"]
            message = {"id": "msg_up", "type": "message", "role": "assistant", "model": body["model"],
                       "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                       "usage": {"input_tokens": 5, "output_tokens": 3}}
            if body.get("stream"):
                def sse(kind: str, data: dict) -> str:
                    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

                async def events():
                    yield sse("message_start", {"message": {**message, "content": [], "usage": {"input_tokens": 5, "output_tokens": 0}}})
                    yield sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                    for piece in text.split(" "):
                        yield sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece + " "}})
                    yield sse("content_block_stop", {"index": 0})
                    yield sse("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 3}})
                    yield sse("message_stop", {})
                return StreamingResponse(events(), media_type="text/event-stream")
            return message

        @app.get("/v1/models")
        async def models(request: Request):
            self.calls.append({"path": request.url.path, "headers": dict(request.headers), "body": None})
            return {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "test"}]}

        return app


@dataclass
class Receiver:
    """A webhook receiver: records every POST; fails the first `fail` of them with 500."""

    url: str = ""
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    fail: int = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/hook")
        async def hook(request: Request):
            raw = await request.body()
            self.deliveries.append({"headers": dict(request.headers), "raw": raw, "body": json.loads(raw)})
            if self.fail > 0:
                self.fail -= 1
                return JSONResponse({"error": "try later"}, status_code=500)
            return {"ok": True}

        return app

    def ids(self, ok_only: bool = False) -> list[str]:
        return [d["body"]["id"] for d in self.deliveries]


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    with serving(up.app()) as url:
        up.url = url
        yield up


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    with serving(rec.app()) as url:
        rec.url = url
        yield rec


# The gateway ----------------------------------------------------------------------------
@dataclass
class Running:
    url: str
    app: Any

    @property
    def gw(self):
        return self.app.state.gateway

    def client(self, tenant: str = "acme", headers: dict[str, str] | None = None, **kw) -> httpx.Client:
        headers = {"authorization": f"Bearer {KEYS[tenant]}", **(headers or {})}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)

    def status(self, gid: str, tenant: str = "acme") -> httpx.Response:
        with self.client(tenant) as c:
            return c.get(f"/v1/deferred/{gid}")

    def wait_done(self, gid: str, tenant: str = "acme") -> dict[str, Any]:
        return wait_until(lambda: (s := self.status(gid, tenant).json())["status"] in ("succeeded", "failed") and s,
                          what=f"{gid} to finish")


def base_config(tmp_path: Path, upstream: Upstream, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "data_dir": str(tmp_path / "gateway-data"),
        "upstreams": {
            "openai": {"base_url": f"{upstream.url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY"},
            "anthropic": {"base_url": upstream.url, "api_key_env": "GW_TEST_UPSTREAM_KEY"},
        },
        "batch": {"openai": {"route": "echo"}, "anthropic": {"route": "echo"}},
        "collector": {"flush_size": 1000, "flush_age": 0},
        "tenants": [{"name": name, "key_sha256": sha256_hex(key)} for name, key in KEYS.items()],
        "callbacks": {"allow_loopback": True},
        "webhooks": {"secret_env": "GW_TEST_WEBHOOK_SECRET", "backoff": 1.0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@contextmanager
def running_gateway(tmp_path: Path, config: dict[str, Any], **kw: Any) -> Iterator[Running]:
    app = create_gateway_app(build_gateway_config(config), db=str(tmp_path / "lowtide.db"), **kw)
    with serving(app) as url:
        yield Running(url, app)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("GW_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("GW_TEST_WEBHOOK_SECRET", SECRET)


@pytest.fixture
def gateway(tmp_path, upstream) -> Callable[..., Any]:
    """`with gateway(clock=…, **config overrides) as g:` — a gateway on this test's store."""

    def start(clock: Any = None, routes: Any = None, classifier: Any = None, **overrides: Any):
        return running_gateway(tmp_path, base_config(tmp_path, upstream, **overrides), clock=clock, routes=routes,
                               classifier=classifier)

    return start


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=time.time())
