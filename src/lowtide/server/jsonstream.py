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

Nothing but JSON is held while waiting for the next token: a byte that JSON cannot have
there (a NUL, a letter outside true/false/null/numbers, a control character inside a
string) is refused in the chunk that brings it, and so is a run of whitespace longer than
MAX_SPACE. Before, 400 MB of NULs were held up to the body limit, and a batch behind
100 MB of spaces was taken.
"""

from __future__ import annotations

import json
import re

MAX_SPACE = 64 * 1024  # whitespace in a row: pretty-printed JSON has tens of bytes, not 100 MB

# Strings whole (brackets inside are text), and the structural bytes. A string cut by the
# end of the data so far has no closing quote (group 1 empty): it is finished on the next
# feed, unless a control character (never raw in JSON text) stopped it before the end.
_STRING = rb'"(?:[^"\\\x00-\x1f]++|\\[^\x00-\x1f])*+(")?'
_TOKEN = re.compile(_STRING + rb'|[\[\]{},:]', re.S)
# Inside an item: also a byte that cannot stand outside a string there, and the start of a
# whitespace run past MAX_SPACE (the look-behind tries each run once, from its first byte).
_IN_ITEM = re.compile(_STRING + rb'|[\[\]{}]|[^ \t\r\n,:\[\]{}"0-9+\-.aeflnrstuE]'
                      rb'|(?<![ \t\r\n])[ \t\r\n]{%d}' % (MAX_SPACE + 1), re.S)  # fmt: skip
_STRING_REST = re.compile(_STRING[1:], re.S)
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
                    self._cut_string(self._string_start, m.end())
                    self._pos = m.end()
                    break
                start, end, tok = self._string_start, m.end(), b'"'
                self._string_start = -1
            elif self._state == "item":  # inside an item only strings and brackets matter
                m = _IN_ITEM.search(buf, self._pos)
                if m is None:
                    self._pos = len(buf) - self._trailing_space()  # a run the next chunk may go on with
                    break
                start, end = m.span()
                if buf[start] == 0x22:
                    if m.group(1) is None:  # a string that the data so far cuts short
                        self._cut_string(start, end)
                        self._string_start, self._pos = start, end
                        break
                    self._pos = end
                    continue
                if buf[start] not in b"[]{}":
                    raise self._not_json(start, f"{self.key}.{self._index}")
                tok = buf[start:end]
            else:
                m = _TOKEN.search(buf, self._pos)
                if m is None:
                    self._check_gap(len(buf))  # at once: what waits for a token is whitespace only
                    self._pos = len(buf)
                    break
                start, end = m.span()
                tok = buf[start : start + 1]
                if tok == b'"' and m.group(1) is None:
                    self._cut_string(start, end)
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
        """The bytes since the last token, up to `upto`: whitespace, at most MAX_SPACE of it.
        Checked as each chunk comes, so a body of NULs or spaces is refused at its start."""
        if not self._gap_text(upto):
            if upto - self._gap > MAX_SPACE:
                raise self._too_much_space(self._gap)
            return
        state = self._state
        if state == "value" and self._key != self.key:
            raise StreamError(f"{self._key}: Extra inputs are not permitted", self._key)
        if state in ("first_item", "item_start"):
            raise StreamError(f"{self.key}.{self._index}: Input should be an object", f"{self.key}.{self._index}")
        if state == "value":
            raise StreamError(f"{self.key}: Input should be a valid list", self.key)
        first = self._gap + len(self._buf[self._gap : upto]) - len(self._buf[self._gap : upto].lstrip(_SPACE))
        raise self._not_json(first)

    def _not_json(self, at: int, param: str | None = None) -> StreamError:
        byte = self._buf[at]
        if byte in _SPACE:
            return self._too_much_space(at, param)
        shown = repr(chr(byte)) if 0x20 < byte < 0x7F else f"byte 0x{byte:02x}"
        where = f"{param}: " if param else ""  # inside an item: name it, as the item's parser would
        return StreamError(f"{where}the request body is not valid JSON: unexpected {shown} at byte {self._base + at:,}", param)

    def _too_much_space(self, at: int, param: str | None = None) -> StreamError:
        return StreamError(f"{param + ': ' if param else ''}the request body has more than {MAX_SPACE:,} bytes of whitespace in a row at byte "
                           f"{self._base + at:,}; serve takes at most {MAX_SPACE:,} between JSON tokens: send the JSON "
                           "without the padding", param)  # fmt: skip

    def _cut_string(self, start: int, end: int) -> None:
        """A string the scan stopped in before the data's end: stopped by a control character."""
        buf = self._buf
        if end < len(buf):
            byte = buf[end]
            if byte == 0x5C:  # a backslash, stopped by what it escapes, or by the data's end
                if end + 1 == len(buf):
                    return
                byte = buf[end + 1]
            raise StreamError(f"the request body is not valid JSON: a raw control character (byte 0x{byte:02x}) in the string "
                              f"at byte {self._base + start:,}; JSON strings escape it (\\u{byte:04x})")  # fmt: skip

    def _trailing_space(self) -> int:
        """How long the whitespace run at the end of the data is (refused past MAX_SPACE)."""
        tail = self._buf[-(MAX_SPACE + 1) :]
        run = len(tail) - len(tail.rstrip(_SPACE))
        if run > MAX_SPACE:
            raise self._too_much_space(len(self._buf) - run, f"{self.key}.{self._index}")
        return run

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
