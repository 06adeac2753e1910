"""Gemini's `generateContent` request body, in its REST shape (what a batch JSONL line's
`request` holds and what `POST models/{model}:generateContent` takes).

The keys are read from the official `google-genai` SDK, not kept here: the SDK's converter
from its own `GenerateContentConfig` to the Gemini Developer API's wire body
(`google.genai.models._GenerateContentConfig_to_mldev`) writes each REST key once, either at
the top of the body (`systemInstruction`, `tools`, `serviceTier`, ...) or inside
`generationConfig` (`maxOutputTokens`, `temperature`, ...). Reading its `setv` calls gives
both lists, so a field the SDK adds is known the day it ships.

The REST field names are camelCase, as the SDK sends them and the API documents them; the
nested values (contents, parts, tools) are the API's to judge, so they are typed loosely
here. Google's proto3-JSON parser takes each field's snake_case name too
(`system_instruction`, `generation_config`, `max_output_tokens`): `camel_body` writes those
of the body's top level and of its `generationConfig` in camelCase, once, where a body
enters lowtide (docs/gemini.md "Field names"); what lies deeper (a schema's property
names, a function's arguments) is the user's own and is never renamed. `model` rides in the body as everywhere in lowtide (DESIGN "request"): it is the
request's own `model` field of Gemini's GenerateContentRequest.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any, NotRequired, Required, TypedDict

# The endpoint's name in lowtide (a request's `endpoint`): the REST method it is for.
GENERATE_CONTENT = "/v1beta/models:generateContent"
# Keys the SDK's converter writes outside the config (the body's own request fields).
BODY_KEYS = ("model", "contents", "generationConfig")
_SETV = re.compile(r"setv\(\s*(parent_object|to_object),\s*\[\s*'(\w+)'")


@cache
def rest_keys() -> tuple[frozenset[str], frozenset[str]]:
    """(top-level keys, `generationConfig` keys) of a generateContent body, as the SDK
    writes them."""
    from google.genai import models

    top, generation = set(BODY_KEYS), set()
    for where, key in _SETV.findall(inspect.getsource(models._GenerateContentConfig_to_mldev)):
        (top if where == "parent_object" else generation).add(key)
    if not generation or "systemInstruction" not in top:  # the SDK changed how it is written
        raise RuntimeError("google-genai: could not read generateContent's REST keys from the SDK; update lowtide")
    return frozenset(top), frozenset(generation)


@cache
def body_type() -> Any:
    """A TypedDict of the body: `contents` is required, every other key optional."""
    top, _ = rest_keys()
    fields: dict[str, Any] = {key: NotRequired[Any] for key in sorted(top)}
    fields["model"] = NotRequired[str]
    fields["contents"] = Required[list[dict[str, Any]]]
    fields["generationConfig"] = NotRequired[dict[str, Any]]
    return TypedDict("GenerateContentBody", fields, total=False)  # type: ignore[operator]


def generation_keys() -> frozenset[str]:
    return rest_keys()[1]


def output_limit(body: dict[str, Any]) -> int | None:
    config = body.get("generationConfig")
    value = config.get("maxOutputTokens") if isinstance(config, dict) else None
    return value if type(value) is int else None


def camel(name: str) -> str:
    """`max_output_tokens` -> `maxOutputTokens` (proto3 JSON's own rule); a camelCase name stays."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_body(body: dict[str, Any]) -> dict[str, Any] | tuple[str, str]:
    """`body` with the snake_case names of its top-level and `generationConfig` fields in
    camelCase (the body itself where it has none), or (field, why) where a field is given
    under both names."""
    top, generation = rest_keys()
    out = _renamed(body, top, "")
    if isinstance(out, tuple):
        return out
    config = out.get("generationConfig")
    if isinstance(config, dict):
        renamed = _renamed(config, generation, "generationConfig.")
        if isinstance(renamed, tuple):
            return renamed
        if renamed is not config:
            out = out if out is not body else dict(body)
            out["generationConfig"] = renamed
    return out


def _renamed(fields: dict[str, Any], known: frozenset[str], where: str) -> dict[str, Any] | tuple[str, str]:
    if not any("_" in key and camel(key) in known for key in fields):
        return fields  # the usual case: nothing to copy
    out: dict[str, Any] = {}
    for key, value in fields.items():
        name = camel(key) if "_" in key and camel(key) in known else key
        if name in out:
            return f"{where}{key}", f"gives {where}{name} a second time (as {key}); keep one of the two names"
        out[name] = value
    return out
