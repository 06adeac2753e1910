"""Smallest valid values of an SDK request type, built from the type itself: the tests that
use them cover every role, part type and tool the SDKs declare, including the next one."""

from __future__ import annotations

import typing
from typing import Any

from lowtide.core import shapes


def minimal(kind: Any, depth: int = 0) -> Any:
    """A value that fits `kind`, with only the required keys of each TypedDict."""
    if depth > 12:
        raise ValueError("too deep")
    kind = shapes.unwrap(kind)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return typing.get_args(kind)[0]
    members = shapes.arms(kind)
    if len(members) != 1 or members[0] is not kind:  # a union: the first member that builds
        for arm in members:
            if arm is type(None):
                continue
            try:
                return minimal(arm, depth + 1)
            except ValueError:
                continue
        raise ValueError(f"no member of {kind} builds")
    if kind is str:
        return "x"
    if kind is bool:
        return True
    if kind is int:
        return 1
    if kind is float:
        return 0.5
    if shapes.is_typeddict(kind):
        return {k: minimal(t, depth + 1) for k, (t, required) in shapes.fields(kind).items() if required}
    if shapes.said(kind) == "a list":
        (item,) = typing.get_args(kind)[:1] or (str,)
        return [minimal(item, depth + 1)]
    if shapes.said(kind) == "an object" or kind in (dict, object):
        return {}
    raise ValueError(f"cannot build {kind}")


def tagged_members(union: Any, key: str) -> dict[Any, type]:
    """{tag value: TypedDict} for every member of `union` with a Literal `key`."""
    out = {}
    for arm in shapes.arms(union):
        if shapes.is_typeddict(arm):
            for value in shapes.tag(arm, key) or ():
                out.setdefault(value, arm)
    return out
