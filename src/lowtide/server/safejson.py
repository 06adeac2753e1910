"""JSON from outside, read with a nesting limit: a body or a batch line nested 100,000 deep
is refused naming where, never a RecursionError (the standard library's parser recurses;
orjson stops at 1,024 levels, and `fastjson` then falls back to the standard library).

    value = loads(raw, max_depth=64)        # TooDeep(path) or ValueError (not JSON)

The limit is checked without walking small documents: a text with no more `[`/`{` bytes
than the limit cannot nest deeper than it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from lowtide.core import fastjson

DEFAULT_DEPTH = 64
MAX_DEPTH = 512  # the standard library's encoder recurses too: stay well under its limit
_TOO_DEEP = object()
# One token of the scan that finds where a text nests too deep: a whole string (a bracket
# inside one is text), a bracket, or a comma (to count array indexes).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # the escape of a surrogate, paired or not
# What can read as a number that is not finite: the tokens, or an exponent of 3+ digits.
_NOT_FINITE = re.compile(rb"NaN|Infinity|[eE][+-]?\d{3}")
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{},:]', re.S)


class NotText(ValueError):
    """A string holds a lone UTF-16 surrogate escape (`"\\ud800"`): no UTF-8 text can carry
    it, so the store, the files and the answers could not either. `path` names it."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"'{path or '(top)'}' holds a lone UTF-16 surrogate escape (such as \\ud800), which is not text")


class NotFinite(ValueError):
    """A number that JSON has no way to write: `NaN`, `Infinity` (tokens the standard library
    reads, not JSON) or one too large for a double (`1e400`). Read on, it would be written
    as `null` (fastjson.py), changing a body that must travel verbatim. `path` names it."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"'{path or '(top)'}' is NaN or infinite, which JSON cannot hold; send a finite number")


class TooDeep(ValueError):
    """The document nests deeper than the limit; `path` names where (`messages.0.content`)."""

    def __init__(self, max_depth: int, path: str):
        self.max_depth = max_depth
        self.path = path
        super().__init__(f"nested deeper than {max_depth} levels at '{path or '(top)'}'")


def loads(raw: bytes, max_depth: int = DEFAULT_DEPTH) -> Any:
    """The value of a JSON text; TooDeep past `max_depth` levels, NotText for a lone
    surrogate, ValueError if not JSON (json.JSONDecodeError, or UnicodeDecodeError for
    bytes that are not UTF-8)."""
    try:
        value = fastjson.loads(raw)
    except (RecursionError, fastjson.NestedTooDeep):
        value = _TOO_DEEP
    if value is _TOO_DEEP or (_brackets(raw) > max_depth and depth(value) > max_depth):
        raise TooDeep(max_depth, deep_path(raw, max_depth))
    if _SURROGATE.search(raw) and (where := surrogate_path(value)) is not None:
        raise NotText(where)
    if _NOT_FINITE.search(raw) and (where := infinite_path(value)) is not None:
        raise NotFinite(where)
    return value


def infinite_path(value: Any) -> str | None:
    """The path of the first number that is NaN or infinite, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        if isinstance(item, dict):
            stack.extend((child, f"{path}.{key}" if path else str(key)) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(item))
    return None


def surrogate_path(value: Any) -> str | None:
    """The path of the first key or string that is not valid Unicode text, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key}" if path else str(key)
                if not _is_text(key):
                    return path or "(a key)"
                stack.append((child, where))
        elif isinstance(item, list):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(item))
    return None


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _brackets(raw: bytes) -> int:
    return raw.count(b"[") + raw.count(b"{")


def depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (a scalar: 0), without recursing."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def deep_path(raw: bytes, max_depth: int) -> str:
    """The path (`requests.3.params`) of the first array or object opened past `max_depth`."""
    path: list[Any] = []  # per open container: its key or index so far (None: an object's key not read yet)
    kinds: list[bytes] = []
    last_string = b""
    for m in _TOKEN.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            if len(kinds) >= max_depth:
                break
            kinds.append(tok)
            path.append(0 if tok == b"[" else None)
        elif tok in (b"]", b"}"):
            if kinds:
                kinds.pop()
                path.pop()
        elif tok == b",":
            if kinds and kinds[-1] == b"[":
                path[-1] += 1
        elif tok == b":":
            if kinds and kinds[-1] == b"{":
                path[-1] = _key(last_string)
        else:
            last_string = tok
    text = ".".join(str(p) for p in path if p is not None)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(token: bytes) -> str:
    try:
        key = fastjson.loads(token)
    except ValueError:
        return "?"
    return key if isinstance(key, str) and len(key) <= 64 else "?"
