"""What a request's input may be billed beyond its text: images, the documents and audio
that have no bound, and the prompt-cache writes it asks for. Budgets (engine/budget.py) and
`lowtide estimate` (engine/counting.py) add these to the text's approximation, so that an
estimate stays an upper bound of the provider's bill.

    scan(body)               ─► Scan(images, unbounded, cache_ttl): the parts a body holds
    image_bound(model, list) ─► ImageBound(tokens, source) | None: the most one image costs

An image given by URL or file id is a few dozen characters of the stored JSON but is billed
hundreds to thousands of input tokens, by its size, which lowtide does not know before
sending; so each image counts the most any image costs on the model (`image_bound`), whatever
else its characters count (a base64 image's are counted too: an over-count, which is safe).

Measures lowtide cannot know bound nothing: a PDF is billed by its pages (each page's text
and an image of it), audio and video by their length, a file by URI by its content. A body
holding one is `Scan.unbounded` (what it holds, in words), and a budget refuses to send it.
An Anthropic `document` whose source is text or content blocks is plain text in the body:
counted as characters, as all text is. OpenAI's audio input, though inline, is billed at
audio-token prices of up to ~70 times text's, which its base64 does not bound either.

Cache writes (Anthropic's `cache_control`, on any block, tool or the body's top): the
cached prefix is billed at the write rate, 1.25x input for the 5-minute TTL and 2x for the
1-hour one (`ttl: "1h"`), instead of the input rate; `Scan.cache_ttl` is the longest TTL a
body asks for. OpenAI and Gemini bill no write per request (OpenAI's prompt caching is
automatic and free to write; Gemini's explicit caches are created by a call of their own
and billed for storage, not by the requests that read them), and their price lists carry
no write rate, so a write priced there costs what input costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})  # chat, responses, messages
FILE_PARTS = frozenset({"file", "input_file", "document"})  # chat, responses, messages (PDFs; text documents apart)
AUDIO_PARTS = frozenset({"input_audio"})
TEXT_SOURCES = frozenset({"text", "content"})  # an Anthropic document whose text is in the body
GEMINI_DATA = frozenset({"inlineData", "inline_data", "fileData", "file_data"})  # a Gemini part's media
# Keys whose values are schemas or settings, never content: a property typed "image" or a
# key named "file" there is no part (cache_control is still looked for: tools carry it).
NOT_CONTENT = frozenset({
    "tools", "tool_choice", "functions", "response_format", "text", "output_config", "generationConfig",
    "generation_config", "toolConfig", "tool_config", "safetySettings", "safety_settings", "metadata",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Scan:
    """What one request body holds beyond its text."""

    images: int = 0
    unbounded: str | None = None  # what it holds that has no bound, in words ("a PDF or other file, billed by its pages")
    cache_ttl: str | None = None  # "5m" or "1h": it asks to write a prompt cache, at this TTL at longest


class _Found:
    __slots__ = ("images", "unbounded", "ttl")

    def __init__(self) -> None:
        self.images = 0
        self.unbounded: str | None = None
        self.ttl: str | None = None


# Every key or type `scan` acts on contains one of these: a stored body's JSON text holding
# none of them holds no part and no cache write, and need not be walked.
MARKERS = ("image", "file", "document", "audio", "inline", "cache_control")  # "inline": inlineData, inline_data


def may_hold(text: str) -> bool:
    """Whether a body's JSON text may hold what `scan` finds (False: it surely holds none)."""
    return any(m in text for m in MARKERS)


def scan(body: Any) -> Scan:
    """The images, unbounded parts and cache writes of a request body (or of any part of
    one, such as a spec's `params`), in any endpoint's native shape."""
    found = _Found()
    _walk(body, True, found)
    return Scan(found.images, found.unbounded, found.ttl)


def longer_ttl(a: str | None, b: str | None) -> str | None:
    """The longer of two cache-write TTLs (the dearer write); None where neither writes."""
    return "1h" if "1h" in (a, b) else a or b


