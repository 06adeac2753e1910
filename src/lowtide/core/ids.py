"""custom_id: derived from the row's business key, never from its position.

Providers accept `^[a-zA-Z0-9_-]{1,64}$` (Anthropic's rule, the strictest). A key that already
fits is used as it is. Any other key is mapped deterministically: characters outside the set
become `_`, the result is cut to 55 characters, and `-` plus the first 8 hex digits of the
key's SHA-1 is appended, so `"café #12"` becomes `caf_12-<hash>`. The original key is kept
beside the custom_id in the store and in the results.
"""

from __future__ import annotations

import hashlib
import re

CUSTOM_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")


def custom_id_for(key: str) -> str:
    if CUSTOM_ID_PATTERN.match(key):
        return key
    safe = _UNSAFE.sub("_", key).strip("_")[:55] or "id"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}"
