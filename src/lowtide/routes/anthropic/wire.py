"""Anthropic's wire, shared by the `anthropic` and `anthropic-batch` routes: the params of one
Messages call (a messages body verbatim, a chat completions body translated once by
`translate.py`), what Anthropic would refuse, and a message read into an `Outcome`.

The tier a message says it was served at, in lowtide's words (`Outcome.tier`):

| `usage.service_tier` | real-time route | batch route |
|---|---|---|
| `standard` | realtime | batch |
| `priority` / `batch` | priority / batch | priority / batch |

Anything else, or no field, is None: the route's configured tier is used.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.anthropic_schema import schema_problem_cached
from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.core.native_schema import anthropic_structured, forced_text
from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes.anthropic.translate import chat_to_messages
from lowtide.routes.wire import OWN_TIER_WORDS, count, stream_refusal, text_or_none


def anthropic_params(request: Request, cache_ttl: str | None = None) -> dict[str, Any] | Refusal:
    """The params of one Messages call: a messages body verbatim, or a chat completions body
    translated (`translate.py`). With `cache_ttl` ("5m" or "1h") lowtide's `cache_prefix`
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
    refused = stream_refusal(params)
    if refused is not None:
        return refused
    # A translated body holds what translate.py's table writes, the API's own keys whether
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


def anthropic_usage(usage: dict[str, Any] | None) -> Usage:
    """A message's `usage`: input, cache read, cache creation, output."""
    usage = usage if isinstance(usage, dict) else {}
    return Usage(
        input_tokens=count(usage.get("input_tokens")),
        cached_input_tokens=count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=count(usage.get("cache_creation_input_tokens")),
        output_tokens=count(usage.get("output_tokens")),
    )


def anthropic_tier(usage: Any, batch: bool) -> str | None:
    """A message's `usage.service_tier`, in lowtide's words (see the module doc)."""
    value = usage.get("service_tier") if isinstance(usage, dict) else None
    if not isinstance(value, str):
        return None
    if value == "standard":
        return "batch" if batch else "realtime"
    return value if value in OWN_TIER_WORDS else None