def _walk(value: Any, content: bool, found: _Found) -> None:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                _walk(item, content, found)
        return
    if not isinstance(value, dict):
        return
    cache = value.get("cache_control")
    if isinstance(cache, dict):  # no TTL is the 5-minute one; any other than "5m" is priced as the dearer
        found.ttl = longer_ttl(found.ttl, "5m" if cache.get("ttl", "5m") == "5m" else "1h")
    if content:
        _part(value, found)
    for key, item in value.items():
        if isinstance(item, (dict, list)):
            _walk(item, content and key not in NOT_CONTENT, found)


def _part(part: dict[str, Any], found: _Found) -> None:
    kind = part.get("type")
    if isinstance(kind, str):  # an OpenAI or Anthropic part (or a block that is none)
        if kind in IMAGE_PARTS:
            found.images += 1
        elif kind in FILE_PARTS:
            source = part.get("source")
            if not (kind == "document" and isinstance(source, dict) and source.get("type") in TEXT_SOURCES):
                found.unbounded = found.unbounded or "a PDF or other file, billed by its pages"
        elif kind in AUDIO_PARTS:
            found.unbounded = found.unbounded or "audio, billed by its length at audio prices"
        return
    for key in GEMINI_DATA.intersection(part):  # a Gemini part: judged by its MIME type
        data = part[key]
        if not isinstance(data, dict):
            continue
        mime = str(data.get("mimeType") or data.get("mime_type") or "")
        if mime.startswith("image/"):
            found.images += 1
        elif not (mime.startswith("text/") and key in ("inlineData", "inline_data")):  # inline text is counted as characters
            timed = mime.startswith(("audio/", "video/"))
            what = mime.split("/")[0] if timed else f"a {mime or 'file'} file"
            found.unbounded = found.unbounded or f"{what}, billed by its {'length' if timed else 'content'}"


# ---- the most one image costs ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageBound:
    tokens: int  # input tokens, at most, for one image of any size and detail
    source: str  # how the figure follows from the provider's documentation


_OPENAI_GUIDE = "platform.openai.com/docs/guides/images-vision, \"Calculating costs\""
# OpenAI, by model id (dates and -latest stripped). Tile models: an image is fit in 2048 x 2048,
# then its short side scaled to 768 px: 768 x 2048 at most, 2 x 4 = 8 tiles of 512 px, so
# base + 8 x tile. Patch models: 32-px patches, at most 1,536 of them, times the model's multiplier.
_OPENAI: dict[str, tuple[int, str]] = {
    "gpt-4o-mini": (48_169, "2,833 + 8 tiles x 5,667"),
    "gpt-4.1-nano": (3_779, "1,536 patches x 2.46"),
    "gpt-5-nano": (3_779, "1,536 patches x 2.46"),
    "o4-mini": (2_642, "1,536 patches x 1.72"),
    "gpt-4.1-mini": (2_489, "1,536 patches x 1.62"),
    "gpt-5-mini": (2_489, "1,536 patches x 1.62"),
    "gpt-4.1": (1_536, "1,536 patches (85 + 8 tiles x 170 = 1,445 by the tile rule)"),
    "gpt-4o": (1_445, "85 + 8 tiles x 170"),
    "chatgpt-4o": (1_445, "85 + 8 tiles x 170"),
    "gpt-4.5-preview": (1_445, "85 + 8 tiles x 170"),
    "o1": (1_275, "75 + 8 tiles x 150"),
    "o1-pro": (1_275, "75 + 8 tiles x 150"),
    "o3": (1_275, "75 + 8 tiles x 150"),
    "gpt-5": (1_190, "70 + 8 tiles x 140"),
    "gpt-5-chat": (1_190, "70 + 8 tiles x 140"),
    "computer-use-preview": (1_097, "65 + 8 tiles x 129"),
}
_OPENAI_MOST = max(t for t, _ in _OPENAI.values())  # gpt-4o-mini's: for a model the guide does not list
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|latest)$")
_OPENAI_FAMILY = re.compile(r"(?:^|[/.])((?:chatgpt-|gpt-|o\d)[\w.-]*|computer-use-preview[\w.-]*)$")
# Anthropic (docs.anthropic.com/en/docs/build-with-claude/vision, "Evaluate image size"): an
# image over 1,568 px on its long edge or over ~1,600 tokens (w x h / 750) is scaled down first,
# on every model before Claude Opus 4.7; Opus 4.7 reads up to 2,576 px on the long edge, about
# 3.75 megapixels: 3,750,000 / 750 = 5,000 tokens (that for any later or unknown model too).
_CLAUDE_OLD = re.compile(r"claude-(\d+)(?:-(\d))?-(?:opus|sonnet|haiku)")  # claude-3-5-sonnet
_CLAUDE_NEW = re.compile(r"claude-(?:opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2})(?!\d))?")  # claude-sonnet-4-5, -4.5
_CLAUDE_ANY = re.compile(r"claude-(?:(\d+)|instant)")
_ANTHROPIC_GUIDE = "docs.anthropic.com/en/docs/build-with-claude/vision"
# Gemini (ai.google.dev/gemini-api/docs/tokens; cloud.google.com/vertex-ai/generative-ai/docs/
# multimodal/image-understanding: images are scaled to 3,072 x 3,072 at most): Gemini 2 bills
# 258 tokens a 768-px tile, at most 4 x 4 = 16 tiles; Gemini 1.5 tiles at 256-768 px (the short
# side / 1.5), at most 12 x 2 = 24 tiles; Gemini 3 bills by media resolution, 2,240 tokens at
# most (ultra high; ai.google.dev/gemini-api/docs/media-resolution). A model the docs do not
# cover (Gemini 4, say) takes the largest figure, as on the other providers.
_GEMINI = re.compile(r"gemini-(\d+)")
_GEMINI_GUIDE = "ai.google.dev/gemini-api/docs/tokens and docs/media-resolution"


