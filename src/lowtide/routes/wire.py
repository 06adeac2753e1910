"""What every provider's wire shares: keys the installed SDK does not declare, the refusal of a
stream, and a provider's odd values (token counts, codes) read the same way everywhere.

A stored body goes to a provider of its own protocol verbatim. On such a same-protocol route a
top-level key the installed SDK does not declare (an older SDK's `temperature`, a newer
API's parameter) is not refused: it travels in the body as it came, as the SDKs'
`extra_body` would send it (`undeclared` names them; the loader notes each once per job,
engine/carried.py). Only `stream` and `stream_options` are refused: nobody reads a stream.
"""

from __future__ import annotations

import json
from typing import Any

from lowtide.core.endpoints import NEVER, known_keys
from lowtide.core.types import Refusal

# A tier a response may name that is already one of lowtide's words (Outcome.tier).
OWN_TIER_WORDS = frozenset({"flex", "priority", "batch"})


def undeclared(endpoint: str, body: dict[str, Any]) -> list[str]:
    """The top-level keys of `body` the installed SDK's request type for `endpoint` does not
    declare: a same-protocol route carries them as they are (see the module doc)."""
    known = known_keys(endpoint)
    return [key for key in body if key not in known and key not in NEVER]


def stream_refusal(body: dict[str, Any]) -> Refusal | None:
    for key in NEVER:
        if key in body:
            return Refusal(key, "a batch or stored request cannot be streamed; remove it")
    return None


def count(value: Any) -> int:
    """A token count as a provider reported it: a non-negative integer (or an integral number
    or digits in a string); anything else is 0, never carried into the ledger as it is."""
    if type(value) is int:  # the usual case first: ingest reads four counts per result
        return value if value > 0 else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


def text_or_none(value: Any) -> str | None:
    """A code, reason or message as text (a provider's odd object, serialised)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)[:2000]
