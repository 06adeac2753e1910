"""The providers' wire shapes, shared by their batch and direct routes: one place builds a
request body and reads usage for each provider, whether the request goes in a batch file or
over a real-time call.

A stored body goes to a provider of its own protocol verbatim; a chat completions body
sent to Anthropic is translated once (`_translate.py`). On such a same-protocol route a
top-level key the installed SDK does not declare (an older SDK's `temperature`, a newer
API's parameter) is not refused: it travels in the body as it came, as the SDKs'
`extra_body` would send it (`undeclared` names them; the loader notes each once per job,
engine/carried.py). Only `stream` and `stream_options` are refused: nobody reads a stream. `Request.choices` and
`Request.response_schema` are lowtide's checks of the answer, never sent as fields of their
own (the loader has put the schema in the body where the endpoint takes one).

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

from lowtide.core.anthropic_schema import schema_problem_cached
from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    MODERATIONS,
    NEVER,
    PROTOCOL,
    RESPONSES,
    known_keys,
)
from lowtide.core.native_schema import anthropic_structured, forced_text
from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes._translate import chat_to_messages


def undeclared(endpoint: str, body: dict[str, Any]) -> list[str]:
    """The top-level keys of `body` the installed SDK's request type for `endpoint` does not
    declare: a same-protocol route carries them as they are (see the module doc)."""
    known = known_keys(endpoint)
    return [key for key in body if key not in known and key not in NEVER]


def openai_refusal(request: Request, route: str) -> Refusal | None:
    """Why an OpenAI route cannot take `request`: an Anthropic or Gemini body, or a stream.
    A key the installed SDK does not declare is carried, not refused (see the module doc)."""
    if PROTOCOL.get(request.endpoint) != "openai":
        other = {"anthropic": "an Anthropic", "gemini": "a Gemini"}.get(PROTOCOL.get(request.endpoint, ""), "another")
        return Refusal("endpoint", f"{request.endpoint} is not an OpenAI endpoint; send it to {other} route")
    return _stream_refusal(request.body)


def _stream_refusal(body: dict[str, Any]) -> Refusal | None:
    for key in NEVER:
        if key in body:
            return Refusal(key, "a batch or stored request cannot be streamed; remove it")
    return None


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


def anthropic_params(request: Request, cache_ttl: str | None = None) -> dict[str, Any] | Refusal:
    """The params of one Messages call: a messages body verbatim, or a chat completions body
    translated (`_translate.py`). With `cache_ttl` ("5m" or "1h") lowtide's `cache_prefix`
    marks the last system block `cache_control: ephemeral` with that TTL, unless the user
    marked some block already (theirs is kept as it is)."""
    if request.endpoint == MESSAGES:
        params = request.body
    elif request.endpoint == CHAT:
        params = chat_to_messages(request.body)
        if isinstance(params, Refusal):
            return params
    else:
        return Refusal("endpoint", f"{request.endpoint} has no Anthropic mapping; use an OpenAI route")
    if cache_ttl and params.get("system"):
        params = dict(params)
        system = params["system"]
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) else [dict(b) for b in system]
        if not any("cache_control" in b for b in blocks):
            blocks[-1]["cache_control"] = {"type": "ephemeral", "ttl": cache_ttl}
        params["system"] = blocks
    return params


def anthropic_refusal(request: Request) -> Refusal | None:
    """Why an Anthropic route cannot take `request` (checked before anything is sent)."""
    params = anthropic_params(request)
    if isinstance(params, Refusal):
        return params
    refused = _stream_refusal(params)
    if refused is not None:
        return refused
    # A translated body holds what _translate.py's table writes, the API's own keys whether
    # or not the installed SDK still declares them (anthropic's dropped `temperature`).
    if params.get("max_tokens") is None:
        return Refusal("max_tokens", "Anthropic's Messages API requires it; set params.max_tokens")
    return structured_output_refusal(params)


def structured_output_refusal(params: dict[str, Any]) -> Refusal | None:
    """What Anthropic would refuse line by line in `output_config.format`: the field on a
    model before Claude 4.5 (lowtide's own `response_schema` is asked of those through a
    forced tool instead), or a schema its structured outputs cannot take
    (core/anthropic_schema.py)."""
    config = params.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if not isinstance(fmt, dict):
        return None
    if not anthropic_structured(params.get("model")):
        return Refusal("output_config.format", f"{params.get('model')!r} has no structured output (Claude 4.5 and later "
                       "have it); remove it and set the job's response_schema, which lowtide asks of older models "
                       "through a forced tool")  # fmt: skip
    problem = schema_problem_cached(fmt.get("schema"))
    return None if problem is None else Refusal("output_config.format.schema", problem)


def anthropic_outcome(custom_id: str, message: dict[str, Any], batch: bool) -> Outcome:
    """A message as an Outcome that keeps the whole message."""
    return Outcome(custom_id, True, text=anthropic_text(message), finish_reason=text_or_none(message.get("stop_reason")),
                   usage=anthropic_usage(message.get("usage")), tier=anthropic_tier(message.get("usage"), batch=batch),
                   response=message)  # fmt: skip


def anthropic_text(message: dict[str, Any]) -> str:
    """The message's text blocks; a call of lowtide's forced tool is the answer too
    (core/native_schema.py `forced_text`)."""
    return "".join(
        b.get("text", "") if b.get("type") == "text" else forced_text(b) or ""
        for b in message.get("content") or [] if isinstance(b, dict)
    )  # fmt: skip


def responses_usage(usage: dict[str, Any] | None) -> Usage:
    """A response's `usage` (input, cached input, output, reasoning)."""
    usage = usage if isinstance(usage, dict) else {}
    return Usage(
        input_tokens=count(usage.get("input_tokens")),
        cached_input_tokens=count(_details(usage, "input_tokens_details").get("cached_tokens")),
        output_tokens=count(usage.get("output_tokens")),
        reasoning_tokens=count(_details(usage, "output_tokens_details").get("reasoning_tokens")),
    )


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
