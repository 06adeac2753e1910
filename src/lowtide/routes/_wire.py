"""The providers' wire shapes, shared by their batch and direct routes: one place builds a
request body and reads usage for each provider, whether the request goes in a batch file or
over a real-time call.

`ChatRequest.choices` is never sent as a provider field: the template already puts the
choices in the prompt text, and the engine validates the answer.

The tier a response says it was served at is translated here into lowtide's words
(`Outcome.tier`, priced by the ledger):

| provider field | value | real-time route | batch route |
|---|---|---|---|
| OpenAI body `service_tier` | `default`, `auto`, `standard`, `scale` | realtime | batch |
| | `flex` / `priority` | flex / priority | flex / priority |
| Anthropic `usage.service_tier` | `standard` | realtime | batch |
| | `priority` / `batch` | priority / batch | priority / batch |

Anything else, or no field, is None: the route's configured tier is used.
"""

from __future__ import annotations

import json
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


def count(value: Any) -> int:
    """A token count as a provider reported it: a non-negative integer (or an integral number
    or digits in a string); anything else is 0, never carried into the ledger as it is."""
    if type(value) is int:  # the usual case first: ingest reads four counts per result
        return value if value > 0 else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


def text_or_none(value: Any) -> str | None:
    """A code, reason or message as text (a provider's odd object, serialised)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)[:2000]


def _details(usage: dict[str, Any], key: str) -> dict[str, Any]:
    value = usage.get(key)
    return value if isinstance(value, dict) else {}


def openai_usage(usage: dict[str, Any] | None) -> Usage:
    """A chat completion's `usage`, as reported (prompt, cached prompt, completion, reasoning)."""
    usage = usage if isinstance(usage, dict) else {}
    return Usage(
        input_tokens=count(usage.get("prompt_tokens")),
        cached_input_tokens=count(_details(usage, "prompt_tokens_details").get("cached_tokens")),
        output_tokens=count(usage.get("completion_tokens")),
        reasoning_tokens=count(_details(usage, "completion_tokens_details").get("reasoning_tokens")),
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
    usage = usage if isinstance(usage, dict) else {}
    return Usage(
        input_tokens=count(usage.get("input_tokens")),
        cached_input_tokens=count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=count(usage.get("cache_creation_input_tokens")),
        output_tokens=count(usage.get("output_tokens")),
    )


_OPENAI_STANDARD = frozenset({"default", "auto", "standard", "scale"})
_OWN_WORDS = frozenset({"flex", "priority", "batch"})


def openai_tier(value: Any, batch: bool) -> str | None:
    """A chat completion's `service_tier`, in lowtide's words (see the module doc)."""
    if not isinstance(value, str):
        return None
    if value in _OPENAI_STANDARD:
        return "batch" if batch else "realtime"
    return value if value in _OWN_WORDS else None


def anthropic_tier(usage: Any, batch: bool) -> str | None:
    """A message's `usage.service_tier`, in lowtide's words (see the module doc)."""
    value = usage.get("service_tier") if isinstance(usage, dict) else None
    if not isinstance(value, str):
        return None
    if value == "standard":
        return "batch" if batch else "realtime"
    return value if value in _OWN_WORDS else None
