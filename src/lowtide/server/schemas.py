"""What `/openapi.json` declares of the request bodies that handlers read themselves
(streamed, bounded: bodies.py), so a client generator or schemathesis can build them; and
pydantic validation of a parsed body into a 400 that names the field.

The body schemas describe the core of each body (model, messages, a few parameters); a
body may carry any other key of its endpoint, passed verbatim to the backend, whose route
refuses what it cannot honour, in the provider's shape (translate.py).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from lowtide.server.errors import ApiError

M = TypeVar("M", bound=BaseModel)

_TEXT = {"type": "string"}
_TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
               "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _TEXT}}  # fmt: skip
_CONTENT = {"anyOf": [_TEXT, {"type": "array", "minItems": 1, "items": _TEXT_BLOCK}]}

OPENAI_CHAT: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]}, "content": _CONTENT},
        }},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "stop": {"anyOf": [_TEXT, {"type": "array", "items": _TEXT}]},
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    },
}  # fmt: skip

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "system": _CONTENT,
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["user", "assistant"]}, "content": _CONTENT},
        }},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "stop_sequences": {"type": "array", "items": _TEXT},
        "stream": {"type": "boolean"},
    },
}  # fmt: skip

MESSAGE_BATCH: dict[str, Any] = {
    "type": "object",
    "required": ["requests"],
    "additionalProperties": False,
    "properties": {"requests": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["custom_id", "params"], "additionalProperties": False,
        "properties": {"custom_id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "params": ANTHROPIC_MESSAGE},
    }}},
}  # fmt: skip

FILE_UPLOAD: dict[str, Any] = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch", "assistants", "fine-tune", "vision", "user_data", "evals", "batch-api"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2_592_000},
    },
}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` for a route whose handler reads a JSON body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def form_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def validated(model: type[M], data: dict[str, Any], prefix: str = "") -> M:
    """`data` as `model`; a 400 naming the first field at fault (`prefix` before it) otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems, param = [], None
        for e in err.errors()[:20]:
            where = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
            param = param or where or None
            problems.append(f"{where or 'body'}: {e['msg']}")
        raise ApiError(400, "; ".join(problems), param=param) from None
