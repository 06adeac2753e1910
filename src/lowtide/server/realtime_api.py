"""Real-time endpoints: OpenAI's `POST /v1/chat/completions`, `/v1/responses` and
`/v1/completions`, `/v1/embeddings`, `/v1/moderations`, and Anthropic's `POST /v1/messages`,
answered now by the server's backend.

Each body goes to the backend verbatim (DESIGN invariant 8) as one `Request(custom_id,
endpoint, body)`: only `stream` / `stream_options`, which this server acts on itself, are
taken out, and `--model` maps every request onto one backend model (the answer still names
the model the request asked for). What the backend route cannot honour is refused first,
as a 400 naming the field and the route (`translate.rejection`). The request runs through
`Backend.run` (backend.py: one owner loop for the route, concurrent requests grouped into
one `execute`); the answer is the upstream's whole body when it returned one in the
endpoint's shape (lowtide's own engines do too), else built from its text by the one answer
builder (`routes/replies.py`). With `stream: true` that same answer is sent as the
provider's Server-Sent Events (chat and messages): text in word-sized pieces, each tool call
whole. Errors are in each provider's shape (`errors.py`). A batch backend cannot answer now: 501.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lowtide.core import types
from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    MODERATIONS,
    NEVER,
    RESPONSES,
)
from lowtide.core.types import Outcome
from lowtide.routes.replies import Ids, finish_word, in_shape, text_body
from lowtide.server.backend import Backend, BackendClosed
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.outputs import HTTP_ERRORS, TIMEOUT_CODES
from lowtide.server.schemas import ANTHROPIC_MESSAGE, OPENAI_CHAT, json_body
from lowtide.server.translate import rejection

router = APIRouter()
_dumps = json.JSONEncoder(ensure_ascii=False).encode
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


# A body as a Request ------------------------------------------------------------------
def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"Invalid type for '{name}': expected a boolean, but got {type(value).__name__} instead.", param=name)
    return bool(value)


def _stream_flags(body: dict[str, Any], endpoint: str) -> tuple[bool, bool]:
    """(whether to stream, whether to add a usage chunk) as the body asks."""
    stream = _flag(body, "stream")
    if stream and endpoint in (RESPONSES, COMPLETIONS):
        raise ApiError(400, f"stream: this server does not stream {endpoint} answers; send stream: false.", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if endpoint == MESSAGES:  # not an Anthropic parameter: the route's refusal names it
        return stream, False
    if not stream:
        raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options")
    if not isinstance(options, dict):
        raise ApiError(400, "Invalid type for 'stream_options': expected an object.", param="stream_options")
    return stream, _flag(options, "include_usage")


def asked(server: Server, body: dict[str, Any], endpoint: str, custom_id: str) -> types.Request:
    """The body as the request the backend runs, or the 400 for what it cannot honour."""
    api = "anthropic" if endpoint == MESSAGES else "openai"
    model = body.get("model")
    default = endpoint == MODERATIONS and model is None  # optional there: the provider's default model answers
    if not default and (not isinstance(model, str) or not model):
        said = "model: Field required" if api == "anthropic" else "Missing required parameter: 'model'."
        raise ApiError(400, said, param="model")
    taken = ("stream",) if endpoint == MESSAGES else NEVER  # what this server does itself
    sent = {k: v for k, v in body.items() if k not in taken}
    refused = rejection(server.route, endpoint, sent, server.config.model, api)
    if refused is not None:
        raise ApiError(refused.status, refused.message, param=refused.param, code=refused.code)
    if server.config.model:
        sent["model"] = server.config.model
    return types.Request(custom_id, endpoint, sent)


# Running it ---------------------------------------------------------------------------
def _server(request: Request) -> Server:
    return request.app.state.server


def _backend(request: Request, path: str) -> Backend:
    backend = getattr(request.app.state, "backend", None)
    if backend is None:
        route = _server(request).config.backend
        raise ApiError(
            501,
            f"{path} needs a direct backend: this server runs on the batch route '{route}', which cannot answer "
            f"in real time. Use the Batch API, or start `lowtide serve --backend echo` (or local, or another direct route).",
            headers={"x-should-retry": "false"},
        )
    return backend


async def _json(request: Request) -> dict[str, Any]:
    config = _server(request).config
    raw = await read_body(request, config.max_request_bytes, config.body_timeout)
    return parse_object(raw, config.max_json_depth)


async def _run(backend: Backend, request: types.Request) -> Outcome:
    """The request's outcome; a failure becomes the HTTP error the provider would give."""
    try:
        outcome = await backend.run(request)
    except BackendClosed as err:
        raise ApiError(503, str(err)) from None
    except Exception as err:  # the route broke
        raise ApiError(500, f"the backend route {backend.inner.name} failed: {type(err).__name__}: {err}") from None
    if outcome.ok:
        return outcome
    message = outcome.error_message or "the request failed"
    if outcome.error_code in TIMEOUT_CODES:
        raise ApiError(504, message, code="request_timeout")
    status, _, code = HTTP_ERRORS.get(outcome.error_code, (500, None, outcome.error_code))
    raise ApiError(status, message, code=code)


