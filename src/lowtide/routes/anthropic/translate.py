"""The one documented mapping from a chat completions body to an Anthropic Messages body,
for an OpenAI-shaped request routed to `anthropic` or `anthropic-batch` (a fallback lane,
a spec that says `endpoint: /v1/chat/completions`). What has no mapping is refused by name
(`Refusal`), never dropped (DESIGN invariant 8). docs/jobs.md "Endpoints" has the table.

| chat completions | Anthropic messages |
|---|---|
| `system` / `developer` messages (before the first other turn) | `system` text blocks, in order |
| `user` text | the same text; `user` / `assistant` text parts, `assistant` text | `text` blocks |
| `image_url` part (data: URL, or http(s) URL) | `image` block, `base64` or `url` source |
| `file` part with `file_data` (a PDF data URL), its `filename` | `document` block, `base64` source, `title` |
| assistant `tool_calls` | `tool_use` blocks (arguments parsed as JSON) |
| `tool` message | a user turn with a `tool_result` block |
| `max_completion_tokens` or `max_tokens` (required; both at once are refused, naming both) | `max_tokens` |
| `response_format` json_schema (`strict` is Anthropic's own behaviour) | `output_config.format` json_schema, the schema as the anthropic SDK sends it; before Claude 4.5, a forced tool (core/native_schema.py `messages_ask`) |
| `response_format` text | (Anthropic's own behaviour: nothing to send) |
| `temperature` (0–1), `top_p` | the same, where the Messages API takes them (the anthropic SDK's own request type says; the SDK of late 2026 declares neither, so they are refused) |
| `stop` | `stop_sequences` |
| `tools` (functions) | `tools` (`input_schema` = `parameters`) |
| `tool_choice` auto / required / none / a function | `{type: auto}` / `{type: any}` / `{type: none}` / `{type: tool, name}` |
| `parallel_tool_calls: false` | `tool_choice.disable_parallel_tool_use: true` |
| `user` | `metadata.user_id` |
| `n: 1` | (the only number of answers Anthropic gives) |
| `parallel_tool_calls: true` | (Anthropic's own behaviour: nothing to send) |
"""

from __future__ import annotations

import json
from typing import Any

from lowtide.core.native_schema import messages_ask
from lowtide.core.types import Refusal

MAPPED = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "stop", "tools", "tool_choice",
    "parallel_tool_calls", "user", "n", "response_format",
})  # fmt: skip
SAMPLING = ("temperature", "top_p")  # the Messages API takes both, whether or not the SDK declares them
_MEDIA = ("image/jpeg", "image/png", "image/gif", "image/webp")


class _Refused(Exception):
    def __init__(self, field: str, reason: str):
        self.refusal = Refusal(field, reason)


def chat_to_messages(body: dict[str, Any]) -> dict[str, Any] | Refusal:
    """The Anthropic body for a chat completions body, or why it has none."""
    try:
        return _translate(body)
    except _Refused as refused:
        return refused.refusal


def _translate(body: dict[str, Any]) -> dict[str, Any]:
    for key in body:
        if key not in MAPPED and key not in SAMPLING:
            raise _Refused(key, "has no Anthropic mapping; remove it, or send this request to an OpenAI route")
    out: dict[str, Any] = {"model": body.get("model")}
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is not None:
        raise _Refused("max_completion_tokens", "and max_tokens are both set; Anthropic takes one limit: keep one of them")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        raise _Refused("max_tokens", "Anthropic's Messages API requires a limit: set max_tokens (or max_completion_tokens)")
    out["max_tokens"] = limit
    system, turns = _conversation(body.get("messages"))
    if system:
        out["system"] = system
    out["messages"] = turns
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, int | float) and temperature > 1:
            raise _Refused("temperature", f"Anthropic takes 0 to 1; got {temperature}")
        out["temperature"] = temperature
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if body.get("n", 1) != 1:
        raise _Refused("n", f"Anthropic returns one answer per request; got n={body['n']!r}")
    if body.get("tools"):
        out["tools"] = [_tool(t, i) for i, t in enumerate(body["tools"])]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    if body.get("user") is not None:
        out["metadata"] = {"user_id": body["user"]}
    schema = _output_schema(body.get("response_format"))
    if schema is not None:
        asked = messages_ask(out, schema)
        if not asked:
            raise _Refused("response_format", f"{out['model']!r} has no structured output, and the request's own tools leave "
                           "no forced tool to ask it through: use a Claude 4.5 or later model, or drop the tools")  # fmt: skip
        out |= asked
    return out


