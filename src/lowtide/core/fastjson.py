"""JSON for the hot paths (every request is written and read as JSON several times on its
way through a batch): orjson where it can, the standard library where orjson refuses.

Reading gives the same values as `json.loads` for every input: what orjson refuses (NaN,
lone surrogates) is read by `json`, and so is any text with a run of 19 or more digits,
because orjson reads an integer beyond 64 bits as a float (a long numeric id would change).
A document nested deeper than either parser goes is a `json.JSONDecodeError`, never a
RecursionError.

Writing differs from `json.dumps(..., ensure_ascii=False)` only in spacing (no spaces after
`:` and `,`) and in NaN and ±Infinity, written as `null` instead of tokens that are not
JSON; what orjson refuses (integers beyond 64 bits, lone surrogates, non-text dict keys) is
written by `json`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_encode = json.JSONEncoder(ensure_ascii=False).encode
# Every ASCII digit becomes "1", every other byte "0": a run of 19 digits is then a plain
# substring test (a regex scan costs more than parsing the line).
_DIGITS = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG_RUN = b"1" * 19


class NestedTooDeep(json.JSONDecodeError):
    """A document nested deeper than the parsers go (a JSONDecodeError, so callers that name
    a bad line name this one too)."""


def dumps(value: Any) -> str:
    """`value` as compact JSON text, non-ASCII kept as it is."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _encode(value)


def dumpb(value: Any) -> bytes:
    """The same as UTF-8 bytes (lone surrogates passed through, as the server's files do)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _encode(value).encode("utf-8", "surrogatepass")


def loads(text: str | bytes) -> Any:
    """The value of a JSON document; `json.JSONDecodeError` (a ValueError) if it is none."""
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text)
    except RecursionError:  # the standard library recurses per level; orjson stops at 1,024
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise NestedTooDeep("nested more than 1,000 levels deep", doc, 0) from None


def is_utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8: not when it holds a lone surrogate (JSON's
    "\\ud800" reads as one), which no store or file can keep."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