def image_bound(model: str, price_list: str | None) -> ImageBound | None:
    """The most input tokens one image may be billed on `model` (a Claude, Gemini or OpenAI
    model, wherever it is hosted: Bedrock's and OpenRouter's ids name it); on an OpenAI or
    Azure price list a model the guide does not list takes the largest figure it gives.
    None where no provider documents a most (an open model on a host, a self-hosted one)."""
    name = model.strip().lower()
    if "claude" in name:
        return _claude(name)
    if "gemini" in name:
        m = _GEMINI.search(name)
        major = int(m.group(1)) if m else None
        tokens, why = (2_240, "Gemini 3's media resolution, ultra high") if major == 3 else \
            (4_128, "16 tiles x 258 (768-px tiles of an image at most 3,072 px a side)") if major == 2 else \
            (6_192, "24 tiles x 258 (Gemini 1.5's tiles of 256-768 px, of an image at most 3,072 px a side; "
                    "the largest figure, for any model not named 2.x or 3.x)")  # fmt: skip
        return ImageBound(tokens, f"{why}: {_GEMINI_GUIDE}")
    if (m := _OPENAI_FAMILY.search(name)) is not None:
        found = _OPENAI.get(_SNAPSHOT.sub("", m.group(1)))
        if found is not None:
            return ImageBound(found[0], f"{found[1]}: {_OPENAI_GUIDE}")
        return ImageBound(_OPENAI_MOST, f"not in OpenAI's guide: its largest figure, gpt-4o-mini's ({_OPENAI_GUIDE})")
    if price_list in ("openai", "azure"):
        return ImageBound(_OPENAI_MOST, f"not in OpenAI's guide: its largest figure, gpt-4o-mini's ({_OPENAI_GUIDE})")
    return None


def _claude(name: str) -> ImageBound:
    version: tuple[int, int] | None = None
    if (m := _CLAUDE_NEW.search(name) or _CLAUDE_OLD.search(name)) is not None:
        version = (int(m.group(1)), int(m.group(2) or 0))
    elif (m := _CLAUDE_ANY.search(name)) is not None:
        version = (int(m.group(1)), 0) if m.group(1) else (1, 0)  # claude-2.1, claude-instant
    if version is not None and version < (4, 7):
        return ImageBound(1_600, f"images over 1,568 px or ~1,600 tokens are scaled down: {_ANTHROPIC_GUIDE}")
    return ImageBound(5_000, f"Claude Opus 4.7 reads up to 2,576 px, ~3.75 MP / 750 (any later model too): {_ANTHROPIC_GUIDE}")
