"""What Gemini's `responseJsonSchema` cannot take, found before anything is sent.

Gemini takes most of JSON Schema in `responseJsonSchema` (Google's "Structured output"
page); its one documented refusal is a recursive reference the answer cannot stop: recursion
works only through a property that is not required (Gemini unrolls it to a finite depth).
An array of the recursive type can always end (an empty array), so only a required property
that is itself the reference back is refused.
"""

from __future__ import annotations

from typing import Any

DEFS = ("#/$defs/", "#/definitions/")


def schema_problem(schema: Any) -> str | None:
    """Why Gemini would refuse `schema` as `responseJsonSchema`, by its path; None if not."""
    if not isinstance(schema, dict):
        return None
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
    return _walk(schema, "(root)", defs if isinstance(defs, dict) else {}, ())


def _def_name(ref: Any) -> str | None:
    if isinstance(ref, str):
        for prefix in DEFS:
            if ref.startswith(prefix):
                return ref.removeprefix(prefix)
    return None


def _walk(node: Any, path: str, defs: dict, through: tuple[str, ...]) -> str | None:
    if not isinstance(node, dict):
        return None
    name = _def_name(node.get("$ref"))
    if name is not None:
        if name in through or name not in defs:
            return None  # a way back through an optional property or an array: Gemini unrolls it
        return _walk(defs[name], f"$defs.{name}", defs, (*through, name))
    required = set(node.get("required") or []) if isinstance(node.get("required"), list) else set()
    for key, sub in (node.get("properties") or {}).items() if isinstance(node.get("properties"), dict) else ():
        back = _def_name(sub.get("$ref")) if isinstance(sub, dict) else None
        if key in required and back is not None and back in through:
            return (f"{path}.properties.{key}: a required property that refers back to {back!r}; Gemini takes a "
                    "recursive reference only through a property that is not required (drop it from `required`)")  # fmt: skip
        found = _walk(sub, f"{path}.properties.{key}", defs, through)
        if found:
            return found
    for key in ("items", "anyOf", "oneOf", "allOf"):
        subs = node.get(key)
        for i, sub in enumerate(subs if isinstance(subs, list) else [subs] if isinstance(subs, dict) else []):
            found = _walk(sub, f"{path}.{key}" + (f".{i}" if isinstance(subs, list) else ""), defs, through)
            if found:
                return found
    return None
