"""What lowtide checks, it asks for: a job's `choices` or `response_schema` in each
endpoint's own structured-output field, so a provider constrains the answer instead of
lowtide paying for a wrong one and its repair.

| endpoint | `response_schema` (an object root) | `choices` |
|---|---|---|
| chat completions | `response_format` json_schema, `strict` where OpenAI's strict rules allow it | the same, with the choice schema below |
| responses | `text.format` json_schema, `strict` likewise | the same |
| Anthropic messages | `output_config.format` json_schema, in the form Anthropic's SDK sends (`anthropic_schema`) | the same |
| Gemini generateContent | `generationConfig.responseMimeType: application/json` + `responseJsonSchema` | `responseMimeType: text/x.enum` + `responseSchema` `{type: STRING, enum}` |
| completions | nothing: no field for it; the answer is checked after | nothing |

OpenAI and Anthropic take an object at the root, so `choices` are asked as
`{"choice": <one of them>}` (`choice_schema`); the answer is unwrapped before it is checked
and stored (`unwrap_choice`), so `output` is the bare choice on every route. A schema whose
root is not an object (and holds no `enum`, which counts as choices) has no native form on
those endpoints: it is checked after, as before, never sent to fail line by line.

A body that already says it (params, a row's own body) keeps its own: nothing here
overwrites a field the user set.

OpenAI's strict mode (docs "Structured Outputs", "Supported schemas") takes a subset of
JSON Schema: every object lists all its properties in `required` and sets
`additionalProperties: false`, only the keywords in `STRICT_KEYWORDS`, at most
`STRICT_DEPTH` levels of nesting, an object (not `anyOf`) at the root. A schema outside it
is sent with `strict: false`, the relaxed form OpenAI documents (the model is asked, not
forced); lowtide checks the answer after either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from lowtide.core.endpoints import CHAT, GEMINI, MESSAGES, RESPONSES

CHOICE_KEY = "choice"
FORMAT_NAME = "output"
# OpenAI strict mode's keywords (its "Supported schemas" page), annotations included.
STRICT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref", "$defs",
    "definitions", "description", "title", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "$schema", "default",
})  # fmt: skip
STRICT_DEPTH = 10  # "up to 10 levels of nesting"
# Gemini's OpenAPI-subset type names, for its `responseSchema`.
_GEMINI_TYPE = {"string": "STRING"}


@dataclass(frozen=True, slots=True)
class Ask:
    """What a job asks of every answer, in JSON Schema: `schema` (an object at the root),
    and the `choices` it stands for (the choice schema) or None."""

    schema: dict[str, Any]
    choices: tuple[str, ...] | None = None


def ask_of(choices: list[str] | None, schema: dict[str, Any] | None) -> Ask | None:
    """The native ask for a job's `choices` (or its schema's root `enum`) and `response_schema`;
    None where there is nothing to ask natively (a non-object root)."""
    if choices:
        return Ask(choice_schema(choices), tuple(choices))
    if isinstance(schema, dict) and schema.get("type") == "object":
        return Ask(schema)
    return None


def choice_schema(choices: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`choices` as an object schema (OpenAI and Anthropic take objects at the root)."""
    return {
        "type": "object", "properties": {CHOICE_KEY: {"type": "string", "enum": list(choices)}},
        "required": [CHOICE_KEY], "additionalProperties": False,
    }  # fmt: skip


def choices_of(schema: Any) -> list[str] | None:
    """The choices a schema of `choice_schema`'s shape stands for, else None (own engines
    answer such a schema as choices, not as an instance)."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or schema.get("required") != [CHOICE_KEY]:
        return None
    props = schema.get("properties")
    if not isinstance(props, dict) or set(props) != {CHOICE_KEY} or not isinstance(props[CHOICE_KEY], dict):
        return None
    enum = props[CHOICE_KEY].get("enum")
    return list(enum) if isinstance(enum, list) and enum and all(isinstance(c, str) for c in enum) else None


def unwrap_choice(text: str | None) -> str | None:
    """The choice inside an answer `{"choice": "..."}`; any other text as it is."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(CHOICE_KEY), str):
        return value[CHOICE_KEY]
    return text


