"""What lowtide checks, it asks for: a job's `choices` or `response_schema` in each
endpoint's own structured-output field, so a provider constrains the answer instead of
lowtide paying for a wrong one and its repair.

| endpoint | `response_schema` (an object root) | `choices` |
|---|---|---|
| chat completions | `response_format` json_schema, `strict` where OpenAI's strict rules allow it | the same, with the choice schema below |
| responses | `text.format` json_schema, `strict` likewise | the same |
| Anthropic messages | `output_config.format` json_schema, in the form Anthropic's SDK sends (core/anthropic_schema.py); on a model without structured output, a forced call of the tool `lowtide_output` whose `input_schema` is the schema | the same |
| Gemini generateContent | `generationConfig.responseMimeType: application/json` + `responseJsonSchema` | `responseMimeType: text/x.enum` + `responseSchema` `{type: STRING, enum}` |
| completions | nothing: no field for it; the answer is checked after | nothing |

OpenAI and Anthropic take an object at the root, so `choices` are asked as
`{"choice": <one of them>}` (`choice_schema`); the answer is unwrapped before it is checked
and stored (`unwrap_choice`), so `output` is the bare choice on every route. A schema whose
root is not an object (and holds no `enum`, which counts as choices) has no native form on
those endpoints: it is checked after, as before, never sent to fail line by line.

A body that already says it (params, a row's own body) keeps its own: nothing here
overwrites a field the user set.

Anthropic's structured outputs (`output_config.format`) exist on Claude 4.5 and later
(Anthropic's "Structured outputs" page); an older model refuses the field. There the schema
is asked the way Anthropic documented before it: a tool `lowtide_output` with the schema as
its `input_schema`, and `tool_choice` forcing a call of it. The call's `input` is the answer
(`forced_text`): read as the answer's text on every path (core/answers.py,
routes/openai/wire.py), so it is checked, stored and exported like any JSON answer. A body with
tools of its own, or with extended thinking on (which refuses a forced tool), cannot be
forced: nothing is added and the answer is checked after.

OpenAI's strict mode (docs "Structured Outputs", "Supported schemas") takes a subset of
JSON Schema: every object lists all its properties in `required` and sets
`additionalProperties: false`, only the keywords in `STRICT_KEYWORDS`, at most
`STRICT_DEPTH` levels of nesting, an object (not `anyOf`) at the root. A schema outside it
is sent with `strict: false`, the relaxed form OpenAI documents (the model is asked, not
forced); lowtide checks the answer after either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from lowtide.core.anthropic_schema import sent_schema
from lowtide.core.endpoints import CHAT, GEMINI, MESSAGES, RESPONSES

CHOICE_KEY = "choice"
FORMAT_NAME = "output"
FORCED_TOOL = "lowtide_output"  # the tool an Anthropic model without structured output must call
FORCED_TOOL_DESCRIPTION = "Give your answer by calling this tool; its input is the answer."
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
    if not isinstance(schema, dict) or schema.get("type") != "object" or schema.get("required") != _CHOICE_REQUIRED:
        return None
    props = schema.get("properties")
    # (one key, CHOICE_KEY: what `set(props) == {CHOICE_KEY}` says, without making two sets)
    if not isinstance(props, dict) or len(props) != 1 or CHOICE_KEY not in props or not isinstance(props[CHOICE_KEY], dict):
        return None
    enum = props[CHOICE_KEY].get("enum")
    return list(enum) if isinstance(enum, list) and enum and _all_text(enum) else None


_CHOICE_REQUIRED = [CHOICE_KEY]


def _all_text(values: list[Any]) -> bool:
    """Whether every value is a str (or a subclass of str, as isinstance says): exactly what
    str.join takes, told in one pass in C (a test per value costs three times as much; an
    echo job asks this of every request)."""
    try:
        "".join(values)
    except TypeError:
        return False
    return True


def unwrap_choice(text: str | None) -> str | None:
    """The choice inside an answer `{"choice": "..."}`; any other text as it is."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    if text.__class__ is str and len(text) <= SHORT_ANSWER:  # a job's answers are its few choices: each read once
        return _unwrap_short(text)
    return _unwrap(text)


