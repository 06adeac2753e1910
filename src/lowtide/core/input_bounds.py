"""What a request's input may be billed beyond its text: the prompt-cache writes it asks
for. Budgets (engine/budget.py) and `lowtide estimate` (engine/counting.py) add these to the
text's approximation, so that an estimate stays an upper bound of the provider's bill.

    scan(body) ─► Scan(cache_ttl): what a body holds beyond its text

Cache writes (Anthropic's `cache_control`, on any block, tool or the body's top): the
cached prefix is billed at the write rate, 1.25x input for the 5-minute TTL and 2x for the
1-hour one (`ttl: "1h"`), instead of the input rate; `Scan.cache_ttl` is the longest TTL a
body asks for. OpenAI and Gemini bill no write per request (OpenAI's prompt caching is
automatic and free to write; Gemini's explicit caches are created by a call of their own
and billed for storage, not by the requests that read them), and their price lists carry
no write rate, so a write priced there costs what input costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Scan:
    """What one request body holds beyond its text."""

    cache_ttl: str | None = None  # "5m" or "1h": it asks to write a prompt cache, at this TTL at longest


NOTHING = Scan()


class _Found:
    __slots__ = ("ttl",)

    def __init__(self) -> None:
        self.ttl: str | None = None


# Every key `scan` acts on contains one of these: a stored body's JSON text holding none of
# them holds no cache write, and need not be walked.
MARKERS = ("cache_control",)


def may_hold(text: str) -> bool:
    """Whether a body's JSON text may hold what `scan` finds (False: it surely holds none)."""
    return any(m in text for m in MARKERS)


def scan(body: Any) -> Scan:
    """The cache writes a request body asks for (or any part of one, such as a spec's
    `params`), in any endpoint's native shape."""
    found = _Found()
    _walk(body, found)
    return Scan(found.ttl)


def longer_ttl(a: str | None, b: str | None) -> str | None:
    """The longer of two cache-write TTLs (the dearer write); None where neither writes."""
    return "1h" if "1h" in (a, b) else a or b


def _walk(value: Any, found: _Found) -> None:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                _walk(item, found)
        return
    if not isinstance(value, dict):
        return
    cache = value.get("cache_control")
    if isinstance(cache, dict):  # no TTL is the 5-minute one; any other than "5m" is priced as the dearer
        found.ttl = longer_ttl(found.ttl, "5m" if cache.get("ttl", "5m") == "5m" else "1h")
    for item in value.values():
        if isinstance(item, (dict, list)):
            _walk(item, found)
