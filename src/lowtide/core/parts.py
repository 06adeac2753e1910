"""Content parts a template adds to the user message: images and files from a row's columns.

A cell holds one of: an http(s) URL (passed on as a URL; the provider fetches it, so its
size is not known here), a path (relative to the spec's folder: read, its MIME type sniffed
from the bytes, inlined as base64), a `data:` URL, base64 text, or bytes (a Parquet binary
column). Inlined media is checked before anything is stored: a type the providers take,
and a size within the provider's limit (`LIMITS`). The part is written in the endpoint's
own shape (`PARTS`), so the body stays native (DESIGN "request").

A file a path names can change under the same name: what a row renders from is its bytes, so
each file read is hashed (`Media.digest`, `PartMaker.digest`) for the row's fingerprint.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import puremagic

from lowtide.core.endpoints import CHAT, MESSAGES, RESPONSES

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # what every provider takes
FILE_TYPES = ("application/pdf",)
MB = 1024 * 1024
# The most one inlined item may be, per provider and kind (bytes). One place, from:
# - OpenAI images: 20 MB per image (platform.openai.com/docs/guides/images-vision, "Image input requirements").
# - OpenAI files (PDF): 32 MB per request (platform.openai.com/docs/guides/pdf-files, "Usage considerations").
# - Anthropic images: 5 MB per image, measured on the base64 text the API receives
#   (docs.anthropic.com/en/docs/build-with-claude/vision, "Image size"; the API counts the encoded string).
# - Anthropic PDFs: 32 MB per request (docs.anthropic.com/en/docs/build-with-claude/pdf-support, "Requirements").
LIMITS = {
    ("openai", "image"): 20 * MB,
    ("openai", "file"): 32 * MB,
    ("anthropic", "image"): 5 * MB,
    ("anthropic", "file"): 32 * MB,
}
ENCODED_LIMIT = {("anthropic", "image")}  # limits on the base64 text, not the bytes
# The content part that holds each kind, per endpoint.
PARTS = {
    CHAT: {"text": "text", "image": "image_url", "file": "file"},
    RESPONSES: {"text": "input_text", "image": "input_image", "file": "input_file"},
    MESSAGES: {"text": "text", "image": "image", "file": "document"},
}
_URL = re.compile(r"^https?://", re.IGNORECASE)
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[^,]*)?;base64,", re.IGNORECASE)


class PartError(ValueError):
    """Why a cell cannot be made a part: said with the row and the column by the caller."""


@dataclass(frozen=True, slots=True)
class Media:
    """A cell read: a URL to pass on, or inlined bytes as base64 with their MIME type."""

    url: str | None = None
    mime: str | None = None
    data: str | None = None  # base64
    filename: str | None = None
    digest: str | None = None  # of the bytes, where they were read from a file (as `PartMaker.digest` gives it)


@dataclass(frozen=True, slots=True)
class PartMaker:
    """Makes one kind of part ("image" or "file") from one column, for one endpoint."""

    kind: str
    column: str
    endpoint: str
    base_dir: Path
    detail: str | None = None

    @property
    def where(self) -> str:
        return f"template.{self.kind}s (column \"{self.column}\")"

    def __call__(self, value: Any) -> dict[str, Any]:
        return self.part(self.read(value))

    def read(self, value: Any) -> Media:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._inline(bytes(value), None)
        if not isinstance(value, str):
            raise PartError(f"holds {type(value).__name__}; give a URL, a path, base64 text or bytes")
        text = value.strip()
        if _URL.match(text):
            return Media(url=text)
        if (m := _DATA_URL.match(text)) is not None:
            return self._inline(_b64(text[m.end() :], "the data: URL's base64"), None)
        path = self._path(text)
        if path is not None:
            try:
                if path.is_file():
                    data = path.read_bytes()
                    return self._inline(data, path.name, _digest(data))
            except OSError as err:
                raise PartError(f"cannot read {path} ({err.strerror or err})") from None
        if path is not None and not _looks_b64(text):
            raise PartError(f"no such file: {path} (paths are relative to the spec's folder), and not a URL or base64; fix the path or the cell")
        return self._inline(_b64(text, "the cell"), None)

    def digest(self, value: Any) -> str | None:
        """What `read` would give as the digest of the file a cell names, from the file alone
        (streamed, not inlined); None for a cell that names no file."""
        if not isinstance(value, str):
            return None
        text = value.strip()
        if _URL.match(text) or _DATA_URL.match(text) or (path := self._path(text)) is None:
            return None
        try:
            if not path.is_file():  # no such file: `read` refuses the row, or takes the cell for base64
                return None
            with path.open("rb") as f:
                return hashlib.file_digest(f, _hash).hexdigest()
        except OSError:  # `read` refuses the row
            return None

    def _path(self, text: str) -> Path | None:
        """The file a cell's text would name, relative to the spec's folder; None for text that
        cannot be a path."""
        if not _may_be_path(text):
            return None
        path = Path(text).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def _inline(self, data: bytes, filename: str | None, digest: str | None = None) -> Media:
        allowed = IMAGE_TYPES if self.kind == "image" else FILE_TYPES
        mime = sniff(data)
        noun = "an image" if self.kind == "image" else "a PDF"
        if mime not in allowed:
            found = f"its bytes look like {mime}" if mime else "its bytes are no known type"
            raise PartError(f"is not {noun} ({found}); {self.kind}s must be {', '.join(allowed)}")
        encoded = base64.b64encode(data).decode("ascii")
        provider = "anthropic" if self.endpoint == MESSAGES else "openai"
        limit = LIMITS[(provider, self.kind)]
        size = len(encoded) if (provider, self.kind) in ENCODED_LIMIT else len(data)
        if size > limit:
            measured = "base64 " if (provider, self.kind) in ENCODED_LIMIT else ""
            raise PartError(
                f"is {size / MB:.1f} MB ({measured}size), over {provider}'s limit of {limit // MB} MB per {self.kind}; "
                "make it smaller, or pass a URL"
            )
        return Media(mime=mime, data=encoded, filename=filename, digest=digest)

    def part(self, media: Media) -> dict[str, Any]:
        """`media` as a content part of the endpoint (`PARTS`)."""
        kind = PARTS[self.endpoint][self.kind]
        url = media.url or f"data:{media.mime};base64,{media.data}"
        name = media.filename or f"{self.column}.pdf"
        if self.endpoint == MESSAGES:
            source = {"type": "url", "url": media.url} if media.url else {"type": "base64", "media_type": media.mime, "data": media.data}
            return {"type": kind, "source": source}
        if self.endpoint == RESPONSES:
            if self.kind == "image":
                return {"type": kind, "image_url": url, "detail": self.detail or "auto"}
            return {"type": kind, "file_url": media.url} if media.url else {"type": kind, "filename": name, "file_data": url}
        if self.kind == "image":
            return {"type": kind, "image_url": {"url": url} | ({"detail": self.detail} if self.detail else {})}
        if media.url:  # chat's `file` part holds data or an uploaded file's id, never a URL
            raise PartError(f"is a URL; {CHAT} file parts take the file itself: give a path, base64 text or bytes")
        return {"type": kind, "file": {"filename": name, "file_data": url}}


def _hash():  # a file's digest: `PartMaker.digest` and `_digest` must agree
    return hashlib.blake2b(digest_size=16)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def sniff(data: bytes) -> str | None:
    """The MIME type of `data` from its leading bytes (puremagic's signatures), or None."""
    try:
        return puremagic.from_string(data[:4096], mime=True) or None
    except puremagic.PureError:
        return None


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise PartError(f"is not a URL, a file or base64 ({what} does not decode); fix the cell") from None


def _looks_b64(text: str) -> bool:
    return len(text) >= 16 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", text) is not None


def _may_be_path(text: str) -> bool:
    return len(text) < 4096 and "\n" not in text
