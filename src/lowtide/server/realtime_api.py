"""Real-time endpoints: OpenAI's `POST /v1/chat/completions`, `/v1/responses` and
`/v1/completions`, and Anthropic's `POST /v1/messages`, answered now by the server's backend.

Each body goes to the backend verbatim (DESIGN invariant 8) as one `Request(custom_id,
endpoint, body)`: only `stream` / `stream_options`, which this server acts on itself, are
taken out, and `--model` maps every request onto one backend model (the answer still names
the model the request asked for). What the backend route cannot honour is refused first,
as a 400 naming the field and the route (`translate.rejection`). The request runs through
`Backend.run` (backend.py: one owner loop for the route, concurrent requests grouped into
one `execute`); the answer is the upstream's whole body when it returned one, else built
in the endpoint's shape (answers.py). With `stream: true` the built answer is sent as the
provider's Server-Sent Events, in word-sized pieces (chat and messages). Errors are in each
provider's shape (`errors.py`). A batch backend cannot answer now: 501.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lowtide.core import types
from lowtide.core.endpoints import CHAT, COMPLETIONS, MESSAGES, NEVER, RESPONSES
from lowtide.core.types import Outcome
from lowtide.server import answers
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
    if not isinstance(model, str) or not model:
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
    """`length` when the answer used all of max_tokens (as for batches), else `stop`."""
    used_all = max_tokens is not None and outcome.usage.output_tokens >= max_tokens
    return "length" if outcome.finish_reason == "length" or used_all else "stop"


def _pieces(text: str) -> list[str]:
    """The answer cut into word-sized pieces that join back to it exactly."""
    return re.findall(r"\S+\s*|\s+", text)


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else _dumps(data)}\n\n"


def _stream(events: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


# Answering ---------------------------------------------------------------------------
def _answer(server: Server, endpoint: str, body: dict[str, Any], outcome: Outcome, built: bool) -> dict[str, Any]:
    """The upstream's whole answer (unless `built`: a stream is cut from a built one), or
    the answer built in the endpoint's shape, naming the model the request asked for."""
    model = body["model"]
    if not built and (native := answers.native(endpoint, outcome.response, model)) is not None:
        return native
    request = types.Request("", endpoint, body)
    length = _finish(outcome, request.output_limit) == "length"
    made = answers.built(endpoint, secrets.token_hex(16), int(server.clock.now()), model, outcome.text or "", length,
                         asdict(outcome.usage))  # fmt: skip
    if endpoint == MESSAGES:
        made["usage"]["service_tier"] = "standard"
    return made


async def _serve(request: Request, endpoint: str):
    server = _server(request)
    backend = _backend(request, endpoint)
    body = await _json(request)
    stream, include_usage = _stream_flags(body, endpoint)
    outcome = await _run(backend, asked(server, body, endpoint, backend.new_id()))
    answer = _answer(server, endpoint, body, outcome, built=stream)
    if not stream:
        return answer
    if endpoint == MESSAGES:
        return _stream(_anthropic_events(answer))
    return _stream(_openai_events(answer, outcome, include_usage))


@router.post("/v1/chat/completions", openapi_extra=json_body(OPENAI_CHAT))
async def chat_completions(request: Request):
    return await _serve(request, CHAT)


@router.post("/v1/responses")
async def responses(request: Request):
    return await _serve(request, RESPONSES)


@router.post("/v1/completions")
async def completions(request: Request):
    return await _serve(request, COMPLETIONS)


@router.post("/v1/messages", openapi_extra=json_body(ANTHROPIC_MESSAGE))
async def messages(request: Request):
    return await _serve(request, MESSAGES)


# Streams ------------------------------------------------------------------------------
def _openai_events(answer: dict[str, Any], outcome: Outcome, include_usage: bool) -> Iterator[str]:
    """OpenAI's chunks: the role, the content pieces, the finish reason, then (with
    include_usage) a chunk with no choices and the usage; every other chunk has usage null."""
    base = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"], "model": answer["model"],
            "system_fingerprint": None}  # fmt: skip
    finish = answer["choices"][0]["finish_reason"]

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        data = base | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        return _sse((data | {"usage": None}) if include_usage else data)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(outcome.text or ""):
        yield chunk({"content": piece})
    yield chunk({}, finish)
    if include_usage:
        yield _sse(base | {"choices": [], "usage": answer["usage"]})
    yield _sse("[DONE]")


def _anthropic_events(message: dict[str, Any]) -> Iterator[str]:
    """Anthropic's event sequence: message_start, content_block_start, ping, the text
    deltas, content_block_stop, message_delta (stop reason, usage), message_stop."""
    usage = message["usage"]
    text = message["content"][0]["text"]
    start = message | {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage | {"output_tokens": 0}}
    yield _sse({"type": "message_start", "message": start}, "message_start")
    yield _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start")
    yield _sse({"type": "ping"}, "ping")
    for piece in _pieces(text):
        yield _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
    yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    delta_usage = {k: v for k, v in usage.items() if k != "service_tier"}
    yield _sse({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": delta_usage}, "message_delta")  # fmt: skip
    yield _sse({"type": "message_stop"}, "message_stop")
