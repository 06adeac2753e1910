"""The answer body of one request, in its endpoint's own shape: batch output lines and the
real-time endpoints write the same objects.

An upstream of the request's own protocol returned a whole answer (`Outcome.response`,
stored as `requests.response`): that body is the answer, verbatim, with the model the
request asked for (`--model` maps requests onto one backend model; the answer still names
the asked one). lowtide's own engines (`echo`, `local`) return text and usage only: the
answer is built here, as a chat.completion, a response, a text_completion or a message.

`usage` is lowtide's neutral form: input_tokens, cached_input_tokens, cache_write_tokens,
output_tokens, reasoning_tokens.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.endpoints import CHAT, COMPLETIONS, MESSAGES, RESPONSES

# How each endpoint's answer says what it is: (key, value).
SHAPES = {CHAT: ("object", "chat.completion"), RESPONSES: ("object", "response"),
          COMPLETIONS: ("object", "text_completion"), MESSAGES: ("type", "message")}  # fmt: skip


def native(endpoint: str, response: Any, model: str) -> dict[str, Any] | None:
    """`response` as the answer when it is in `endpoint`'s shape (an Anthropic message from a
    chat request translated for an Anthropic backend is not), naming `model`; else None."""
    key, value = SHAPES[endpoint]
    if isinstance(response, dict) and response.get(key) == value:
        return response | {"model": model}
    return None


def built(endpoint: str, ident: str, created: int, model: str, text: str, length: bool, usage: dict[str, int]) -> dict[str, Any]:
    """An own engine's answer in `endpoint`'s shape. `ident` is the hex the ids are made of;
    `length` says the answer used the whole output limit."""
    return _BUILDERS[endpoint](ident, created, model, text, length, usage)


def openai_usage(u: dict[str, int]) -> dict[str, Any]:
    return {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"],
            "total_tokens": u["input_tokens"] + u["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": u["cached_input_tokens"]},
            "completion_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]}}  # fmt: skip


def anthropic_usage(u: dict[str, int], tier: str) -> dict[str, Any]:
    return {"input_tokens": u["input_tokens"], "output_tokens": u["output_tokens"],
            "cache_creation_input_tokens": u["cache_write_tokens"], "cache_read_input_tokens": u["cached_input_tokens"],
            "service_tier": tier}  # fmt: skip


def _chat(ident: str, created: int, model: str, text: str, length: bool, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{ident[:24]}", "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": "length" if length else "stop"}],
        "usage": openai_usage(usage), "system_fingerprint": None,
    }  # fmt: skip


def _completion(ident: str, created: int, model: str, text: str, length: bool, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"cmpl-{ident[:24]}", "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if length else "stop"}],
        "usage": openai_usage(usage), "system_fingerprint": None,
    }  # fmt: skip


def _response(ident: str, created: int, model: str, text: str, length: bool, usage: dict[str, int]) -> dict[str, Any]:
    u = usage
    return {
        "id": f"resp_{ident[:32]}", "object": "response", "created_at": created, "model": model,
        "status": "incomplete" if length else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if length else None, "error": None,
        "output": [{"type": "message", "id": f"msg_{ident[:32]}", "status": "incomplete" if length else "completed",
                    "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": u["input_tokens"],
                  "input_tokens_details": {"cached_tokens": u["cached_input_tokens"], "cache_write_tokens": u["cache_write_tokens"]},
                  "output_tokens": u["output_tokens"], "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
                  "total_tokens": u["input_tokens"] + u["output_tokens"]},
        "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "instructions": None, "metadata": {},
        "temperature": None, "top_p": None,
    }  # fmt: skip


def _message(ident: str, created: int, model: str, text: str, length: bool, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"msg_01{ident[:22]}", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if length else "end_turn", "stop_sequence": None,
        "usage": anthropic_usage(usage, "batch"),
    }  # fmt: skip


_BUILDERS = {CHAT: _chat, COMPLETIONS: _completion, RESPONSES: _response, MESSAGES: _message}
