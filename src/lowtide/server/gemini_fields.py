"""Google's partial responses, as every Google API takes them (the `fields` or `$fields`
query parameter, or the `X-Goog-FieldMask` header): comma-separated field paths, `.` or `/`
into a message, `a(b,c)` for several fields under one, `*` for all of them.

    name,done,error,metadata(state,batchStats)   operations(name,metadata.displayName),nextPageToken

A mask is a dict of the fields it keeps, each to the mask of what it keeps under it; `None`
keeps everything. What a mask leaves out is not built at all where that costs: a poll that
asks for the state does not read 50,000 inline responses (gemini_api.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from lowtide.server.errors import ApiError

Mask = dict[str, "Mask | None"]


def mask_of(request: Request) -> Mask | None:
    """The request's field mask, or None for the whole response; a malformed one is a 400."""
    given = request.query_params.get("fields") or request.query_params.get("$fields") or request.headers.get("x-goog-fieldmask")
    try:
        return parse(given or "*")
    except ValueError as err:
        raise ApiError(400, f"Invalid field mask {given!r}: {err}.") from None


def parse(text: str) -> Mask | None:
    text = "".join(text.split())
    mask, end = _fields(text, 0)
    if end != len(text):
        raise ValueError(f"unexpected {text[end]!r} at character {end + 1}")
    return mask


def _fields(text: str, i: int) -> tuple[Mask | None, int]:
    """`path(,path)*` from `i`: its mask and where it stopped."""
    mask: Mask = {}
    everything = False
    while True:
        name, under, i = _path(text, i)
        if name == "*":
            everything = True
        else:
            _add(mask, name, under)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        return (None if everything else mask), i


def _path(text: str, i: int) -> tuple[str, Mask | None, int]:
    end = i
    while end < len(text) and text[end] not in ",()./":
        end += 1
    name = text[i:end]
    if not name:
        raise ValueError(f"expected a field name at character {i + 1}")
    if end < len(text) and text[end] in "./":
        inner, under, end = _path(text, end + 1)
        return name, (None if inner == "*" else {inner: under}), end
    if end < len(text) and text[end] == "(":
        under, end = _fields(text, end + 1)
        if end >= len(text) or text[end] != ")":
            raise ValueError(f"an opening parenthesis is not closed (character {end + 1})")
        return name, under, end + 1
    return name, None, end


def _add(mask: Mask, name: str, under: Mask | None) -> None:
    if name in mask and mask[name] is None:
        return  # the whole field is kept already
    if under is None:
        mask[name] = None
        return
    kept = mask.setdefault(name, {})
    for key, more in under.items():
        _add(kept, key, more)  # type: ignore[arg-type]


def selects(mask: Mask | None, *path: str) -> bool:
    """Whether the mask keeps anything at `path`."""
    for name in path:
        if mask is None:
            return True
        if name not in mask:
            return False
        mask = mask[name]
    return True


def apply(mask: Mask | None, value: Any) -> Any:
    """`value` with only what the mask keeps (a list: the mask applies to each element)."""
    if mask is None:
        return value
    if isinstance(value, list):
        return [apply(mask, v) for v in value]
    if not isinstance(value, dict):
        return value
    return {key: apply(mask[key], v) for key, v in value.items() if key in mask}
