"""The answer bodies lowtide's own engines (`echo`, `local`) return, in the request's own
endpoint's shape, as a provider of that endpoint would: a chat completion, a response, a
text completion, or an Anthropic message. They are `Outcome.response`, so exports and
`lowtide serve` read an own engine's answer exactly as they read a provider's.

One `Reply` per choice (`n`): its text, or a tool call, why it ended, and (local) the
logprobs of its tokens, already in chat completions' `logprobs.content` shape.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.endpoints import COMPLETIONS, MESSAGES, RESPONSES
from lowtide.core.types import Request, Usage

# lowtide's ending words ("stop", "length", "tool_calls"), per endpoint.
ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}


@dataclass(slots=True)
class Call:
    """A function tool call: the tool's name and its arguments (a JSON value)."""

    name: str
    arguments: Any


@dataclass(slots=True)
class Reply:
    text: str = ""
    finish: str = "stop"  # stop, length, tool_calls, stop_sequence (a stop string matched)
    call: Call | None = None
    stop_sequence: str | None = None
    logprobs: list[dict[str, Any]] | None = None  # chat's logprobs.content entries
    output_tokens: int = 0


@dataclass(slots=True)
class Ids:
    """Ids that are a function of the request, so one request's answer is the same each time."""

    route: str
    custom_id: str
    salt: str = field(init=False)

    def __post_init__(self) -> None:
        self.salt = f"{zlib.crc32(self.custom_id.encode()):08x}"

    def __call__(self, prefix: str, i: int = 0) -> str:
        return f"{prefix}{self.route}{self.salt}{i or ''}"


def arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def reply_body(request: Request, route: str, replies: list[Reply], usage: Usage) -> dict[str, Any]:
    """The whole answer body for `request` (one entry of `replies` per choice)."""
    ids = Ids(route, request.custom_id)
    build = {RESPONSES: _response, COMPLETIONS: _completion, MESSAGES: _message}.get(request.endpoint, _chat)
    return build(request, ids, replies, usage)


def _chat(request: Request, ids: Ids, replies: list[Reply], usage: Usage) -> dict[str, Any]:
    choices = []
    for i, r in enumerate(replies):
        message: dict[str, Any] = {"role": "assistant", "content": None if r.call else r.text, "refusal": None}
        if r.call:
            message["tool_calls"] = [{"id": ids("call_", i), "type": "function",
                                      "function": {"name": r.call.name, "arguments": arguments_text(r.call.arguments)}}]  # fmt: skip
        logprobs = None if r.logprobs is None else {"content": r.logprobs, "refusal": None}
        finish = "stop" if r.finish == "stop_sequence" else r.finish
        choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs})
    return {"id": ids("chatcmpl-"), "object": "chat.completion", "created": int(time.time()), "model": request.model,
            "choices": choices, "usage": _openai_usage(usage)}  # fmt: skip


def _completion(request: Request, ids: Ids, replies: list[Reply], usage: Usage) -> dict[str, Any]:
    choices = [{"index": i, "text": r.text, "finish_reason": "stop" if r.finish == "stop_sequence" else r.finish, "logprobs": None}
               for i, r in enumerate(replies)]  # fmt: skip
    return {"id": ids("cmpl-"), "object": "text_completion", "created": int(time.time()), "model": request.model,
            "choices": choices, "usage": _openai_usage(usage)}  # fmt: skip


def _openai_usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens}}  # fmt: skip


def _response(request: Request, ids: Ids, replies: list[Reply], usage: Usage) -> dict[str, Any]:
    (r,) = replies  # responses has no n
    if r.call:
        item = {"type": "function_call", "id": ids("fc_"), "call_id": ids("call_"), "name": r.call.name,
                "arguments": arguments_text(r.call.arguments), "status": "completed"}  # fmt: skip
    else:
        part = {"type": "output_text", "text": r.text, "annotations": [], "logprobs": []}
        item = {"type": "message", "id": ids("msg_"), "status": "completed", "role": "assistant", "content": [part]}
    cut = r.finish == "length"
    body = request.body
    return {
        "id": ids("resp_"), "object": "response", "created_at": int(time.time()), "model": request.model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [item], "error": None, "instructions": body.get("instructions"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []), "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "usage": {"input_tokens": usage.input_tokens, "input_tokens_details": {"cached_tokens": usage.cached_input_tokens, "cache_write_tokens": 0},
                  "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage.input_tokens + usage.output_tokens},
    }  # fmt: skip


def _message(request: Request, ids: Ids, replies: list[Reply], usage: Usage) -> dict[str, Any]:
    (r,) = replies  # messages has no n
    if r.call:
        content = [{"type": "tool_use", "id": ids("toolu_"), "name": r.call.name, "input": r.call.arguments}]
    else:
        content = [{"type": "text", "text": r.text}]
    return {
        "id": ids("msg_"), "type": "message", "role": "assistant", "model": request.model, "content": content,
        "stop_reason": ANTHROPIC_STOP[r.finish], "stop_sequence": r.stop_sequence,
        "usage": {"input_tokens": usage.input_tokens - usage.cached_input_tokens, "output_tokens": usage.output_tokens,
                  "cache_read_input_tokens": usage.cached_input_tokens, "cache_creation_input_tokens": 0},
    }  # fmt: skip
