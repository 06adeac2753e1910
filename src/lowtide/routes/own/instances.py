"""Deterministic instances of a JSON Schema: what `echo` answers when a request asks for JSON.

`Instances(schema)` checks the schema once (a valid JSON Schema, made of keywords the
generator knows) and `make(seed)` returns a value valid against it, a function of the seed
alone (echo derives the seed from `custom_id`). Every value is checked with `jsonschema`
before it is returned; one that is not valid (a seed the generator got wrong) is replaced by
the seed-0 instance, which the constructor checked. A schema the generator cannot satisfy
raises `Unsatisfiable` from the constructor, naming the keyword by its path in the schema,
so a route refuses the request before anything runs.

Keywords it satisfies: `type` (a list: its first non-null type), `enum`, `const`,
`properties` / `required` / `additionalProperties` / `minProperties` / `maxProperties`,
`items` / `prefixItems` / `minItems` / `maxItems` / `uniqueItems`, `minimum` / `maximum` /
`exclusiveMinimum` / `exclusiveMaximum` / `multipleOf`, `minLength` / `maxLength`, the
common `format`s, `anyOf` / `oneOf` (the first branch that can be made), `allOf` (merged),
`$ref` into the same document (`#`, `#/$defs/...`, `#/definitions/...`). Annotations
(`title`, `description`, `default`, ...) change nothing. Anything else (`pattern`, `not`,
`if`, `patternProperties`, `contains`, ...) is refused by name.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import orjson

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor", "deprecated",
    "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$defs", "definitions", "nullable",
    "unevaluatedProperties", "unevaluatedItems", "strict", "discriminator",
})  # fmt: skip
HANDLED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "format", "anyOf", "oneOf", "allOf", "$ref",
})  # fmt: skip
FORMATS = {
    "date": lambda n: f"2024-01-{n % 28 + 1:02d}",
    "date-time": lambda n: f"2024-01-{n % 28 + 1:02d}T12:00:00Z",
    "time": lambda n: f"12:{n % 60:02d}:00Z",
    "email": lambda n: f"user{n % 1000}@example.com",
    "hostname": lambda n: f"host{n % 1000}.example.com",
    "uri": lambda n: f"https://example.com/{n % 1000}",
    "url": lambda n: f"https://example.com/{n % 1000}",
    "ipv4": lambda n: f"192.0.2.{n % 256}",
    "ipv6": lambda n: f"2001:db8::{n % 65536:x}",
    "uuid": lambda n: str(uuid.UUID(int=n % 2**128)),
    "duration": lambda n: f"P{n % 30 + 1}D",
}
VERDICTS = 4096  # distinct made values whose validity one schema's Instances remembers
MAX_DEPTH = 24  # a $ref cycle that has to be followed this deep has no finite instance here
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class Unsatisfiable(Exception):
    """The generator cannot make a value for the schema: `path` is the keyword's place in it
    (`properties.code.pattern`), `reason` says why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class Instances:
    """The instances of one schema (checked on construction; see the module doc)."""

    def __init__(self, schema: Any):
        if not isinstance(schema, dict | bool):
            raise Unsatisfiable("(root)", f"a JSON Schema is an object; got {type(schema).__name__}")
        import jsonschema  # here: echo answering text or choices never pays its import (~50 ms)

        try:
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
        except jsonschema.SchemaError as err:
            where = ".".join(str(p) for p in err.path) or "(root)"
            raise Unsatisfiable(where, f"not a valid JSON Schema: {err.message}") from None
        self.schema = schema
        self.validator = cls(schema)
        self._verdicts: dict[str, bool] = {}  # repr of a made value -> valid (`_valid`)
        self.first = self._make(0)
        if not self.validator.is_valid(self.first):
            error = jsonschema.exceptions.best_match(self.validator.iter_errors(self.first))
            where = ".".join(str(p) for p in error.schema_path) or "(root)"
            raise Unsatisfiable(where, f"echo's instance does not satisfy it ({error.message})")

    def make(self, seed: int) -> Any:
        if seed == 0:
            return self.first
        try:
            value = self._make(seed)
        except Unsatisfiable:
            return self.first
        return value if self._valid(value) else self.first

    def _valid(self, value: Any) -> bool:
        """jsonschema's verdict on a made value, remembered per distinct value: checking costs
        more than making, and a schema of enums and flags makes few distinct values over a
        whole batch. The key is the value's repr, which tells apart what JSON equality would
        not (1, 1.0 and True; NaN)."""
        key = repr(value)
        verdict = self._verdicts.get(key)
        if verdict is None:
            if len(self._verdicts) >= VERDICTS:
                self._verdicts.clear()
            verdict = self._verdicts[key] = self.validator.is_valid(value)
        return verdict

    def _make(self, seed: int) -> Any:
        return _Maker(self.schema, seed).make(self.schema, "", 0, "value")