SHORT_ANSWER = 256  # characters of an answer whose unwrapping is remembered


@lru_cache(maxsize=512)
def _unwrap_short(text: str) -> str:
    return _unwrap(text)


def _unwrap(text: str) -> str:
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
        return body | messages_ask(body, ask.schema)
    if endpoint == GEMINI:
        config = body.get("generationConfig")
        if config is not None and not isinstance(config, dict):
            return body
        config = config or {}
        if config.keys() & {"responseMimeType", "responseSchema", "responseJsonSchema"}:
            return body
        return body | {"generationConfig": config | gemini_config(ask)}
    return body


def messages_ask(body: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The keys that ask an Anthropic messages `body` for `schema`: `output_config.format`
    where its model has structured output, else a forced call of `FORCED_TOOL`; {} where
    neither can be sent (the body's own tools, or extended thinking on)."""
    if anthropic_structured(body.get("model")):
        config = body.get("output_config")
        return {"output_config": (config if isinstance(config, dict) else {}) | {"format": {"type": "json_schema", "schema": sent_schema(schema)}}}
    if not forcible(body):
        return {}
    return {"tools": [{"name": FORCED_TOOL, "description": FORCED_TOOL_DESCRIPTION, "input_schema": schema}],
            "tool_choice": {"type": "tool", "name": FORCED_TOOL}}  # fmt: skip


def forcible(body: dict[str, Any]) -> bool:
    """Whether a forced tool can carry the ask: no tools or tool_choice of the body's own,
    and no extended thinking (Anthropic refuses a forced tool with it)."""
    thinking = body.get("thinking")
    thinking_on = isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled")
    return not body.get("tools") and body.get("tool_choice") is None and not thinking_on


# An Anthropic model's generation in its name: "claude-3-5-haiku-…" (family after the
# version) or "claude-sonnet-4-5-…" (family first; a date is not a minor version).
_VERSION_FIRST = re.compile(r"claude-(\d+)(?:-(\d)(?!\d))?-(?:opus|sonnet|haiku)")
_FAMILY_FIRST = re.compile(r"claude-(?:opus|sonnet|haiku)-(\d+)(?:-(\d{1,2})(?!\d))?")
STRUCTURED_SINCE = (4, 5)  # the first Claude generation with `output_config.format`


def anthropic_structured(model: Any) -> bool:
    """Whether an Anthropic model takes `output_config.format`: Claude 4.5 and later. A name
    with no generation in it (a newer naming, an alias lowtide cannot read) is taken to."""
    if not isinstance(model, str):
        return True
    found = _VERSION_FIRST.search(model) or _FAMILY_FIRST.search(model)
    if found is None:
        return True
    return (int(found.group(1)), int(found.group(2) or 0)) >= STRUCTURED_SINCE


def forced_text(block: Any) -> str | None:
    """The answer inside a content block that calls `FORCED_TOOL` (its `input`, as JSON
    text), else None."""
    if not isinstance(block, dict) or block.get("type") != "tool_use" or block.get("name") != FORCED_TOOL:
        return None
    return orjson.dumps(block.get("input")).decode()


def gemini_config(ask: Ask) -> dict[str, Any]:
    """The generationConfig keys that ask Gemini for `ask`: an enum answer for choices."""
    if ask.choices is not None:
        return {"responseMimeType": "text/x.enum", "responseSchema": {"type": _GEMINI_TYPE["string"], "enum": list(ask.choices)}}
    return {"responseMimeType": "application/json", "responseJsonSchema": ask.schema}


def _named(schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": FORMAT_NAME, "schema": schema, "strict": is_strict(schema)}
