"""Gemini resumable upload sessions that were started and never finished: each expires
SESSION_TTL after its start, on serve's clock (Google's upload URLs last a week), and its
bytes are dropped. Before, an abandoned session's part file stayed in the data dir for ever.

A session is `<id>.json` (its header) and `<id>.part` (the bytes so far) in `uploads/`:

    head = stamped({"displayName": ...}, clock.now())   # when it starts
    sweep(staging, clock.now())                          # on each upload call: the expired go
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SESSION_TTL = 7 * 86400.0  # seconds from a session's start


def stamped(head: dict[str, Any], now: float) -> dict[str, Any]:
    """The session's header, with when it started."""
    return {**head, "started": now}


def sweep(staging: Path, now: float, ttl: float = SESSION_TTL) -> list[str]:
    """Remove every session started `ttl` or more ago; the ids removed. A header without a
    start (written before this module) is stamped now, so it expires `ttl` from now."""
    removed = []
    for header in sorted(staging.glob("*.json")):
        try:
            head = json.loads(header.read_text())
        except (OSError, ValueError):
            head = {}
        started = head.get("started") if isinstance(head, dict) else None
        if not isinstance(started, int | float):
            header.write_text(json.dumps(stamped(head if isinstance(head, dict) else {}, now)))
            continue
        if now - started >= ttl:
            (staging / f"{header.stem}.part").unlink(missing_ok=True)
            header.unlink(missing_ok=True)
            removed.append(header.stem)
    return removed