class _Maker:
    def __init__(self, root: Any, seed: int):
        self.root = root
        self.seed = seed

    def make(self, schema: Any, path: str, depth: int, hint: str) -> Any:
        if schema is True:
            return self._string({}, path, hint)
        if schema is False:
            raise Unsatisfiable(path or "(root)", "false admits no value")
        if not isinstance(schema, dict):
            raise Unsatisfiable(path or "(root)", "a schema must be an object or a boolean")
        if depth > MAX_DEPTH:
            cycle = path.split(".$ref")[0] + ".$ref" if ".$ref" in path else path
            raise Unsatisfiable(cycle, f"nests deeper than {MAX_DEPTH} levels (a $ref cycle with no way out)")
        for key in schema:
            if key not in HANDLED and key not in ANNOTATIONS:
                raise Unsatisfiable(_at(path, key), "echo's instance generator does not satisfy this keyword")
        if "$ref" in schema:
            target = self._resolve(schema["$ref"], _at(path, "$ref"))
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            merged = _merge([target, rest], path) if set(rest) - ANNOTATIONS else target
            return self.make(merged, _at(path, "$ref"), depth + 1, hint)
        if "allOf" in schema:
            parts = [self._deref(p, _at(path, f"allOf.{i}")) for i, p in enumerate(schema["allOf"])]
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.make(_merge([rest, *parts], path), path, depth + 1, hint)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                last: Unsatisfiable | None = None
                for i, branch in enumerate(schema[key]):
                    try:
                        merged = _merge([rest, self._deref(branch, _at(path, f"{key}.{i}"))], path)
                        return self.make(merged, _at(path, f"{key}.{i}"), depth + 1, hint)
                    except Unsatisfiable as err:
                        last = err
                raise last or Unsatisfiable(_at(path, key), "has no branch")
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = [v for v in schema["enum"] if _fits_type(v, schema.get("type"))]
            if not options:
                raise Unsatisfiable(_at(path, "enum"), "no value of it has the schema's type")
            return options[self.seed % len(options)]
        kind = _kind(schema, path)
        return getattr(self, "_" + kind)(schema, path, depth, hint) if kind in ("object", "array") else (
            getattr(self, "_" + kind)(schema, path, hint))  # fmt: skip

    # --- references ----------------------------------------------------------------------

    def _resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unsatisfiable(path, f"only references into the same schema (#/...) are followed; got {ref!r}")
        node = self.root
        for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Unsatisfiable(path, f"{ref!r} points at nothing in the schema")
        return node

    def _deref(self, schema: Any, path: str) -> Any:
        while isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
            schema = self._resolve(schema["$ref"], _at(path, "$ref"))
        return schema

    # --- one per type ----------------------------------------------------------------------

    def _object(self, schema: dict, path: str, depth: int, hint: str) -> dict:
        props = schema.get("properties") or {}
        required = list(dict.fromkeys(schema.get("required") or []))
        extra = schema.get("additionalProperties", True)
        most = schema.get("maxProperties")
        deep = depth > MAX_DEPTH // 3  # past this, optional properties are left out (recursion ends)
        names = required + [k for k in props if k not in required and not deep]
        if most is not None and len(names) > most:
            if len(required) > most:
                raise Unsatisfiable(_at(path, "maxProperties"), "is below the number of required properties")
            names = names[:most]
        out = {}
        for name in names:
            if name in props:
                out[name] = self.make(props[name], _at(path, f"properties.{name}"), depth + 1, name)
            elif extra is False:
                raise Unsatisfiable(_at(path, "required"), f"requires {name!r}, which additionalProperties: false forbids")
            else:
                out[name] = self.make(extra, _at(path, "additionalProperties"), depth + 1, name)
        least = schema.get("minProperties", 0)
        i = 0
        while len(out) < least:
            if extra is False:
                raise Unsatisfiable(_at(path, "minProperties"), "needs more properties than the schema allows")
            i += 1
            name = f"extra_{i}"
            if name not in props:
                out[name] = self.make(extra, _at(path, "additionalProperties"), depth + 1, name)
        return out

    def _array(self, schema: dict, path: str, depth: int, hint: str) -> list:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", True)
        least, most = schema.get("minItems", 0), schema.get("maxItems")
        if most is not None and least > most:
            raise Unsatisfiable(_at(path, "minItems"), "is above maxItems")
        count = max(least, len(prefix), 0 if depth > MAX_DEPTH // 3 else 1 + self.seed % 2)
        if items is False:
            if least > len(prefix):
                raise Unsatisfiable(_at(path, "minItems"), "needs more items than prefixItems allows")
            count = min(count, len(prefix))
        if most is not None:
            count = min(count, most)
        out: list = []
        unique = schema.get("uniqueItems") is True
        tries = 0
        while len(out) < count:
            i = len(out)
            sub, where = (prefix[i], f"prefixItems.{i}") if i < len(prefix) else (items, "items")
            maker = _Maker(self.root, self.seed + i + tries * 7919)
            value = maker.make(sub, _at(path, where), depth + 1, hint)
            if unique and value in out:
                tries += 1
                if tries > 64:
                    raise Unsatisfiable(_at(path, "uniqueItems"), f"echo could not make {count} distinct items")
                continue
            out.append(value)
        return out

    def _string(self, schema: dict, path: str, hint: str) -> str:
        fmt = schema.get("format")
        if fmt is not None:
            if fmt not in FORMATS:
                raise Unsatisfiable(_at(path, "format"), f"echo makes no {fmt!r} strings (known: {', '.join(FORMATS)})")
            text = FORMATS[fmt](self.seed)
        else:
            text = f"{hint}-{self.seed % 1000}"
        least, most = schema.get("minLength", 0), schema.get("maxLength")
        if most is not None and least > most:
            raise Unsatisfiable(_at(path, "minLength"), "is above maxLength")
        if len(text) < least:
            text += "x" * (least - len(text))
        if most is not None and len(text) > most:
            if fmt is not None:
                raise Unsatisfiable(_at(path, "maxLength"), f"is too short for a {fmt!r} string")
            text = text[:most]
        return text

    def _integer(self, schema: dict, path: str, hint: str) -> int:
        low, high = _bounds(schema, path, integer=True)
        step = schema.get("multipleOf")
        if step is not None and float(step).is_integer():
            step = int(step)
        elif step is not None:
            raise Unsatisfiable(_at(path, "multipleOf"), "echo makes integers for whole multipleOf values only")
        low_i = math.ceil(low) if low is not None else None
        high_i = math.floor(high) if high is not None else None
        start = low_i if low_i is not None else (high_i - 99 if high_i is not None else 0)
        span = (high_i - start + 1) if high_i is not None else 100
        if span <= 0:
            raise Unsatisfiable(_at(path, "maximum"), "no integer lies between the bounds")
        value = start + self.seed % min(span, 100)
        if step:
            value = math.ceil(value / step) * step
            if high_i is not None and value > high_i:
                value = math.ceil(start / step) * step
            if high_i is not None and value > high_i:
                raise Unsatisfiable(_at(path, "multipleOf"), "no multiple of it lies between the bounds")
        return value

    def _number(self, schema: dict, path: str, hint: str) -> float | int:
        step = schema.get("multipleOf")
        if step is not None and not float(step).is_integer():
            low, high = _bounds(schema, path, integer=False)
            first = math.ceil((low if low is not None else 0) / step)
            for k in range(first, first + 1000):
                value = round(k * step, 12)
                if high is not None and value > high:
                    break
                if (low is None or value >= low) and (value / step).is_integer():
                    return value
            raise Unsatisfiable(_at(path, "multipleOf"), "echo found no multiple of it between the bounds")
        try:
            return self._integer(schema, path, hint)
        except Unsatisfiable:
            low, high = _bounds(schema, path, integer=False)
            if low is not None and high is not None and low < high and step is None:
                return (low + high) / 2
            raise

    def _boolean(self, schema: dict, path: str, hint: str) -> bool:
        return self.seed % 2 == 1

    def _null(self, schema: dict, path: str, hint: str) -> None:
        return None


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(schema: dict, path: str) -> str:
    given = schema.get("type")
    if isinstance(given, list):
        given = next((t for t in given if t != "null"), given[0] if given else None)
    if given is not None:
        if given not in TYPES:
            raise Unsatisfiable(_at(path, "type"), f"unknown type {given!r}")
        return given
    keys = set(schema)
    if keys & {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}:
        return "object"
    if keys & {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}:
        return "array"
    if keys & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}:
        return "number"
    return "string"


