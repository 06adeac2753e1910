"""Translate at the edge, both ways, for deferred requests.

In: a `/v1/chat/completions` or `/v1/messages` body becomes a lowtide source row (plain-text
messages, max_tokens, temperature, stop; `server/translate.py`, the same translation
`lowtide serve` applies to batch lines). A body that a batch cannot carry faithfully —
tools, images, `response_format`, logprobs, `n > 1`, … — is not deferred: `to_row` says why
and the gateway forwards it in real time instead. `stream` is dropped (a deferred answer
is delivered whole).

Out: a finished lowtide request (a `requests` row) becomes the body the API itself would
have answered: a `chat.completion` or a `message`; a failure becomes the API's error body
with the HTTP status it would have had.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row

from lowtide.server.errors import ApiError
from lowtide.server.outputs import EXPIRED_CODES, HTTP_ERRORS, TIMEOUT_CODES
from lowtide.server.translate import Rejection, anthropic_params, openai_chat

_dumps = json.JSONEncoder(ensure_ascii=False).encode
OPENAI_NOT_BATCHED = ("tools", "tool_choice", "functions", "function_call", "audio", "prediction", "logprobs",
                      "top_logprobs", "web_search_options", "response_format", "modalities", "logit_bias")  # fmt: skip
ANTHROPIC_NOT_BATCHED = ("tools", "tool_choice", "thinking", "mcp_servers", "container")


def to_row(api: str, body: dict[str, Any], default_max_tokens: int) -> dict[str, Any] | str:
    """The source row for a deferred request, or why this body cannot be deferred."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "no model"
    unsupported = OPENAI_NOT_BATCHED if api == "openai" else ANTHROPIC_NOT_BATCHED
    for name in unsupported:
        if body.get(name):
            return f"{name} is not carried by batches"
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    row = openai_chat(plain, default_max_tokens) if api == "openai" else anthropic_params(plain)
    if isinstance(row, Rejection):
        return row.message
    return row


def result_of(api: str, gid: str, model: str, r: Row, created: int) -> tuple[dict[str, Any], int]:
    """(response body in the API's shape, HTTP status) for a terminal `requests` row."""
    if r.state == "succeeded":
        usage = {"input": r.input_tokens or 0, "output": r.output_tokens or 0, "cached": r.cached_input_tokens or 0,
                 "cache_write": r.cache_write_tokens or 0, "reasoning": r.reasoning_tokens or 0}  # fmt: skip
        max_tokens = json.loads(r.payload).get("max_tokens")
        length = bool(max_tokens) and usage["output"] >= max_tokens
        if api == "anthropic":
            return _anthropic_message(gid, model, r.output or "", length, usage), 200
        return _openai_completion(gid, model, r.output or "", length, usage, created), 200
    message = r.error_message or "the request failed"
    if r.state == "cancelled":
        status, kind, code = 500, "server_error", "cancelled"
    elif r.error_code in EXPIRED_CODES:
        status, kind, code = 504, "timeout_error", r.error_code
    elif r.error_code in TIMEOUT_CODES:
        status, kind, code = 504, "timeout_error", "request_timeout"
    else:
        status, kind, code = HTTP_ERRORS.get(r.error_code, (500, "server_error", r.error_code))
    error = ApiError(status, message, type=kind if api == "openai" else None, code=code)
    return error.body(api), status


def _openai_completion(gid: str, model: str, text: str, length: bool, u: dict[str, int], created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{gid}", "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": "length" if length else "stop"}],
        "usage": {"prompt_tokens": u["input"], "completion_tokens": u["output"], "total_tokens": u["input"] + u["output"],
                  "prompt_tokens_details": {"cached_tokens": u["cached"]},
                  "completion_tokens_details": {"reasoning_tokens": u["reasoning"]}},
        "system_fingerprint": None,
    }  # fmt: skip


def _anthropic_message(gid: str, model: str, text: str, length: bool, u: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"msg_{gid}", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if length else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": u["input"], "output_tokens": u["output"],
                  "cache_creation_input_tokens": u["cache_write"], "cache_read_input_tokens": u["cached"],
                  "service_tier": "batch"},
    }  # fmt: skip


def dumps(value: Any) -> str:
    return _dumps(value)
