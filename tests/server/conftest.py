"""A real `lowtide serve` app on a loopback port (uvicorn in a thread), and the official
SDKs pointed at it. Batches finish fast: the server's clock runs sped up."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from fastapi import Request as HttpRequest

from lowtide.core.types import Request
from lowtide.routes.own.echo import EchoRoute
from lowtide.server import ServeConfig, create_app
from tests.conftest import wait_until
from tests.server.browser import browser, page  # noqa: F401 (the dashboard tests' Chromium fixtures)

FAST = 3600.0  # one scaled hour per real second
OPENAI_ENDED = ("completed", "failed", "expired", "cancelled")


@dataclass
class Running:
    port: int
    app: Any

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server(self):
        return self.app.state.server

    def openai(self, key: str = "k", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, **kw)

    def anthropic(self, key: str = "k", **kw) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0, **kw)


@contextmanager
def on_loopback(app: Any) -> Iterator[int]:
    """Any ASGI app served by uvicorn on a free loopback port, in a thread: its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to start")
    assert thread.is_alive(), "the server did not start"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def running(tmp_path: Path, **config: Any) -> Iterator[Running]:
    config.setdefault("time_scale", FAST)
    config.setdefault("data_dir", tmp_path / "data")
    config.setdefault("db", str(tmp_path / "lowtide.db"))
    app = create_app(ServeConfig(**config))
    with on_loopback(app) as port:
        yield Running(port, app)


@pytest.fixture
def serve(tmp_path) -> Callable[..., Any]:
    """`with serve(**ServeConfig fields) as s:` — a fresh server on this test's store."""
    return lambda **config: running(tmp_path, **config)


def stepped(serve, **more: Any):
    """A serve with no worker thread on a ManualClock: nothing moves but by `run_passes`."""
    from lowtide.core.clock import ManualClock

    return serve(clock=ManualClock(1_900_000_000.0), run_worker=False, **more)


def run_passes(s: Running, n: int = 20) -> None:
    """Run a stepped serve's worker passes until one moves nothing (at most `n`)."""

    async def go():
        for _ in range(n):
            if not await s.app.state.worker.run_once():
                break
        await s.app.state.worker.aclose()

    asyncio.run(go())


@pytest.fixture
def server(serve) -> Iterator[Running]:
    with serve() as s:
        yield s


@pytest.fixture
def fault_plan(tmp_path) -> Callable[[dict], Path]:
    def write(plan: dict) -> Path:
        path = tmp_path / "faults.yaml"
        path.write_text(yaml.safe_dump(plan))
        return path

    return write


def chat_line(custom_id: str, content: str = "hello", model: str = "gpt-test", url: str = "/v1/chat/completions", **body) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(items: list[Any]) -> bytes:
    return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items).encode()


def upload(client: openai.OpenAI, items: list[Any] | bytes, name: str = "in.jsonl"):
    data = items if isinstance(items, bytes) else jsonl(items)
    return client.files.create(file=(name, data), purpose="batch")


def create_batch(client: openai.OpenAI, items: list[Any] | bytes, **kw):
    file = upload(client, items)
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", **kw)


def wait_openai(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = OPENAI_ENDED):
    return wait_until(lambda: (b := client.batches.retrieve(batch_id)).status in statuses and b, what=f"batch {batch_id} to reach {statuses}")


def wait_anthropic(client: anthropic.Anthropic, batch_id: str, status: str = "ended"):
    return wait_until(
        lambda: (b := client.messages.batches.retrieve(batch_id)).processing_status == status and b,
        what=f"message batch {batch_id} to be {status}",
    )


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def message_request(custom_id: str, content: str = "hello", **params) -> dict:
    params = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": content}], **params}
    return {"custom_id": custom_id, "params": params}


class GatedEcho(EchoRoute):
    """echo that answers one request per dispatch, and only as many as the test allows:
    batches stay in flight exactly as long as a test needs."""

    def __init__(self) -> None:
        super().__init__({"dispatch_size": 1})
        self.allowed = 0
        self.served = 0
        self.waiting = 0  # requests the backend holds at the gate right now

    def release(self, n: int = 1_000_000) -> None:
        self.allowed += n

    async def execute(self, requests: list[Request]):
        for request in requests:
            self.waiting += 1
            while self.served >= self.allowed:
                await asyncio.sleep(0.002)
            self.waiting -= 1
            self.served += 1
            yield self.outcome(request)


@pytest.fixture
def gate() -> Iterator[GatedEcho]:
    route = GatedEcho()
    yield route
    route.release()  # never leave a worker waiting on the gate


class Capture:
    """A loopback OpenAI-compatible upstream that records every body it is sent, exactly as
    it arrived, and answers in the endpoint's shape with fields lowtide does not build
    (tool calls, logprobs, a system fingerprint), naming its own model."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.port = 0
        app = FastAPI()

        @app.post("/v1/{endpoint:path}")
        async def answer(endpoint: str, request: HttpRequest) -> dict:
            body = json.loads(await request.body())
            self.bodies.append(body)
            return self.answer(endpoint, body)

        self.app = app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, endpoint: str, body: dict) -> dict:
        n = len(self.bodies)
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        tool = _first_tool(body)  # a call of the request's own tool (valid, as ingest checks), else text
        if endpoint == "chat/completions":
            arguments = '{"label": "bug"}' if tool == "label" else "{}"
            message = ({"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": {"name": tool, "arguments": arguments}}]} if tool
                else {"role": "assistant", "content": "done", "refusal": None})
            return {
                "id": f"chatcmpl-up{n}", "object": "chat.completion", "created": 1700000000, "model": "upstream-model",
                "system_fingerprint": "fp_up", "service_tier": "default",
                "choices": [{"index": 0, "finish_reason": "tool_calls" if tool else "stop",
                             "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}], "refusal": None},
                             "message": message}],
                "usage": usage,
            }  # fmt: skip
        if endpoint == "messages":
            called = [{"type": "tool_use", "id": "tu_1", "name": tool, "input": {}}] if tool else []
            return {"id": f"msg_up{n}", "type": "message", "role": "assistant", "model": "upstream-model",
                    "content": [{"type": "text", "text": "done"}, *called],
                    "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 11, "output_tokens": 7, "cache_creation_input_tokens": 5,
                              "cache_read_input_tokens": 3, "service_tier": "batch"}}  # fmt: skip
        if endpoint == "completions":
            return {"id": f"cmpl-up{n}", "object": "text_completion", "created": 1700000000, "model": "upstream-model",
                    "choices": [{"index": 0, "text": "done", "logprobs": None, "finish_reason": "stop"}], "usage": usage}  # fmt: skip
        return {
            "id": f"resp_up{n}", "object": "response", "created_at": 1700000000, "model": "upstream-model", "status": "completed",
            "output": [{"type": "message", "id": "msg_up", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "done", "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "reasoning": {"effort": "low", "summary": None},
            "usage": {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 7,
                      "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 18},
        }  # fmt: skip


def _first_tool(body: dict) -> str | None:
    """The name of the body's first function tool (chat's or Anthropic's), if it has one."""
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function")
        if tool.get("type") == "function" and isinstance(fn, dict) and fn.get("name"):
            return fn["name"]
        if "input_schema" in tool and tool.get("name"):
            return tool["name"]
    return None


@pytest.fixture
def capture() -> Iterator[Capture]:
    upstream = Capture()
    with on_loopback(upstream.app) as port:
        upstream.port = port
        yield upstream
