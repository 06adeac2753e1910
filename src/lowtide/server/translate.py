"""Translate at the edge: provider request bodies into lowtide source rows.

A source row is `{"custom_id", "messages": [{"role", "content"}], "max_tokens",
"temperature", "stop"}` with plain-text messages (the job's `template.messages_column`).
A body this server cannot run (a non-text content block, a bad parameter) becomes a
`Rejection`: the request fails alone, as the provider would fail it, and the batch goes on.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ANTHROPIC_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one request fails before it runs (an HTTP 4xx for that request alone)."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None

    def to_json(self, custom_id: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "status": self.status, "type": self.type, "code": self.code,
                "param": self.param, "message": self.message}  # fmt: skip


# The loader strips ids and refuses lone surrogates; an API's custom_id may be any string.
# Those that would not survive are carried as "~" + URL-safe base64 of their UTF-8.
def encode_key(custom_id: str) -> str:
    if custom_id and custom_id == custom_id.strip() and not custom_id.startswith("~"):
        try:
            custom_id.encode("utf-8")
            return custom_id
        except UnicodeEncodeError:
            pass
    raw = custom_id.encode("utf-8", "surrogatepass")
    return "~" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_key(key: str) -> str:
    if not key.startswith("~"):
        return key
    data = key[1:]
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)).decode("utf-8", "surrogatepass")


def _text(content: Any, where: str, block_types: tuple[str, ...]) -> str | Rejection:
    """A message's content as plain text: a string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for i, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in block_types or not isinstance(block.get("text"), str):
                return Rejection(
                    f"{where}.{i}: only text content blocks are supported by this server (got {kind or type(block).__name__})",
                    param=f"{where}.{i}",
                )
            parts.append(block["text"])
        return "\n".join(parts)
    return Rejection(f"{where}: expected a string or a non-empty list of text blocks", param=where)


def _number(value: Any, name: str, low: float, high: float, whole: bool = False) -> Rejection | None:
    ok = isinstance(value, int) if whole else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not low <= value <= high:
        kind = "an integer" if whole else "a number"
        return Rejection(f"{name}: must be {kind} from {low:g} to {high:g}; got {value!r}", param=name)
    return None


def _stops(value: Any, name: str) -> list[str] | Rejection | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value or None
    return Rejection(f"{name}: must be a string or a list of strings", param=name)


def openai_chat(body: dict[str, Any], default_max_tokens: int) -> dict[str, Any] | Rejection:
    """A /v1/chat/completions body as a source row (without its custom_id)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return Rejection("'messages' must be a non-empty array.", param="messages")
    rows = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in OPENAI_ROLES:
            return Rejection(
                f"messages[{i}].role: this server supports roles {', '.join(OPENAI_ROLES)} (got {role!r})",
                param=f"messages[{i}].role",
            )
        text = _text(m.get("content"), f"messages[{i}].content", ("text", "input_text"))
        if isinstance(text, Rejection):
            return text
        rows.append({"role": OPENAI_ROLES[role], "content": text})
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if bad := _number(max_tokens, "max_tokens", 1, 1_000_000, whole=True):
        return bad
    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    if bad := _number(temperature, "temperature", 0, 2):
        return bad
    if body.get("n") not in (None, 1):
        return Rejection("n: this server returns one choice per request; use n=1", param="n")
    if body.get("stream"):
        return Rejection("stream: batch requests cannot be streamed", param="stream")
    stop = _stops(body.get("stop"), "stop")
    if isinstance(stop, Rejection):
        return stop
    return _row(rows, max_tokens, temperature, stop)


def anthropic_params(params: dict[str, Any]) -> dict[str, Any] | Rejection:
    """A Messages API `params` object as a source row (without its custom_id)."""
    if not isinstance(params.get("model"), str) or not params["model"]:
        return Rejection("model: Field required")
    if "max_tokens" not in params:
        return Rejection("max_tokens: Field required")
    if bad := _number(params["max_tokens"], "max_tokens", 1, 1_000_000, whole=True):
        return bad
    rows = []
    system = params.get("system")
    if system is not None:
        text = _text(system, "system", ("text",))
        if isinstance(text, Rejection):
            return text
        rows.append({"role": "system", "content": text})
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        return Rejection("messages: Field required (a non-empty list)")
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ANTHROPIC_ROLES:
            return Rejection(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        text = _text(m.get("content"), f"messages.{i}.content", ("text",))
        if isinstance(text, Rejection):
            return text
        rows.append({"role": role, "content": text})
    temperature = params.get("temperature", 1.0)
    if bad := _number(temperature, "temperature", 0, 1):
        return bad
    for unsupported in ("tools", "tool_choice", "thinking"):
        if params.get(unsupported):
            return Rejection(f"{unsupported}: not supported by this server (plain text messages only)")
    if params.get("stream"):
        return Rejection("stream: batch requests cannot be streamed")
    stop = _stops(params.get("stop_sequences"), "stop_sequences")
    if isinstance(stop, Rejection):
        return stop
    return _row(rows, params["max_tokens"], temperature, stop)


def _row(messages: list[dict[str, str]], max_tokens: int, temperature: float, stop: list[str] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
    if stop:
        row["stop"] = stop
    return row
