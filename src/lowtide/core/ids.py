"""custom_id: derived from the row's business key, never from its position.

Providers accept `^[a-zA-Z0-9_-]{1,64}$` (Anthropic's rule, the strictest). A key that already
fits is used as it is. Any other key is mapped deterministically: characters outside the set
become `_`, the result is cut to 47 characters, and `-` plus the first 16 hex digits (64 bits)
of the key's SHA-1 is appended, so `"café #12"` becomes `caf_12-<hash>`. Keys that share a long
prefix (URLs, S3 paths) are told apart by the hash alone: 64 bits keep a collision negligible
at any job size. The original key is kept beside the custom_id in the store and in the results.

An integral number written as a float (`1.0`, what a float column or pandas' CSV gives) is
the same key as the integer (`1`): `key_of` writes it as the integer, so an id column that
goes from float to int names the same requests. Stores written before that rule hold such
keys as `1_0-<hash>`; `legacy_custom_ids` names those, and loading and exporting fall back
to them, so such a job is neither re-run nor re-billed. So it does for the ids of stores from
before the 16-digit hash: a prefix of 55 characters and 8 hex digits (32 bits, which made two
URLs of one long prefix a "duplicate id" in one job in four of 50,000 rows).
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


DIGITS = 16  # hex digits of the SHA-1 in a mapped key's custom_id: 64 bits
LEGACY_DIGITS = 8  # what stores from before DIGITS hold (32 bits: long shared prefixes collided)


def custom_id_for(key: str, variant: str | None = None, digits: int = DIGITS) -> str:
    """The custom_id of a row's business key, and of its eval variant (core/evals.py):
    `ticket-48213__gpt-v2`. A key that leaves too little room beside the variant's name is
    cut and given its hash, as any other unsafe key is. `digits` other than DIGITS gives
    the ids of older stores (`legacy_custom_ids`)."""
    mark = digits + 1  # `-` and the digest
    if variant is None:
        if CUSTOM_ID_PATTERN.match(key):
            return key
        return _hashed(key, 64 - mark, digits)
    room = 64 - len(variant) - len(VARIANT_SEPARATOR)
    base = key if CUSTOM_ID_PATTERN.match(key) and len(key) <= room else _hashed(key, room - mark, digits)
    return f"{base}{VARIANT_SEPARATOR}{variant}"


def _hashed(key: str, keep: int, digits: int) -> str:
    safe = _UNSAFE.sub("_", key).strip("_")[:keep] or "id"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:digits]
    return f"{safe}-{digest}"


def custom_id_of(text: str, variant: str | None = None) -> str:
    """`custom_id_for(key_of(text), variant)`: the custom_id of an id cell's text (already
    stripped), as the loader derives it for every row. An id of ASCII letters and digits
    alone and no variant, the commonest by far, is its own key (no `.`) and fits the pattern
    as it is: told by two string checks, not a regex."""
    if variant is None and len(text) <= 64 and text.isascii() and text.isalnum():
        return text
    return custom_id_for(key_of(text), variant)


def key_of(text: str) -> str:
    """The business key of an id cell's text (already stripped): `1.0` → `1`."""
    if "." in text:  # the usual key has none: one `in` per row, no regex
        m = _INTEGRAL_FLOAT.match(text)
        if m:
            return m.group(1)
    return text


def legacy_custom_ids(text: str, variant: str | None = None) -> list[str]:
    """custom_ids lowtide derived for this key before today's rules, where they differ from
    today's: with 8 hex digits (any key that is mapped), and before `key_of` (the float
    spelling of an integral key, which had 8 digits then too); empty for a key used as it is."""
    key = key_of(text)
    spellings = [key, key + ".0", text] if _INTEGER.match(key) else [key]
    today = custom_id_for(key, variant)
    old = (custom_id_for(s, variant, LEGACY_DIGITS) for s in spellings)
    return [c for c in dict.fromkeys(old) if c != today]