def _bounds(schema: dict, path: str, integer: bool) -> tuple[float | None, float | None]:
    """The closed range a number must lie in (exclusive bounds moved inward)."""
    low, high = schema.get("minimum"), schema.get("maximum")
    xlow, xhigh = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    nudge = 1 if integer else 1e-9
    if xlow is True and low is not None:  # draft 4: a flag on minimum
        low = low + nudge
    elif isinstance(xlow, int | float) and not isinstance(xlow, bool):
        bound = math.floor(xlow) + 1 if integer else xlow + nudge
        low = bound if low is None else max(low, bound)
    if xhigh is True and high is not None:
        high = high - nudge
    elif isinstance(xhigh, int | float) and not isinstance(xhigh, bool):
        bound = math.ceil(xhigh) - 1 if integer else xhigh - nudge
        high = bound if high is None else min(high, bound)
    if low is not None and high is not None and low > high:
        raise Unsatisfiable(_at(path, "minimum"), "is above maximum")
    return low, high


def _fits_type(value: Any, given: Any) -> bool:
    if given is None:
        return True
    kinds = given if isinstance(given, list) else [given]
    checks = {
        "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None, "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    }  # fmt: skip
    return any(checks.get(k, lambda v: False)(value) for k in kinds)


def _merge(parts: list[Any], path: str) -> dict:
    """allOf (and a $ref's or a branch's siblings) as one schema: properties merged per name,
    required united, the other keywords of later parts winning. The result is validated with
    the whole schema afterwards, so a merge that loses a constraint is caught there."""
    out: dict = {}
    for part in parts:
        if part is True:
            continue
        if part is False or not isinstance(part, dict):
            raise Unsatisfiable(path or "(root)", "a part admits no value")
        for key, value in part.items():
            if key == "properties" and isinstance(out.get(key), dict):
                merged = dict(out[key])
                for name, sub in value.items():
                    merged[name] = _merge([merged[name], sub], path) if name in merged else sub
                out[key] = merged
            elif key == "required" and key in out:
                out[key] = list(dict.fromkeys([*out[key], *value]))
            else:
                out[key] = value
    return out


_CACHE: dict[bytes, Instances | Unsatisfiable] = {}
_CACHE_SIZE = 512


def instances_for(schema: Any) -> Instances:
    """`Instances(schema)`, made once per distinct schema (a job's rows share one), or the
    `Unsatisfiable` it raised, raised again."""
    try:
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits
        key = json.dumps(schema, sort_keys=True).encode()
    found = _CACHE.get(key)
    if found is None:
        try:
            found = Instances(schema)
        except Unsatisfiable as err:
            found = err
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        _CACHE[key] = found
    if isinstance(found, Unsatisfiable):
        raise found
    return found
