"""A job's JSON Schema in the form Anthropic's structured outputs (`output_config.format`)
take, and why a schema cannot go at all.

`sent_schema` is the schema as the anthropic SDK sends it (its `transform_schema`: every
object closed, the keywords Anthropic does not take moved into `description`: the relaxed
form Anthropic's docs name), after two steps the SDK's helper lacks: a `type` list
(`["string", "null"]`, the usual nullable field) becomes `anyOf` of one type each, and
draft-07 `definitions` become `$defs`. lowtide still checks every answer against the schema
as the user wrote it.

What no relaxing can carry is refused before anything is sent (`schema_problem`, run by the
Anthropic routes' and echo's refusal, so a job is refused at load naming the keyword and
the route): a recursive `$ref`, a `$ref` outside the schema, a schema with no `type`,
`anyOf`, `enum` or `const`, and more than Anthropic's limits of optional properties (24)
or of properties that are unions (16), counted over the whole schema.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

OPTIONAL_LIMIT = 24  # "at most 24 optional parameters" across a request's strict schemas
UNION_LIMIT = 16  # "at most 16 parameters using anyOf or type arrays"
DEFS = "#/$defs/"
# The keywords that belong to one JSON type, so a `type` list's branches each keep theirs.
_BY_TYPE = {
    "object": ("properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
    "string": ("format", "pattern", "minLength", "maxLength"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
_BY_TYPE["integer"] = _BY_TYPE["number"]
_TYPED = frozenset(k for keys in _BY_TYPE.values() for k in keys)


def sent_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as `output_config.format.schema` (the module doc). A schema the SDK's helper
    cannot read goes as written; `schema_problem` then says why it cannot go."""
    return orjson.loads(_sent_cached(orjson.dumps(schema)))


@lru_cache(maxsize=64)
def _sent_cached(text: bytes) -> bytes:
    """Once per distinct schema: a job of whole bodies asks it for every row."""
    try:
        from anthropic import transform_schema
    except ImportError:  # pragma: no cover - SDKs before structured outputs
        return text
    schema = orjson.loads(text)
    try:
        return orjson.dumps(transform_schema(_normalised(schema)))
    except (AssertionError, ValueError, TypeError, AttributeError, KeyError):
        return text


def _normalised(schema: Any) -> Any:
    """`type` lists as `anyOf`, `definitions` as `$defs` (refs rewritten), all the way down."""
    if isinstance(schema, list):
        return [_normalised(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "definitions" and isinstance(value, dict):
            out["$defs"] = {**_normalised(value), **out.get("$defs", {})}
        elif key == "$ref" and isinstance(value, str) and value.startswith("#/definitions/"):
            out["$ref"] = DEFS + value.removeprefix("#/definitions/")
        elif key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _normalised(sub) for name, sub in value.items()} | out.get(key, {})
        else:
            out[key] = _normalised(value)
    kinds = out.get("type")
    if isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds):
        shared = {k: v for k, v in out.items() if k != "type" and k not in _TYPED}
        branches = [{"type": k, **{t: out[t] for t in _BY_TYPE.get(k, ()) if t in out}} for k in kinds]
        return shared | {"anyOf": branches} if len(branches) > 1 else shared | branches[0]
    return out


def schema_problem(schema: Any) -> str | None:
    """Why Anthropic's structured outputs refuse `schema` as sent (after `sent_schema`),
    naming the keyword by its path; None when they take it."""
    if not isinstance(schema, dict):
        return "(root): not a schema"
    defs = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else {}
    tally = {"optional": 0, "unions": 0}
    found = _walk(schema, "(root)", defs, (), tally)
    if found:
        return found
    if tally["optional"] > OPTIONAL_LIMIT:
        return (f"(root): {tally['optional']} optional properties; Anthropic takes at most {OPTIONAL_LIMIT} "
                "(list more of them in `required`, allowing null where a value may be missing)")  # fmt: skip
    if tally["unions"] > UNION_LIMIT:
        return f"(root): {tally['unions']} properties are unions (anyOf or a type list); Anthropic takes at most {UNION_LIMIT}"
    return None


def schema_problem_cached(schema: Any) -> str | None:
    """`schema_problem`, once per distinct schema (a route's refusal asks it of every row)."""
    try:
        return _problem_cached(orjson.dumps(schema))
    except TypeError:
        return schema_problem(schema)


@lru_cache(maxsize=64)
def _problem_cached(text: bytes) -> str | None:
    return schema_problem(orjson.loads(text))


def _walk(node: Any, path: str, defs: dict, through: tuple[str, ...], tally: dict[str, int]) -> str | None:
    if isinstance(node, bool):
        return None
    if not isinstance(node, dict):
        return f"{path}: not a schema"
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not ref.startswith(DEFS) or ref.removeprefix(DEFS) not in defs:
            return f"{path}.$ref: {ref!r} is not one of this schema's own $defs (Anthropic takes no other reference)"
        name = ref.removeprefix(DEFS)
        if name in through:
            return f"{path}.$ref: {ref!r} refers back to itself; Anthropic takes no recursive schema (flatten it to a fixed depth)"
        return _walk(defs[name], f"$defs.{name}", defs, (*through, name), tally)
    if not any(k in node for k in ("type", "anyOf", "allOf", "enum", "const")):
        return f"{path}: has no type, anyOf, enum or const; Anthropic needs one on every schema"
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = set(node.get("required") or []) if isinstance(node.get("required"), list) else set()
    for name, sub in props.items():
        if name not in required:
            tally["optional"] += 1
        if isinstance(sub, dict) and ("anyOf" in sub or isinstance(sub.get("type"), list)):
            tally["unions"] += 1
        found = _walk(sub, f"{path}.properties.{name}", defs, through, tally)
        if found:
            return found
    if "items" in node:
        found = _walk(node["items"], f"{path}.items", defs, through, tally)
        if found:
            return found
    for group in ("anyOf", "allOf"):
        for i, sub in enumerate(node.get(group) or []):
            found = _walk(sub, f"{path}.{group}.{i}", defs, through, tally)
            if found:
                return found
    return None
