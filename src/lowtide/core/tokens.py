"""Counting the input tokens of chat requests before they are sent (for `lowtide estimate`).

Exact counts need the model's tokenizer. For OpenAI models that is tiktoken with its BPE
file (o200k_base or cl100k_base), which tiktoken downloads at first use; no maintained
package on PyPI ships those files for offline use. So lowtide counts exactly only when
tiktoken is installed AND its file is already in tiktoken's cache (TIKTOKEN_CACHE_DIR, else
the system temp folder's data-gym-cache) with the right checksum; it never downloads.
Everything else — other providers, self-hosted models, or no cached file — is approximated:

    tokens(text)        = ceil(characters / 4 + (UTF-8 bytes − characters) / 2)
    tokens(messages)    = sum(tokens(content) + 3 per message) + 3

(the per-message overhead is OpenAI's documented chat framing; close enough for others).
English prose runs about 4 characters a token, and ASCII text counts as characters / 4.
Other scripts run far fewer characters a token, more the more bytes a character takes, so a
character outside ASCII adds half a token for each byte past its first: 1.25 tokens a
Chinese or Japanese character, 0.75 a Cyrillic or Greek one. Measured against cl100k_base,
o200k_base and Claude's and DeepSeek's tokenizers (tests/core/test_token_approximation.py),
that is within about 2x of each, where characters / 4 was low by 4 to 7 times; code and
numbers still run fewer characters a token than 4, so it can be low by a third for them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.core.endpoints import NO_TEXT, conversation_key

PER_MESSAGE = 3  # <|start|>role ... <|end|>
PER_REPLY = 3  # the assistant turn every reply is primed with
APPROXIMATION = "approximation: characters / 4 (+ 1/2 per UTF-8 byte past a character's first) + 3 per message + 3"

# tiktoken's own file names and checksums (tiktoken_ext/openai_public.py).
_ENCODINGS = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}
# OpenAI model names by prefix, longest first: gpt-4o before gpt-4.
_OPENAI_PREFIXES = (
    ("gpt-4o", "o200k_base"), ("chatgpt-4o", "o200k_base"), ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"), ("gpt-5", "o200k_base"), ("o1", "o200k_base"), ("o3", "o200k_base"),
    ("o4", "o200k_base"), ("gpt-4", "cl100k_base"), ("gpt-3.5", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"), ("text-embedding-ada", "cl100k_base"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """Counts the input tokens of one request's messages. `exact` False: approximated, and
    `method` says how (and why not exactly)."""

    method: str
    exact: bool
    _count: Callable[[str], int]

    def count_text(self, text: str) -> int:
        return self._count(text)

    def count_messages(self, messages: Sequence[dict[str, Any]]) -> int:
        return sum(self._count(_text_of(m.get("content"))) + PER_MESSAGE for m in messages) + PER_REPLY

    def count_request(self, endpoint: str, body: dict[str, Any]) -> int:
        """The input tokens of one request body of any endpoint: its conversation (or
        prompt), its system prompt or instructions, and its tools' definitions as text."""
        asked = body.get(conversation_key(endpoint))
        if endpoint in NO_TEXT:  # embeddings, moderations: the inputs' text only, no turns, no reply
            given = asked if isinstance(asked, list) else [asked]
            return sum(self._count(t) if isinstance(t, str) else len(t) if isinstance(t, list) else 0 for t in given)
        total = self._count(asked) + PER_REPLY if isinstance(asked, str) else self.count_messages(asked or [])
        for key in ("system", "instructions"):
            if body.get(key):
                total += self._count(_text_of(body[key])) + PER_MESSAGE
        if body.get("tools"):
            total += self._count(json.dumps(body["tools"], ensure_ascii=False))
        return total


def _text_of(content: Any) -> str:
    """The text a message's content carries: a string, or its parts' text (other parts,
    such as images, are not counted: their price depends on the provider's own sizing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def approx_tokens(text: str) -> int:
    """The approximation of the module doc for one text."""
    if text.isascii():
        return -(-len(text) // 4)
    return approx_from(len(text), len(text.encode("utf-8", "surrogatepass")))


def approx_from(chars: int, nbytes: int) -> int:
    """The approximation for text of `chars` characters taking `nbytes` bytes in UTF-8 (what
    SQL tells of stored text without reading it in Python: `length` and `stored_bytes`)."""
    return -(-(chars + 2 * max(nbytes - chars, 0)) // 4)


def encoding_for(model: str) -> str | None:
    """The tiktoken encoding of an OpenAI model, or None for any other model."""
    name = model.strip().lower().removeprefix("openai/")
    return next((enc for prefix, enc in _OPENAI_PREFIXES if name.startswith(prefix)), None)


def counter_for(model: str, provider: str | None) -> TokenCounter:
    """Exact for OpenAI models where tiktoken can work offline; the approximation otherwise."""
    encoding = encoding_for(model) if provider in (None, "openai") else None
    if encoding is None:
        return TokenCounter(f"{APPROXIMATION} (no local tokenizer for {model})", False, approx_tokens)
    why_not = _offline_tiktoken(encoding)
    if why_not:
        return TokenCounter(f"{APPROXIMATION} ({why_not})", False, approx_tokens)
    import tiktoken

    enc = tiktoken.get_encoding(encoding)
    return TokenCounter(f"tiktoken {encoding} (exact)", True, lambda text: len(enc.encode_ordinary(text)))


def _offline_tiktoken(encoding: str) -> str | None:
    """Why tiktoken cannot give `encoding` without the network, or None if it can."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed"
    url, sha256 = _ENCODINGS[encoding]
    folder = tiktoken_cache_dir()
    if folder is None:
        return "tiktoken's cache is turned off (TIKTOKEN_CACHE_DIR is empty)"
    path = folder / hashlib.sha1(url.encode()).hexdigest()
    try:
        data = path.read_bytes()
    except OSError:
        return f"tiktoken's {encoding} file is not in its cache ({path.parent}); lowtide never downloads it"
    if hashlib.sha256(data).hexdigest() != sha256:
        return f"tiktoken's cached {encoding} file ({path}) fails its checksum"
    return None


def tiktoken_cache_dir() -> Path | None:
    """Where tiktoken looks for its files, as tiktoken/load.py `read_file_cached` decides;
    None when its cache is turned off (then it would always download)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return Path(os.environ[var]) if os.environ[var] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"
