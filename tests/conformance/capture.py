"""A loopback upstream that records every body it is sent and answers it in the shape of its
endpoint: the provider end of the conformance tests (a real HTTP server, FastAPI on uvicorn).

Bodies are told apart by a marker the tests put in the first user text (`marker_of`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request


def marker_of(body: dict[str, Any]) -> str:
    """The first text of the first user turn (chat, messages, responses, Gemini's contents)
    or the prompt."""
    if "contents" in body:
        body = {"messages": [{"role": c.get("role"), "content": c.get("parts")} for c in body["contents"] if isinstance(c, dict)]}
    asked = body.get("messages", body.get("input", body.get("prompt")))
    if isinstance(asked, str):
        return asked
    for m in asked or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            for part in content or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    return part["text"]
    return ""


class Capture:
    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, dict[str, Any]]] = {}  # marker -> (path, body)
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._handler(_chat))
        self.app.post("/v1/responses")(self._handler(_response))
        self.app.post("/v1/completions")(self._handler(_completion))
        self.app.post("/v1/messages")(self._handler(_message))
        self.app.post("/v1beta/models/{model}:generateContent")(self._handler(_gemini))
        self.url = ""

    def _handler(self, answer):
        async def handle(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.seen[marker_of(body)] = (request.url.path, body)  # Gemini's carries the model
            return answer(body)

        return handle


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip


def _response(body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": body.get("model"), "status": "completed",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}}  # fmt: skip


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body.get("model"),
            "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip


def _gemini(body: dict[str, Any]) -> dict[str, Any]:
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4},
            "modelVersion": body.get("model") or "m"}  # fmt: skip


def _message(body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip


@contextmanager
def capture() -> Iterator[Capture]:
    cap = Capture()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(cap.app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):  # bounded: the server starts in its own time
        if server.started or not thread.is_alive():
            break
        time.sleep(0.01)
    assert server.started, "the capture upstream did not start"
    cap.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield cap
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
