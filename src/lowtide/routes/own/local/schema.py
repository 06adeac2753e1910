"""JSON Schemas as llama.cpp grammars, for the local route's constrained decoding.

The grammar comes from llama.cpp's own JSON-schema-to-GBNF converter as llama-cpp-python
ships it (`llama_cpp.llama_grammar.json_schema_to_gbnf`); the sampler that applies it is
llama.cpp's (`llama_sampler_init_grammar`), so every token the model picks keeps the text a
prefix of an answer the grammar accepts, and the answer ends only where one is complete.

The converter silently ignores keywords it does not enforce (numeric bounds, `uniqueItems`,
`not`, ...). An ignored keyword would be a constraint dropped without a word (DESIGN
invariant 8), so `refusal` walks the schema first and refuses, by path, every keyword outside
`ENFORCED` (annotations such as `title` change nothing and pass).

`json_object` without a schema is the grammar of `{"type": "object"}`: any JSON object.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from lowtide.core.types import Refusal
from lowtide.routes.own.instances import ANNOTATIONS

ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "pattern", "format", "minLength", "maxLength", "anyOf", "$ref",
})  # fmt: skip
FORMATS = frozenset({"date", "time", "date-time", "uuid"})  # the converter's string formats
# Where subschemas sit: keyword -> how its value holds them.
_ONE, _MANY, _NAMED = "one", "many", "named"
SUBSCHEMAS = {"items": _ONE, "additionalProperties": _ONE, "prefixItems": _MANY, "anyOf": _MANY,
              "properties": _NAMED, "$defs": _NAMED, "definitions": _NAMED}  # fmt: skip
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# The converter's string character admits raw control characters, which no JSON parser takes
# inside a string; llama.cpp's own converter has since excluded them, as this does.
_LAX_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def refusal(schema: Any, field: str) -> Refusal | None:
    """The first keyword of `schema` (at `field` in the body) the grammar would not enforce."""
    found = _walk(schema, "")
    if found is not None:
        where, reason = found
        return Refusal(f"{field}.{where}" if where else field, reason)
    try:
        gbnf(json.dumps(schema))
    except ImportError:  # no llama.cpp: the route says so when it runs (execute)
        return None
    except Exception as exc:  # the converter's own assertion or parse error
        return Refusal(field, f"llama.cpp's JSON-schema grammar cannot take it: {exc}")
    return None


def _walk(schema: Any, path: str) -> tuple[str, str] | None:
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        return path, "the local route's grammar takes object schemas (true / false are not supported here)"
    for key, value in schema.items():
        at = f"{path}.{key}" if path else key
        if key in ANNOTATIONS and key not in SUBSCHEMAS:
            continue
        if key not in ENFORCED and key not in SUBSCHEMAS:
            return at, "not enforced by the local route's grammar (llama.cpp's JSON-schema converter); remove it or use a provider route"
        if key == "format" and value not in FORMATS:
            return at, f"format {value!r} is not enforced by the local route's grammar (only {', '.join(sorted(FORMATS))})"
        if key == "additionalProperties" and isinstance(value, bool):
            continue
        kind = SUBSCHEMAS.get(key)
        subs: list[tuple[str, Any]] = []
        if kind == _ONE:
            subs = [(at, value)]
        elif kind == _MANY and isinstance(value, list):
            subs = [(f"{at}.{i}", v) for i, v in enumerate(value)]
        elif kind == _NAMED and isinstance(value, dict):
            subs = [(f"{at}.{name}", v) for name, v in value.items()]
        for where, sub in subs:
            found = _walk(sub, where)
            if found is not None:
                return found
    return None


@lru_cache(maxsize=256)
def gbnf(schema_json: str) -> str:
    """The GBNF grammar of a JSON Schema (given as JSON text, so it can be cached)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(schema_json).replace(_LAX_CHAR, _JSON_CHAR)


def grammar_for(schema: dict[str, Any] | bool | None) -> str:
    return gbnf(json.dumps(ANY_OBJECT if schema is None else schema))  # key order is the answer's order