def _output_schema(fmt: Any) -> dict[str, Any] | None:
    """The schema of a `response_format`, asked of Anthropic as `output_config.format` (or a
    forced tool, core/native_schema.py `messages_ask`): json_schema maps; text is the default;
    json_object (any JSON, no schema) has no Anthropic form."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind != "json_schema":
        raise _Refused("response_format.type", f"{kind!r} has no Anthropic mapping (json_schema or text); give a json_schema")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise _Refused("response_format.json_schema.schema", "a json_schema format needs its schema for Anthropic")
    return spec["schema"]


def _conversation(messages: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise _Refused("messages", "expected a non-empty list of messages")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _Refused(where, "expected a message object")
        role = m.get("role")
        extra = set(m) - {"role", "content", "tool_calls", "tool_call_id"}
        if extra:
            raise _Refused(f"{where}.{sorted(extra)[0]}", "has no Anthropic mapping")
        if role in ("system", "developer"):
            if turns:
                raise _Refused(f"{where}.role", "a system message after the conversation began has no Anthropic mapping")
            system += _blocks(m.get("content"), f"{where}.content", text_only=True)
        elif role == "user":  # text stays text, as sent; parts become blocks
            content = m.get("content")
            turns.append({"role": "user", "content": content if isinstance(content, str) else _blocks(content, f"{where}.content")})
        elif role == "assistant":
            content = [] if m.get("content") in (None, "", []) else _blocks(m.get("content"), f"{where}.content", text_only=True)
            for j, call in enumerate(m.get("tool_calls") or []):
                content.append(_tool_use(call, f"{where}.tool_calls[{j}]"))
            turns.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": _blocks(m.get("content"), f"{where}.content", text_only=True)}
            turns.append({"role": "user", "content": [block]})
        else:
            raise _Refused(f"{where}.role", f"role {role!r} has no Anthropic mapping")
    return system, turns


def _blocks(content: Any, where: str, text_only: bool = False) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise _Refused(where, "expected text or a non-empty list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{j}]"
        if kind == "text" and set(part) <= {"type", "text"}:
            out.append({"type": "text", "text": part.get("text")})
        elif kind == "image_url" and not text_only:
            out.append(_image(part.get("image_url"), at))
        elif kind == "file" and not text_only:
            out.append(_document(part.get("file"), at))
        else:
            raise _Refused(at, f"content part {kind!r} has no Anthropic mapping here")
    return out


def _data_url(url: str, at: str) -> tuple[str, str]:
    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise _Refused(at, "expected a base64 data: URL")
    return head[5:-7], data


def _image(image: Any, at: str) -> dict[str, Any]:
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        raise _Refused(f"{at}.image_url", "expected {url}")
    if set(image) - {"url"}:
        raise _Refused(f"{at}.image_url.{sorted(set(image) - {'url'})[0]}", "has no Anthropic mapping (detail)")
    url = image["url"]
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    media, data = _data_url(url, f"{at}.image_url.url")
    if media not in _MEDIA:
        raise _Refused(f"{at}.image_url.url", f"Anthropic takes {', '.join(_MEDIA)} images; got {media}")
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


def _document(file: Any, at: str) -> dict[str, Any]:
    if not isinstance(file, dict) or not isinstance(file.get("file_data"), str) or set(file) - {"file_data", "filename"}:
        raise _Refused(f"{at}.file", "only inline file_data (a PDF data URL) has an Anthropic mapping")
    media, data = _data_url(file["file_data"], f"{at}.file.file_data")
    if media != "application/pdf":
        raise _Refused(f"{at}.file.file_data", f"Anthropic documents are PDFs here; got {media}")
    out = {"type": "document", "source": {"type": "base64", "media_type": media, "data": data}}
    if file.get("filename") is not None:  # the document's name, as Anthropic's `title`
        out["title"] = file["filename"]
    return out


def _tool_use(call: Any, at: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or call.get("type", "function") != "function":
        raise _Refused(at, "only function tool calls have an Anthropic mapping")
    try:
        arguments = json.loads(fn.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        raise _Refused(f"{at}.function.arguments", "must be a JSON object (as text)") from None
    return {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": arguments}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or tool.get("type") != "function":
        raise _Refused(f"tools[{i}]", "only function tools have an Anthropic mapping")
    extra = set(fn) - {"name", "description", "parameters"}
    if extra:
        raise _Refused(f"tools[{i}].function.{sorted(extra)[0]}", "has no Anthropic mapping")
    out = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}
    if fn.get("description") is not None:
        out["description"] = fn["description"]
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        out = None
    elif choice in ("auto", "required", "none"):
        out = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise _Refused("tool_choice", f"{choice!r} has no Anthropic mapping")
    if parallel is False:
        out = (out or {"type": "auto"}) | {"disable_parallel_tool_use": True}
    return out
