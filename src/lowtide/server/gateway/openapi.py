"""What `/openapi.json` declares for the gateway's own endpoints: request bodies and the
`X-Lowtide-*` headers, so a schema-driven fuzzer (schemathesis, tests/gateway) can reach
them. The handlers read the raw body themselves (it is forwarded byte for byte), so FastAPI
cannot infer these; the schemas hold only what the gateway reads, and say more may come."""

from __future__ import annotations

from typing import Any

_TEXT_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]}, "content": {"type": "string"}},
}
_HEADERS = [
    {"name": "X-Lowtide-Defer", "in": "header", "required": False, "description": "max wait: 90s, 10m, 2h, 1d (at most max_defer)",
     "schema": {"type": "string"}},
    {"name": "X-Lowtide-Prefer", "in": "header", "required": False, "schema": {"type": "string", "enum": ["realtime", "batch"]}},
    {"name": "X-Lowtide-Priority", "in": "header", "required": False, "schema": {"type": "string", "enum": ["realtime"]}},
    {"name": "X-Lowtide-Tag", "in": "header", "required": False, "schema": {"type": "string"}},
]  # fmt: skip


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}, "parameters": _HEADERS}


CHAT_COMPLETION = _body({
    "type": "object", "required": ["model", "messages"], "additionalProperties": True,
    "properties": {"model": {"type": "string"}, "messages": {"type": "array", "items": _TEXT_MESSAGE},
                   "max_tokens": {"type": "integer", "minimum": 1}, "temperature": {"type": "number"},
                   "stream": {"type": "boolean"}},
})  # fmt: skip
MESSAGE = _body({
    "type": "object", "required": ["model", "messages", "max_tokens"], "additionalProperties": True,
    "properties": {"model": {"type": "string"}, "messages": {"type": "array", "items": _TEXT_MESSAGE},
                   "max_tokens": {"type": "integer", "minimum": 1}, "system": {"type": "string"},
                   "stream": {"type": "boolean"}},
})  # fmt: skip
