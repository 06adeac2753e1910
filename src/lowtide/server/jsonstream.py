"""Splitting one JSON object's array member into its items as the bytes arrive, so that a
message batch (`{"requests": [item, item, …]}`, up to 256 MB) is taken in item by item and
never held whole. Each item comes out as its own bytes, to be parsed on its own.

    split = ArraySplitter("requests", max_depth=64)
    for chunk in chunks:
        for index, raw in split.feed(chunk): ...
    split.close()                             # StreamError if the document is incomplete

Only the outer levels are checked here (the object, its keys, the array); each item's own
syntax is the item parser's. Nesting past `max_depth` (the object and array count) is
refused as soon as it is seen, naming the item.
"""

from __future__ import annotations

import json
import re

# Strings whole (brackets inside are text), and the structural bytes. A string cut by the
# end of the data so far has no closing quote (group 1 empty): it is finished on the next feed.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+(")?|[\[\]{},:]', re.S)
_IN_ITEM = re.compile(rb'"(?:[^"\\]++|\\.)*+(")?|[\[\]{}]', re.S)
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+(")?', re.S)
_SPACE = b" \t\r\n"


class StreamError(ValueError):
    """The document is not the expected shape; `param` names the part at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class ArraySplitter:
    """Items of the array under `key` of a top-level object with no other key."""

    def __init__(self, key: str, max_depth: int):
        self.key = key
        self.max_depth = max_depth
        self._buf = bytearray()
        self._base = 0  # offset in the document of _buf[0]
        self._pos = 0  # next byte of _buf to scan
        self._gap = 0  # where the bytes after the last token start
        self._state = "start"
        self._key: str | None = None
        self._seen_key = False
        self._index = 0  # the item being read
        self._item_start = -1  # where in _buf the item being read starts
        self._level = 0  # nesting inside the item being read
        self._string_start = -1  # a string cut by the end of the data

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """The items completed by `chunk`, as (index, raw bytes)."""
        self._buf += chunk
        items: list[tuple[int, bytes]] = []
        buf = self._buf
        while True:
            if self._string_start >= 0:
                m = _STRING_REST.match(buf, self._pos)
                if m.group(1) is None:
                    self._pos = m.end()
                    break
                start, end, tok = self._string_start, m.end(), b'"'
                self._string_start = -1
            elif self._state == "item":  # inside an item only strings and brackets matter
                m = _IN_ITEM.search(buf, self._pos)
                if m is None:
                    self._pos = len(buf)
                    break
                start, end = m.span()
                if buf[start] == 0x22:
                    if m.group(1) is None:  # a string that the data so far cuts short
                        self._string_start, self._pos = start, end
                        break
                    self._pos = end
                    continue
                tok = buf[start:end]
            else:
                m = _TOKEN.search(buf, self._pos)
                if m is None:
                    self._pos = len(buf)
                    break
                start, end = m.span()
                tok = buf[start : start + 1]
                if tok == b'"' and m.group(1) is None:
                    self._string_start, self._pos = start, end
                    break
            item = self._token(tok, start, end)
            if item is not None:
                items.append(item)
            self._pos = self._gap = end
        self._compact()
        return items

    def close(self) -> None:
        if self._string_start >= 0 or self._state != "end":
            raise StreamError(f"the JSON document ended early (after {self._base + len(self._buf):,} bytes)")
        self._check_gap(len(self._buf))
        if not self._seen_key:
            raise StreamError(f"{self.key}: Field required", self.key)

    # One token ------------------------------------------------------------------------
    def _token(self, tok: bytes, start: int, end: int) -> tuple[int, bytes] | None:
        state = self._state
        if state == "item":
            if tok in b"[{":
                self._level += 1
                if self._level + 2 > self.max_depth:
                    raise StreamError(f"{self.key}.{self._index}: nested deeper than {self.max_depth} levels; "
                                      f"a request may nest at most {self.max_depth} levels.", f"{self.key}.{self._index}")  # fmt: skip
            elif tok in b"]}":
                self._level -= 1
                if self._level == 0:
                    self._state = "after_item"
                    return self._index, bytes(self._buf[self._item_start : end])
            return None
        if state == "value" and self._key != self.key:
            raise StreamError(f"{self._key}: Extra inputs are not permitted", self._key)
        if state in ("first_item", "item_start") and self._gap_text(start):
            raise StreamError(f"{self.key}.{self._index}: Input should be an object", f"{self.key}.{self._index}")
        self._check_gap(start)
        if state == "start" and tok == b"{":
            self._state = "key"
        elif state in ("key", "first_key") and tok == b'"':
            self._key = self._decode(start, end)
            self._state = "colon"
        elif state == "first_key" and tok == b"}":
            self._state = "end"
        elif state == "colon" and tok == b":":
            self._state = "value"
        elif state == "value":
            if self._seen_key:
                raise StreamError(f"{self.key}: given twice", self.key)
            if tok != b"[":
                raise StreamError(f"{self.key}: Input should be a valid list", self.key)
            self._seen_key = True
            self._state = "first_item"
        elif state in ("first_item", "item_start") and tok in b"[{":
            if tok == b"[":
                raise StreamError(f"{self.key}.{self._index}: Input should be an object", f"{self.key}.{self._index}")
            self._state, self._item_start, self._level = "item", start, 1
        elif state == "first_item" and tok == b"]":
            raise StreamError(f"{self.key}: List should have at least 1 item after validation, not 0", self.key)
        elif state in ("first_item", "item_start") and tok == b'"':
            raise StreamError(f"{self.key}.{self._index}: Input should be an object", f"{self.key}.{self._index}")
        elif state == "after_item" and tok == b",":
            self._index += 1
            self._state = "item_start"
        elif state == "after_item" and tok == b"]":
            self._state = "after_value"
        elif state == "after_value" and tok == b",":
            self._state = "key"
        elif state == "after_value" and tok == b"}":
            self._state = "end"
        else:
            raise StreamError(f"the request body is not valid JSON: unexpected {tok.decode(errors='replace')!r} at byte {self._base + start:,}")
        if self._state == "key" and state == "start":
            self._state = "first_key"
        return None

    def _gap_text(self, upto: int) -> bytes:
        return bytes(self._buf[self._gap : upto]).strip(_SPACE)

    def _check_gap(self, upto: int) -> None:
        if self._gap_text(upto):
            if self._state == "value" and self._key == self.key:
                raise StreamError(f"{self.key}: Input should be a valid list", self.key)
            raise StreamError(f"the request body is not valid JSON: unexpected text at byte {self._base + self._gap:,}")

    def _decode(self, start: int, end: int) -> str:
        try:
            return json.loads(bytes(self._buf[start:end]))
        except ValueError:
            raise StreamError(f"the request body is not valid JSON: a bad string at byte {self._base + start:,}") from None

    def _compact(self) -> None:
        """Drop what is read; keep the item being read and any string cut short."""
        keep = min(x for x in (self._pos, self._gap, self._item_start if self._state == "item" else -1,
                               self._string_start) if x >= 0)  # fmt: skip
        if keep > 0:
            del self._buf[:keep]
            self._base += keep
            self._pos -= keep
            self._gap -= keep
            if self._item_start >= 0:
                self._item_start -= keep
            if self._string_start >= 0:
                self._string_start -= keep
