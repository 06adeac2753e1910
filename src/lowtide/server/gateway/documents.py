"""The upstream's documents of owned objects (a file, a batch), kept in memory so that listing
a tenant's objects does not read each one from the upstream on every call.

Listing is served from the gateway's records (owned.py); each object's document comes from
here when known. A document that no longer changes — a file, a batch that has ended — is
kept until it is deleted through the gateway or pushed out (the cache is bounded); one that
may still change (a batch in progress) for `LIVE_SECONDS` of the gateway's clock. So a
tenant listing in a loop costs the shared key nothing for its files and at most one read
per batch in progress every few seconds; a document not known (after a restart) is read
once. A file whose `expires_at` has passed is not listed: the upstream has removed it.
Documents are filled from every answer the gateway relays about an object (create,
retrieve, list), kept as compact JSON bytes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

LIVE_SECONDS = 10.0
# Kept whatever their state: OpenAI batch states that never change again, Anthropic's ended.
_ENDED = {"batch": ("completed", "failed", "expired", "cancelled"), "message_batch": ("ended",)}


def is_final(kind: str, doc: dict[str, Any]) -> bool:
    """Whether the object's document can no longer change."""
    if kind == "file":
        return True
    state = doc.get("processing_status") if kind == "message_batch" else doc.get("status")
    return state in _ENDED.get(kind, ())


def is_gone(kind: str, doc: dict[str, Any], now: float) -> bool:
    """A file past its `expires_at` (the upstream deletes it then)."""
    expires = doc.get("expires_at")
    return kind == "file" and isinstance(expires, int | float) and not isinstance(expires, bool) and expires <= now


class Documents:
    """(api, kind, id) → the object's last document, at most `size` of them (least recently
    used out first)."""

    def __init__(self, size: int = 50_000):
        self.size = size
        self._docs: OrderedDict[tuple[str, str, str], tuple[bytes, float | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._docs)

    def put(self, api: str, kind: str, doc: dict[str, Any], now: float) -> None:
        object_id = doc.get("id")
        if not isinstance(object_id, str):
            return
        fresh_until = None if is_final(kind, doc) else now + LIVE_SECONDS
        key = (api, kind, object_id)
        self._docs[key] = (json.dumps(doc, separators=(",", ":")).encode(), fresh_until)
        self._docs.move_to_end(key)
        while len(self._docs) > self.size:
            self._docs.popitem(last=False)

    def get(self, api: str, kind: str, object_id: str, now: float) -> dict[str, Any] | None:
        """The document if known and still to be trusted at `now`, else None (read it again)."""
        key = (api, kind, object_id)
        found = self._docs.get(key)
        if found is None:
            return None
        raw, fresh_until = found
        if fresh_until is not None and now >= fresh_until:
            del self._docs[key]
            return None
        self._docs.move_to_end(key)
        return json.loads(raw)

    def forget(self, api: str, kind: str, object_id: str) -> None:
        self._docs.pop((api, kind, object_id), None)
