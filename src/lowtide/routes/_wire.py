"""The providers' wire shapes, shared by their batch and direct routes: one place builds a
request body and reads usage for each provider, whether the request goes in a batch file or
over a real-time call.

`ChatRequest.choices` is never sent as a provider field: the template already puts the
choices in the prompt text, and the engine validates the answer.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.types import ChatRequest, Usage


def openai_body(request: ChatRequest) -> dict[str, Any]:
    """The JSON body of one `/v1/chat/completions` call."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }
    if request.stop:
        body["stop"] = request.stop
    if request.response_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": request.response_schema},
        }
    return body


def openai_usage(usage: dict[str, Any] | None) -> Usage:
    """A chat completion's `usage`, as reported (prompt, cached prompt, completion, reasoning)."""
    usage = usage or {}
    return Usage(
        input_tokens=usage.get("prompt_tokens") or 0,
        cached_input_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        output_tokens=usage.get("completion_tokens") or 0,
        reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0,
    )


def anthropic_params(request: ChatRequest, cache_ttl: str | None = None) -> dict[str, Any]:
    """The params of one Messages call: system apart, as Anthropic wants it. With `cache_ttl`
    ("5m" or "1h") the system prompt is marked `cache_control: ephemeral` with that TTL."""
    system = "\n\n".join(m["content"] for m in request.messages if m["role"] == "system")
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "messages": [m for m in request.messages if m["role"] != "system"],
    }
    if system:
        block: dict[str, Any] = {"type": "text", "text": system}
        if cache_ttl:
            block["cache_control"] = {"type": "ephemeral", "ttl": cache_ttl}
        params["system"] = [block]
    if request.stop:
        params["stop_sequences"] = request.stop
    return params


def anthropic_text(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text")


def anthropic_usage(usage: dict[str, Any] | None) -> Usage:
    """A message's `usage`: input, cache read, cache creation, output."""
    usage = usage or {}
    return Usage(
        input_tokens=usage.get("input_tokens") or 0,
        cached_input_tokens=usage.get("cache_read_input_tokens") or 0,
        cache_write_tokens=usage.get("cache_creation_input_tokens") or 0,
        output_tokens=usage.get("output_tokens") or 0,
    )
