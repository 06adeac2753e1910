"""custom_id: derived from the row's business key, never from its position.

Providers accept `^[a-zA-Z0-9_-]{1,64}$` (Anthropic's rule, the strictest). A key that already
fits is used as it is. Any other key is mapped deterministically: characters outside the set
become `_`, the result is cut to 55 characters, and `-` plus the first 8 hex digits of the
key's SHA-1 is appended, so `"café #12"` becomes `caf_12-<hash>`. The original key is kept
beside the custom_id in the store and in the results.

An integral number written as a float (`1.0`, what a float column or pandas' CSV gives) is
the same key as the integer (`1`): `key_of` writes it as the integer, so an id column that
goes from float to int names the same requests. Stores written before that rule hold such
keys as `1_0-<hash>`; `legacy_custom_ids` names those, and loading and exporting fall back
to them, so such a job is neither re-run nor re-billed.
"""

from __future__ import annotations

import hashlib
import re

CUSTOM_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")
_INTEGRAL_FLOAT = re.compile(r"^([+-]?\d+)\.0+$")
_INTEGER = re.compile(r"^[+-]?\d+$")


VARIANT_SEPARATOR = "__"  # between the business key and an eval variant's name
MAX_VARIANT = 40  # so that at least 22 characters of a custom_id are left for the key
VARIANT_NAME = re.compile(rf"^[a-zA-Z0-9_-]{{1,{MAX_VARIANT}}}$")


def custom_id_for(key: str, variant: str | None = None) -> str:
    """The custom_id of a row's business key, and of its eval variant (core/evals.py):
    `ticket-48213__gpt-v2`. A key that leaves too little room beside the variant's name is
    cut and given its hash, as any other unsafe key is."""
    if variant is None:
        if CUSTOM_ID_PATTERN.match(key):
            return key
        return _hashed(key, 55)
    room = 64 - len(variant) - len(VARIANT_SEPARATOR)
    base = key if CUSTOM_ID_PATTERN.match(key) and len(key) <= room else _hashed(key, room - 9)
    return f"{base}{VARIANT_SEPARATOR}{variant}"


def _hashed(key: str, keep: int) -> str:
    safe = _UNSAFE.sub("_", key).strip("_")[:keep] or "id"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}"


def key_of(text: str) -> str:
    """The business key of an id cell's text (already stripped): `1.0` → `1`."""
    if "." in text:  # the usual key has none: one `in` per row, no regex
        m = _INTEGRAL_FLOAT.match(text)
        if m:
            return m.group(1)
    return text


def legacy_custom_ids(text: str) -> list[str]:
    """custom_ids lowtide derived for this key before `key_of` (the float spelling of an
    integral key), where they differ from today's; empty for any other key."""
    key = key_of(text)
    if not _INTEGER.match(key):
        return []
    today = custom_id_for(key)
    return [c for c in dict.fromkeys((custom_id_for(key + ".0"), custom_id_for(text))) if c != today]
