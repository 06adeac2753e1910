"""Receiving a multipart upload (`POST /v1/files`) as it streams: the file part goes
straight into its place in the data dir (written once, no spooled copy), refused with 413
as soon as it passes the limit; the other fields (purpose, expires_after) are kept, small.

    form = FormReceiver(content_type, target, max_file_bytes)
    form.write(chunk) …; form.finish()        # then form.fields, form.filename, form.size
    form.abort()                              # on any error: the partial file is removed

A form is taken only whole: one that ends before its closing boundary (`--BOUNDARY--`) is
refused, never stored cut short (a JSONL cut at a line end would run fewer requests). The
boundary is 1 to 70 characters, as RFC 2046 section 5.1.1 allows.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from lowtide.server.errors import ApiError

MAX_FIELD_BYTES = 64 * 1024
MAX_FIELDS = 32
FORM_OVERHEAD = 1024 * 1024  # what a form may carry beside its file: part headers, fields
MAX_BOUNDARY = 70  # RFC 2046 5.1.1: a boundary is 1 to 70 characters


class FormReceiver:
    def __init__(self, content_type: str, target: Path, max_file_bytes: int, file_field: str = "file"):
        kind, options = parse_options_header(content_type)
        if kind != b"multipart/form-data" or b"boundary" not in options:
            raise ApiError(400, "Send the file as multipart/form-data (a 'file' part and a 'purpose' field).", param=file_field)
        boundary = options[b"boundary"]
        if not 1 <= len(boundary) <= MAX_BOUNDARY:
            raise ApiError(400, f"The multipart boundary is {len(boundary):,} characters; RFC 2046 allows 1 to {MAX_BOUNDARY}. "
                           "Send the form with a shorter boundary in its Content-Type.", param=file_field)  # fmt: skip
        self.target = target
        self.max_file_bytes = max_file_bytes
        self.file_field = file_field
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.size = 0
        self._out: IO[bytes] | None = None
        self._in_file = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._name = ""
        self._data = bytearray()
        self._boundary = boundary.decode("latin-1")
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_part_data": self._part_data, "on_part_end": self._part_end,
            "on_header_field": self._header_field, "on_header_value": self._header_val,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done,
        })  # fmt: skip

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except FormParserError:
            raise ApiError(400, "The multipart body is malformed.", param=self.file_field) from None

    def finish(self) -> None:
        try:
            self._parser.finalize()
        except FormParserError:
            raise ApiError(400, "The multipart body is malformed or ended early.", param=self.file_field) from None
        self._close()
        if self._parser.state not in (MultipartState.END, MultipartState.START):  # START: no bytes at all
            raise ApiError(400, f"The multipart body ended before its closing boundary ('--{self._boundary[:80]}--'), so it may be "
                           "cut short; nothing was stored. Send the whole form.", param=self.file_field)  # fmt: skip
        if self.filename is None:
            raise ApiError(400, f"Missing required parameter: '{self.file_field}'.", param=self.file_field)

    def abort(self) -> None:
        self._close()
        self.target.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    # The parser's callbacks ----------------------------------------------------------
    def _part_begin(self) -> None:
        self._disposition, self._data = b"", bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_val(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]
        if len(self._header_value) > MAX_FIELD_BYTES:
            raise ApiError(400, "A multipart header is too long.")

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        self._in_file = b"filename" in options
        if not self._in_file:
            return
        if self._name != self.file_field or self.filename is not None:
            raise ApiError(400, f"Send exactly one file, as the '{self.file_field}' field.", param=self.file_field)
        self.filename = options[b"filename"].decode("utf-8", "replace") or "upload"
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.target.open("wb")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.size += end - start
            if self.size > self.max_file_bytes:
                raise ApiError(413, f"File is too large: the limit is {self.max_file_bytes:,} bytes.", param=self.file_field)
            assert self._out is not None
            self._out.write(data[start:end])
            return
        self._data += data[start:end]
        if len(self._data) > MAX_FIELD_BYTES:
            raise ApiError(400, f"The form field '{self._name}' is too long (the limit is {MAX_FIELD_BYTES:,} bytes).", param=self._name)

    def _part_end(self) -> None:
        if self._in_file:
            self._close()
            self._in_file = False
            return
        if len(self.fields) >= MAX_FIELDS:
            raise ApiError(400, f"The form has too many fields (at most {MAX_FIELDS}).")
        self.fields[self._name] = self._data.decode("utf-8", "replace")