def choice_tokens(choices: list[str]) -> int:
    """A generous count of the output tokens `{"choice": "<the longest choice>"}` takes:
    the wrapper's 4, and a token per 2 bytes of the choice (most tokenizers do better)."""
    return 4 + -(-max(len(c.encode()) for c in choices) // 2)


def strict_problem(schema: Any) -> str | None:
    """Why OpenAI's strict mode would refuse `schema` (the keyword, by its path), or None."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "(root): strict mode takes an object at the root"
    return _strict(schema, "(root)", 1)


def _strict(schema: Any, path: str, depth: int) -> str | None:
    if not isinstance(schema, dict):
        return None if isinstance(schema, bool) else f"{path}: not a schema"
    if depth > STRICT_DEPTH:
        return f"{path}: deeper than {STRICT_DEPTH} levels"
    for key in schema:
        if key not in STRICT_KEYWORDS:
            return f"{path}.{key}: not a keyword strict mode takes"
    kinds = schema.get("type")
    if kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return f"{path}.additionalProperties: strict mode needs false on every object"
        if sorted(schema.get("required") or []) != sorted(props):
            return f"{path}.required: strict mode needs every property listed"
        for name, sub in props.items():
            found = _strict(sub, f"{path}.properties.{name}", depth + 1)
            if found:
                return found
    if "items" in schema:
        found = _strict(schema["items"], f"{path}.items", depth + 1)
        if found:
            return found
    for i, sub in enumerate(schema.get("anyOf") or []):
        found = _strict(sub, f"{path}.anyOf.{i}", depth)
        if found:
            return found
    for group in ("$defs", "definitions"):
        for name, sub in (schema.get(group) or {}).items():
            found = _strict(sub, f"{path}.{group}.{name}", 1)
            if found:
                return found
    return None


def is_strict(schema: dict[str, Any]) -> bool:
    return _strict_cached(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


@lru_cache(maxsize=64)
def _strict_cached(text: bytes) -> bool:
    return strict_problem(orjson.loads(text)) is None


def anthropic_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` in the form the anthropic SDK sends it as `output_config.format.schema`
    (its `transform_schema`: every object closed, keywords Anthropic's structured outputs
    do not take moved into `description`), so the API takes it; lowtide checks the answer
    against the schema as written. Without the helper (an older SDK) it goes as written."""
    return orjson.loads(_anthropic_cached(orjson.dumps(schema)))


@lru_cache(maxsize=64)
def _anthropic_cached(text: bytes) -> bytes:
    """Transformed once per distinct schema: a job of whole bodies asks it for every row."""
    try:
        from anthropic import transform_schema
    except ImportError:  # pragma: no cover - SDKs before structured outputs
        return text
    return orjson.dumps(transform_schema(orjson.loads(text)))


def with_ask(body: dict[str, Any], endpoint: str, ask: Ask) -> dict[str, Any]:
    """`body` with `ask` in `endpoint`'s own field, where the body does not say one already
    (a user's `response_format` / `text.format` / `output_config.format` / Gemini response
    schema always wins). A body with nowhere to put it is returned as it is."""
    if endpoint == CHAT:
        if body.get("response_format") is not None:
            return body
        return body | {"response_format": {"type": "json_schema", "json_schema": _named(ask.schema)}}
    if endpoint == RESPONSES:
        text = body.get("text")
        if isinstance(text, dict) and text.get("format") is not None or (text is not None and not isinstance(text, dict)):
            return body
        return body | {"text": (text or {}) | {"format": {"type": "json_schema", **_named(ask.schema)}}}
    if endpoint == MESSAGES:
        config = body.get("output_config")
        if isinstance(config, dict) and config.get("format") is not None or (config is not None and not isinstance(config, dict)):
            return body
        return body | {"output_config": (config or {}) | {"format": {"type": "json_schema", "schema": anthropic_schema(ask.schema)}}}
    if endpoint == GEMINI:
        config = body.get("generationConfig")
        if config is not None and not isinstance(config, dict):
            return body
        config = config or {}
        if config.keys() & {"responseMimeType", "responseSchema", "responseJsonSchema"}:
            return body
        return body | {"generationConfig": config | gemini_config(ask)}
    return body


def gemini_config(ask: Ask) -> dict[str, Any]:
    """The generationConfig keys that ask Gemini for `ask`: an enum answer for choices."""
    if ask.choices is not None:
        return {"responseMimeType": "text/x.enum", "responseSchema": {"type": _GEMINI_TYPE["string"], "enum": list(ask.choices)}}
    return {"responseMimeType": "application/json", "responseJsonSchema": ask.schema}


def _named(schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": FORMAT_NAME, "schema": schema, "strict": is_strict(schema)}