def _finish(outcome: Outcome, max_tokens: int | None) -> str:
    """Why the answer ended, as the route said; a route that did not say: `length` when the
    answer used all of max_tokens (as for batches), else `stop`."""
    if outcome.finish_reason:
        return finish_word(outcome.finish_reason)
    used_all = max_tokens is not None and outcome.usage.output_tokens >= max_tokens
    return "length" if used_all else "stop"


def _pieces(text: str) -> list[str]:
    """The answer cut into word-sized pieces that join back to it exactly."""
    return re.findall(r"\S+\s*|\s+", text)


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else _dumps(data)}\n\n"


def _stream(events: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


# Answering ---------------------------------------------------------------------------
def _answer(server: Server, endpoint: str, body: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The upstream's whole answer when it is in the endpoint's shape, else one built from
    its text; either names the model the request asked for."""
    if in_shape(endpoint, outcome.response):
        made = outcome.response | {"model": body.get("model") or outcome.response.get("model")}
    elif endpoint in (EMBEDDINGS, MODERATIONS):  # vectors and verdicts cannot be made up from text
        raise ApiError(500, f"the backend answered {endpoint} in another shape")
    else:
        request = types.Request("", endpoint, body)
        made = text_body(request, outcome.text or "", _finish(outcome, request.output_limit), outcome.usage,
                         ids=Ids(secrets.token_hex(12)), created=int(server.clock.now()))  # fmt: skip
    if endpoint == MESSAGES:  # this server is the provider here, and it answered now
        made["usage"] = {"service_tier": "standard"} | made.get("usage", {})
    return made


async def _serve(request: Request, endpoint: str):
    server = _server(request)
    backend = _backend(request, endpoint)
    body = await _json(request)
    stream, include_usage = _stream_flags(body, endpoint)
    outcome = await _run(backend, asked(server, body, endpoint, backend.new_id()))
    answer = _answer(server, endpoint, body, outcome)
    if not stream:
        return answer
    if endpoint == MESSAGES:
        return _stream(_anthropic_events(answer))
    return _stream(_openai_events(answer, include_usage))


@router.post("/v1/chat/completions", openapi_extra=json_body(OPENAI_CHAT))
async def chat_completions(request: Request):
    return await _serve(request, CHAT)


@router.post("/v1/responses")
async def responses(request: Request):
    return await _serve(request, RESPONSES)


@router.post("/v1/completions")
async def completions(request: Request):
    return await _serve(request, COMPLETIONS)


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    return await _serve(request, EMBEDDINGS)


@router.post("/v1/moderations")
async def moderations(request: Request):
    return await _serve(request, MODERATIONS)


@router.post("/v1/messages", openapi_extra=json_body(ANTHROPIC_MESSAGE))
async def messages(request: Request):
    return await _serve(request, MESSAGES)


# Streams ------------------------------------------------------------------------------
def _openai_events(answer: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """OpenAI's chunks, choice by choice: the role, the content pieces, each tool call whole,
    the finish reason (with the choice's logprobs), then (with include_usage) a chunk with no
    choices and the usage; every other chunk has usage null."""
    base = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"], "model": answer["model"],
            "system_fingerprint": answer.get("system_fingerprint")}  # fmt: skip

    def chunk(i: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> str:
        data = base | {"choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}
        return _sse((data | {"usage": None}) if include_usage else data)

    for choice in answer["choices"]:
        i, message = choice["index"], choice["message"]
        text = message.get("content")
        yield chunk(i, {"role": "assistant", "content": "" if text is not None else None, "refusal": None})
        for piece in _pieces(text or ""):
            yield chunk(i, {"content": piece})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(i, {"tool_calls": [{"index": k} | call]})
        if message.get("refusal"):
            yield chunk(i, {"refusal": message["refusal"]})
        yield chunk(i, {}, choice["finish_reason"], choice.get("logprobs"))
    if include_usage:
        yield _sse(base | {"choices": [], "usage": answer["usage"]})
    yield _sse("[DONE]")


def _anthropic_events(message: dict[str, Any]) -> Iterator[str]:
    """Anthropic's event sequence: message_start, then per content block its start (the ping
    after the first), its deltas (text in pieces, a tool's input whole) and its stop, then
    message_delta (stop reason, usage), message_stop."""
    usage = message["usage"]
    start = message | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage | {"output_tokens": 0}}
    yield _sse({"type": "message_start", "message": start}, "message_start")
    for i, block in enumerate(message["content"]):
        if block.get("type") == "text":
            opened, deltas = block | {"text": ""}, [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        elif block.get("type") == "tool_use":
            opened, deltas = block | {"input": {}}, [{"type": "input_json_delta", "partial_json": _dumps(block["input"])}]
        else:  # any other block arrives whole in its start
            opened, deltas = block, []
        yield _sse({"type": "content_block_start", "index": i, "content_block": opened}, "content_block_start")
        if i == 0:
            yield _sse({"type": "ping"}, "ping")
        for delta in deltas:
            yield _sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta")
        yield _sse({"type": "content_block_stop", "index": i}, "content_block_stop")
    delta_usage = {k: v for k, v in usage.items() if k != "service_tier"}
    yield _sse({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")},
                "usage": delta_usage}, "message_delta")  # fmt: skip
    yield _sse({"type": "message_stop"}, "message_stop")
