"""Real-time endpoints: OpenAI's `POST /v1/chat/completions` and Anthropic's
`POST /v1/messages`, answered now by the server's backend route.

Each body is translated at the edge exactly as a batch line is (`translate.py`: plain-text
messages, max_tokens, temperature, stop) into one provider-neutral `Request`, run on
the backend through `Backend.run` (see `backend.py`: one owner loop for the route,
concurrent requests grouped into one `execute`), and its `Outcome` written back in the
provider's shape: a `chat.completion` / `message` object, or with `stream: true` the
provider's Server-Sent Events. The backend answers whole, so a stream carries the finished
answer in word-sized pieces. Errors are in each provider's shape (`errors.py`).

`--model` maps every request onto one backend model, as for batches; the answer still
names the model the request asked for. A batch backend cannot answer now: 501.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lowtide.core import types
from lowtide.core.types import Outcome
from lowtide.server.backend import Backend, BackendClosed
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import ServeConfig, Server
from lowtide.server.errors import ApiError
from lowtide.server.outputs import HTTP_ERRORS, TIMEOUT_CODES
from lowtide.server.records import new_id
from lowtide.server.schemas import ANTHROPIC_MESSAGE, OPENAI_CHAT, json_body
from lowtide.server.translate import Rejection, anthropic_params, openai_chat

router = APIRouter()
_dumps = json.JSONEncoder(ensure_ascii=False).encode
# OpenAI parameters this server cannot honour: refused, naming the parameter.
OPENAI_UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "audio", "prediction",
                      "logprobs", "top_logprobs", "web_search_options")  # fmt: skip
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


# Translating a body into a Request ------------------------------------------------
def _rejected(rejection: Rejection) -> ApiError:
    return ApiError(rejection.status, rejection.message, param=rejection.param, code=rejection.code)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"Invalid type for '{name}': expected a boolean, but got {type(value).__name__} instead.", param=name)
    return bool(value)


def _response_schema(value: Any) -> dict[str, Any] | None:
    """OpenAI's response_format as the Request's response schema."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema: expected a JSON Schema object.", param="response_format.json_schema.schema")
        return schema
    raise ApiError(400, f"response_format.type: must be one of text, json_object, json_schema; got {kind!r}.", param="response_format.type")


def openai_request(body: dict[str, Any], config: ServeConfig, custom_id: str) -> tuple[types.Request, bool, bool]:
    """A chat completions body as (the request, whether to stream, whether to add usage)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "Missing required parameter: 'model'.", param="model")
    for name in OPENAI_UNSUPPORTED:
        if body.get(name):
            raise ApiError(400, f"{name}: not supported by this server (plain-text chat only); remove '{name}'.", param=name)
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise ApiError(400, f"modalities: this server answers with text only; got {modalities!r}.", param="modalities")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options")
        if not isinstance(options, dict):
            raise ApiError(400, "Invalid type for 'stream_options': expected an object.", param="stream_options")
        include_usage = _flag(options, "include_usage")
    schema = _response_schema(body.get("response_format"))
    row = openai_chat({k: v for k, v in body.items() if k not in ("stream", "stream_options")}, config.default_max_tokens)
    if isinstance(row, Rejection):
        raise _rejected(row)
    return _request(custom_id, config.model or model, row, schema), stream, include_usage


def anthropic_request(body: dict[str, Any], config: ServeConfig, custom_id: str) -> tuple[types.Request, bool]:
    """A Messages API body as (the request, whether to stream)."""
    stream = _flag(body, "stream")
    row = anthropic_params({k: v for k, v in body.items() if k != "stream"})
    if isinstance(row, Rejection):
        raise _rejected(row)
    return _request(custom_id, config.model or body["model"], row, None), stream


def _request(custom_id: str, model: str, row: dict[str, Any], schema: dict[str, Any] | None) -> types.Request:
    params = {k: row[k] for k in ("max_tokens", "temperature", "stop") if row.get(k) is not None}
    request = types.Request.chat(custom_id, model, row["messages"], **params)
    request.response_schema = schema
    return request


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


# OpenAI -------------------------------------------------------------------------------
def openai_usage(outcome: Outcome) -> dict[str, Any]:
    u = outcome.usage
    return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}  # fmt: skip


@router.post("/v1/chat/completions", openapi_extra=json_body(OPENAI_CHAT))
async def chat_completions(request: Request):
    server = _server(request)
    backend = _backend(request, "/v1/chat/completions")
    body = await _json(request)
    chat, stream, include_usage = openai_request(body, server.config, backend.new_id())
    outcome = await _run(backend, chat)
    head = {"id": new_id("chatcmpl-"), "created": int(server.clock.now()), "model": body["model"]}
    finish = _finish(outcome, chat.output_limit)
    if not stream:
        return {
            "id": head["id"], "object": "chat.completion", "created": head["created"], "model": head["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": outcome.text or "", "refusal": None},
                         "logprobs": None, "finish_reason": finish}],
            "usage": openai_usage(outcome), "system_fingerprint": None,
        }  # fmt: skip
    return _stream(_openai_events(head, outcome, finish, include_usage))


def _openai_events(head: dict[str, Any], outcome: Outcome, finish: str, include_usage: bool) -> Iterator[str]:
    """OpenAI's chunks: the role, the content pieces, the finish reason, then (with
    include_usage) a chunk with no choices and the usage; every other chunk has usage null."""
    base = {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"], "model": head["model"],
            "system_fingerprint": None}  # fmt: skip

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        data = base | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        return _sse((data | {"usage": None}) if include_usage else data)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(outcome.text or ""):
        yield chunk({"content": piece})
    yield chunk({}, finish)
    if include_usage:
        yield _sse(base | {"choices": [], "usage": openai_usage(outcome)})
    yield _sse("[DONE]")


# Anthropic ----------------------------------------------------------------------------
def anthropic_usage(outcome: Outcome) -> dict[str, Any]:
    u = outcome.usage
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens, "cache_read_input_tokens": u.cached_input_tokens,
            "service_tier": "standard"}  # fmt: skip


@router.post("/v1/messages", openapi_extra=json_body(ANTHROPIC_MESSAGE))
async def messages(request: Request):
    server = _server(request)
    backend = _backend(request, "/v1/messages")
    body = await _json(request)
    chat, stream = anthropic_request(body, server.config, backend.new_id())
    outcome = await _run(backend, chat)
    message = {
        "id": new_id("msg_01", 22), "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": outcome.text or ""}],
        "stop_reason": "max_tokens" if _finish(outcome, chat.output_limit) == "length" else "end_turn",
        "stop_sequence": None, "usage": anthropic_usage(outcome),
    }  # fmt: skip
    if not stream:
        return message
    return _stream(_anthropic_events(message))


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
