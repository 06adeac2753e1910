"""What OpenRouter's Batch API refuses in a request, asked before anything is stored.

- an endpoint it does not batch (the card's: chat completions, responses, messages, embeddings);
- a stream (a batch answer is never streamed);
- an image or file sent inline. OpenRouter's batch quickstart: image parts must be public
  http(s) URLs, base64 and `data:` URI images are rejected on every provider, and file parts
  are accepted only as URL references. So a `data:` URL, a base64 `source`, `file_data`, a
  `file_id` (an upload OpenRouter's batch cannot read) or inline audio is refused, naming the
  field, with the fix: give the file's public URL, or send the request on a real-time route.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.cards import Card
from lowtide.core.endpoints import MESSAGES, RESPONSES
from lowtide.core.types import Refusal, Request
from lowtide.routes.wire import stream_refusal as _stream_refusal

FIX = ("OpenRouter's Batch API takes images and files by public http(s) URL only (base64 and data: URIs are "
       "refused on every provider): host it and give its URL, or send this request on a real-time route")  # fmt: skip


def refusal(request: Request, card: Card) -> Refusal | None:
    if request.endpoint not in card.endpoints:
        return Refusal("endpoint", f"OpenRouter's Batch API takes {', '.join(card.endpoints)} ({card.name}), "
                                   f"not {request.endpoint}; use another route for this endpoint")  # fmt: skip
    return _stream_refusal(request.body) or inline_media(request.endpoint, request.body)


def inline_media(endpoint: str, body: dict[str, Any]) -> Refusal | None:
    """The first content part that carries its image, file or audio inline, as a Refusal."""
    key = "input" if endpoint == RESPONSES else "messages"
    turns = body.get(key)
    if not isinstance(turns, list):
        return None
    for i, turn in enumerate(turns):
        parts = turn.get("content") if isinstance(turn, dict) else None
        if not isinstance(parts, list):
            continue
        for j, part in enumerate(parts):
            where = _inline(part, endpoint)
            if where is not None:
                return Refusal(f"{key}[{i}].content[{j}]{where}", FIX)
    return None


def _inline(part: Any, endpoint: str) -> str | None:
    """Where in `part` its media is inline (a path suffix, "" for the part), or None."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if endpoint == MESSAGES and kind in ("image", "document"):
        source = part.get("source")
        if isinstance(source, dict) and source.get("type") != "url":
            return ".source.type"
        return None
    if kind == "image_url":  # chat: {"url"} or the URL itself
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        return None if _is_web(url) else ".image_url.url"
    if kind == "input_image":  # responses: image_url, or an uploaded file_id
        return None if _is_web(part.get("image_url")) else ".image_url"
    if kind in ("file", "input_file"):  # chat's {"file": {…}}, responses' fields in the part
        fields = part.get("file") if kind == "file" and isinstance(part.get("file"), dict) else part
        for name in ("file_data", "file_id"):
            if name in fields:
                return f".file.{name}" if kind == "file" else f".{name}"
        url = fields.get("file_url") or fields.get("url")
        return None if _is_web(url) else ""
    if kind in ("input_audio", "audio"):  # always inline data
        return ""
    return None


def _is_web(url: Any) -> bool:
    return isinstance(url, str) and url.lower().startswith(("https://", "http://"))
