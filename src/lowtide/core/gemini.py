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
here. `model` rides in the body as everywhere in lowtide (DESIGN "request"): it is the
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
