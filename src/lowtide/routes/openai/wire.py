"""OpenAI's wire, shared by the `openai` and `openai-batch` routes (and the OpenAI-shaped
batch routes at Azure, Mistral, OpenRouter and the compatible providers): who may take a
request, and an answer body read into an `Outcome`.

`Request.choices` and `Request.response_schema` are lowtide's checks of the answer, never
sent as fields of their own (the loader has put the schema in the body where the endpoint
takes one).

The tier a response says it was served at is translated here into lowtide's words
(`Outcome.tier`, priced by the ledger):

| provider field | value | real-time route | batch route |
|---|---|---|---|
| body `service_tier` | `default`, `auto`, `standard`, `scale` | realtime | batch |
| | `flex` / `priority` | flex / priority | flex / priority |

Anything else, or no field, is None: the route's configured tier is used.
"""

from __future__ import annotations

import json
from typing import Any

from lowtide.core.endpoints import COMPLETIONS, EMBEDDINGS, MODERATIONS, PROTOCOL, RESPONSES
from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes.wire import OWN_TIER_WORDS, count, stream_refusal, text_or_none


def openai_refusal(request: Request, route: str) -> Refusal | None:
    """Why an OpenAI route cannot take `request`: an Anthropic or Gemini body, or a stream.
    A key the installed SDK does not declare is carried, not refused (see the module doc)."""
    if PROTOCOL.get(request.endpoint) != "openai":
        other = {"anthropic": "an Anthropic", "gemini": "a Gemini"}.get(PROTOCOL.get(request.endpoint, ""), "another")
        return Refusal("endpoint", f"{request.endpoint} is not an OpenAI endpoint; send it to {other} route")
    return stream_refusal(request.body)


def openai_text(endpoint: str, data: dict[str, Any]) -> tuple[str, str | None]:
    """The answer text and finish reason of a chat completion, a response or a completion."""
    if endpoint == RESPONSES:
        texts = [
            part.get("text", "")
            for item in data.get("output") or []
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text"
        ]
        return "".join(texts), text_or_none(data.get("status"))
    choice = data["choices"][0]
    if endpoint == COMPLETIONS:
        return choice.get("text") or "", text_or_none(choice.get("finish_reason"))
    content = choice["message"].get("content")
    text = content if isinstance(content, str) else text_or_none(content) or ""
    return text, text_or_none(choice.get("finish_reason"))


def moderation_text(data: dict[str, Any]) -> str:
    """What a moderation answer stores as its `output`: the verdict on its input as compact
    JSON, `results[0]` ({"flagged", "categories", "category_scores",
    "category_applied_input_types"}); the list of results where a body had several inputs."""
    results = data["results"]  # KeyError, TypeError: an unreadable answer, as for the other endpoints
    if not isinstance(results, list):
        raise TypeError(f"results is {type(results).__name__}, not a list")
    verdict = results[0] if len(results) == 1 else results
    return json.dumps(verdict, ensure_ascii=False, separators=(",", ":"))


def openai_outcome(custom_id: str, endpoint: str, data: dict[str, Any], batch: bool) -> Outcome:
    """A successful OpenAI answer body as an Outcome that keeps the whole body."""
    if endpoint == MODERATIONS:  # a verdict, no usage (moderations are not billed by the token)
        return Outcome(custom_id, True, text=moderation_text(data), tier=openai_tier(data.get("service_tier"), batch=batch),
                       response=data)  # fmt: skip
    if endpoint == EMBEDDINGS:  # vectors, no text: the engine reads them from the kept body
        return Outcome(custom_id, True, usage=openai_usage(data.get("usage")), tier=openai_tier(data.get("service_tier"), batch=batch),
                       response=data)  # fmt: skip
    text, finish = openai_text(endpoint, data)
    usage = responses_usage(data.get("usage")) if endpoint == RESPONSES else openai_usage(data.get("usage"))
    return Outcome(custom_id, True, text=text, finish_reason=finish, usage=usage,
                   tier=openai_tier(data.get("service_tier"), batch=batch), response=data)  # fmt: skip


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


def responses_usage(usage: dict[str, Any] | None) -> Usage:
    """A response's `usage` (input, cached input, output, reasoning)."""
    usage = usage if isinstance(usage, dict) else {}
    return Usage(
        input_tokens=count(usage.get("input_tokens")),
        cached_input_tokens=count(_details(usage, "input_tokens_details").get("cached_tokens")),
        output_tokens=count(usage.get("output_tokens")),
        reasoning_tokens=count(_details(usage, "output_tokens_details").get("reasoning_tokens")),
    )


_OPENAI_STANDARD = frozenset({"default", "auto", "standard", "scale"})


def openai_tier(value: Any, batch: bool) -> str | None:
    """A chat completion's `service_tier`, in lowtide's words (see the module doc)."""
    if not isinstance(value, str):
        return None
    if value in _OPENAI_STANDARD:
        return "batch" if batch else "realtime"
    return value if value in OWN_TIER_WORDS else None
