"""Check a JSON value against an official SDK's request type (its TypedDicts).

The SDKs declare every message, content part, tool and parameter a request may hold; this
module reads those declarations (`typing.get_type_hints`, `typing.get_args`) instead of a
list kept here, so a part type or field the SDKs add is known the day they ship it.

`problem(value, kind, path)` is None when `value` fits `kind`, else one line naming the
first place that does not ("messages[2].content[0].type: 'video' is not one of text,
image_url, ..."). It is strict where the SDK is exact (TypedDict keys, `Literal`s, JSON
scalars, lists) and lets through what it cannot read (a Protocol, a class it does not know),
so it never refuses what the SDK would take.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from functools import cache
from typing import Any

import typing_extensions

# typing_extensions' own TypedDict (which the SDKs use) and wrappers, beside typing's.
_REQUIRED = {typing.Required, typing_extensions.Required}
_NOT_REQUIRED = {typing.NotRequired, typing_extensions.NotRequired}
_WRAPPERS = (*_REQUIRED, *_NOT_REQUIRED, typing_extensions.ReadOnly)
is_typeddict = typing_extensions.is_typeddict
_LISTS = (list, tuple, set, frozenset, collections.abc.Iterable, collections.abc.Sequence, collections.abc.Collection)
_MAPS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def unwrap(kind: Any) -> Any:
    """`kind` without Annotated / Required / NotRequired around it."""
    while True:
        origin = typing.get_origin(kind)
        if origin is typing.Annotated or origin in _WRAPPERS:
            kind = typing.get_args(kind)[0]
        else:
            return kind


@cache
def arms(kind: Any) -> tuple[Any, ...]:
    """The members of a union (nested unions flattened), or [kind]. Response models (pydantic
    classes the SDK also accepts back) are left out: a JSON cell is never one."""
    kind = unwrap(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(kind):
            out.extend(arms(arg))
        return tuple(out)
    if isinstance(kind, type) and hasattr(kind, "model_fields"):
        return ()
    return (kind,)


@cache
def fields(td: type) -> dict[str, tuple[Any, bool]]:
    """A TypedDict's wire keys -> (type, required). Computed from the annotations, since
    `__required_keys__` is wrong for SDK modules that use `from __future__ import annotations`."""
    out = {}
    for name, kind in typing_extensions.get_type_hints(td, include_extras=True).items():
        required = td.__total__
        key = name
        while True:
            origin = typing.get_origin(kind)
            if origin in _REQUIRED:
                required = True
            elif origin in _NOT_REQUIRED:
                required = False
            elif origin is typing.Annotated:
                alias = next((getattr(m, "alias", None) for m in kind.__metadata__ if getattr(m, "alias", None)), None)
                key = alias or key
            elif origin is not typing_extensions.ReadOnly:
                break
            kind = typing.get_args(kind)[0]
        out[key] = (kind, required)
    return out


@cache
def literals(kind: Any) -> tuple[Any, ...] | None:
    """The values a Literal (or a union of Literals) allows; None for anything else."""
    values: list[Any] = []
    for arm in arms(kind):
        if typing.get_origin(arm) is not typing.Literal:
            return None
        values.extend(typing.get_args(arm))
    return tuple(values)


def tag(td: type, key: str) -> tuple[Any, ...] | None:
    """The values a TypedDict allows for `key` when that key is a Literal (its `type`, `role`)."""
    entry = fields(td).get(key)
    return None if entry is None else literals(entry[0])


def scalar(kind: Any) -> type | None:
    """The JSON scalar a parameter holds (bool, int, float or str), when the SDK says one
    plainly (Optional[int], float, ...); None for anything richer."""
    found = {a for a in arms(kind) if a is not type(None)}
    if len(found) == 1:
        only = found.pop()
        if only in (bool, int, float, str):
            return only
    return None


def problem(value: Any, kind: Any, path: str) -> str | None:
    """None if `value` fits `kind`, else "path: what is wrong" (see the module doc)."""
    kind = unwrap(kind)
    origin = typing.get_origin(kind)
    if kind is Any or kind is object:
        return None
    if origin in (typing.Union, types.UnionType):
        return _union(value, arms(kind), path)
    if origin is typing.Literal:
        options = typing.get_args(kind)
        return None if value in options else f"{path}: {value!r} is not one of {', '.join(map(str, options))}"
    if kind is type(None):
        return None if value is None else f"{path}: must be null"
    if kind in (str, int, float, bool):
        return None if _is(value, kind) else f"{path}: must be {said(kind)}, not {_json_name(value)}"
    if is_typeddict(kind):
        return _typed_dict(value, kind, path)
    if origin in _LISTS or (isinstance(origin, type) and "Sequence" in origin.__name__):
        if not isinstance(value, list):
            return f"{path}: must be a list, not {_json_name(value)}"
        (item,) = typing.get_args(kind)[:1] or (Any,)
        for i, v in enumerate(value):
            found = problem(v, item, f"{path}[{i}]")
            if found:
                return found
        return None
    if origin in _MAPS or kind in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return f"{path}: must be an object, not {_json_name(value)}"
        args = typing.get_args(kind)
        if len(args) == 2:
            for k, v in value.items():
                found = problem(v, args[1], f"{path}.{k}")
                if found:
                    return found
        return None
    return None  # a type this module does not read: the SDK's business, not ours


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return type(value) in (int, float)
    if kind is int:
        return type(value) is int
    return type(value) is kind


def _typed_dict(value: Any, td: type, path: str) -> str | None:
    if not isinstance(value, dict):
        return f"{path}: must be an object, not {_json_name(value)}"
    spec = fields(td)
    for key, (kind, _) in spec.items():  # tags first: a wrong `type` is the thing to say
        options = literals(kind)
        if options is not None and key in value and value[key] not in options:
            return f"{path}.{key}: {value[key]!r} is not one of {', '.join(map(str, options))}"
    for key in value:
        if key not in spec:
            return f"{path}.{key}: not a field here; the fields are: {', '.join(spec)}"
    for key, (kind, required) in spec.items():
        if key not in value:
            if required:
                return f"{path}: `{key}` is required"
            continue
        found = problem(value[key], kind, f"{path}.{key}")
        if found:
            return found
    return None


def _union(value: Any, members: tuple[Any, ...], path: str) -> str | None:
    if value is None:
        return None if type(None) in members else f"{path}: must not be null"
    fitting = [a for a in members if _json_kind(a) in (None, _json_name(value))]
    if not fitting:
        shapes = sorted({said(unwrap(a)) for a in members})
        return f"{path}: must be {' or '.join(shapes)}, not {_json_name(value)}"
    if isinstance(value, dict):  # the tag (`type`, `role`) picks the member to check it against
        for key in ("type", "role"):
            tagged = [a for a in fitting if is_typeddict(a) and tag(a, key) is not None]
            if tagged and key in value:
                picked = [a for a in tagged if value[key] in (tag(a, key) or ())]
                if not picked:
                    options = sorted({str(o) for a in tagged for o in tag(a, key) or ()})
                    return f"{path}.{key}: {value[key]!r} is not one of {', '.join(options)}"
                fitting = picked + [a for a in fitting if a not in tagged]
                break
    first = None
    for arm in fitting:
        found = problem(value, arm, path)
        if found is None:
            return None
        first = first or found
    return first


@cache
def _json_kind(kind: Any) -> str | None:
    """The JSON kind (as `_json_name` says it) a type takes, or None where it may be any."""
    kind = unwrap(kind)
    origin = typing.get_origin(kind)
    if kind in (str, bool, int):
        return _json_name(kind())
    if kind is type(None):
        return "null"
    if origin is typing.Literal:
        values = {_json_name(v) for v in typing.get_args(kind)}
        return values.pop() if len(values) == 1 else None
    if is_typeddict(kind) or origin in _MAPS or kind is dict:
        return "an object"
    if origin in _LISTS or (isinstance(origin, type) and "Sequence" in origin.__name__):
        return "a list"
    return None


def said(kind: Any) -> str:
    """How an error names what a type holds ("an integer", "a list")."""
    origin = typing.get_origin(kind)
    if kind is str:
        return "text"
    if kind is bool:
        return "true or false"
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    if kind is type(None):
        return "null"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(kind)))
    if is_typeddict(kind) or origin in _MAPS:
        return "an object"
    if origin in _LISTS or (isinstance(origin, type) and "Sequence" in origin.__name__):
        return "a list"
    return getattr(kind, "__name__", str(kind))


def _json_name(value: Any) -> str:
    return {str: "text", bool: "true/false", int: "an integer", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
