"""Request paths, made canonical before anything is matched or forwarded.

A path reaches the upstream with the gateway's own key attached, so a path that reads as
one thing here and another there (`/v1/../metrics`, `/v1/..%2F..%2Fdashboard`, a doubly
encoded `%252e%252e`) is a way out of `/v1` with that key. The path is percent-decoded,
and refused when it

- would change if decoded again (`%25…`: percent signs have no place in an API path),
- has a `.` or `..` segment, an empty segment (`//`), a backslash or a control character,
- is not valid UTF-8.

What is accepted is its own canonical form, so matching (`upstream_api.py`) and forwarding
see the same path, and it can only name what it spells out.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._:/")


class PathRefused(ValueError):
    """The path is not canonical; the message says why (for a 400)."""


def canonical_path(raw: bytes) -> str:
    """The decoded path if it is canonical (see the module doc); PathRefused otherwise."""
    if all(b in _PLAIN for b in raw):  # the common case: nothing to decode
        path = raw.decode("ascii")
    else:
        decoded = unquote_to_bytes(raw)
        if b"%" in decoded:  # a second round would decode again (or a bare % is left)
            raise PathRefused("the path still holds a % once decoded (encoded twice, or a bare %)")
        try:
            path = decoded.decode("utf-8")
        except UnicodeDecodeError:
            raise PathRefused("the path is not valid UTF-8") from None
    if not path.startswith("/"):
        raise PathRefused("the path does not start with /")
    if "\\" in path or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise PathRefused("the path holds a backslash or a control character")
    segments = path[1:].split("/")
    if any(s in (".", "..") for s in segments):
        raise PathRefused("the path has a '.' or '..' segment")
    if any(s == "" for s in segments[:-1]):
        raise PathRefused("the path has an empty segment (//)")
    return path
