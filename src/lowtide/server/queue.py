"""OpenAI's enqueued-token limit, simulated (`enqueued_tokens` in the fault plan).

OpenAI counts, per model and organization, the input tokens of batches not yet ended; a new
batch that would take the count over the limit fails validation with `token_limit_exceeded`
and OpenAI's message. Here a batch's tokens are its request bodies' characters / 4 (read
from its input file once, then remembered), and the batches counted are the model's others
in progress, finalizing or cancelling.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from sqlalchemy import Row

from lowtide.core import fastjson
from lowtide.server import records
from lowtide.server.context import Server
from lowtide.server.records import BatchStatus as S

COUNTED = (S.IN_PROGRESS.value, S.FINALIZING.value, S.CANCELLING.value)
_tokens: dict[str, int] = {}  # batch id -> its input tokens (the files never change)
_lock = threading.Lock()


def over_limit(server: Server, batch_id: str) -> list[dict[str, Any]]:
    """The validation errors of a batch over its model's limit; [] when it fits or none is set."""
    with server.store.begin() as conn:
        row = records.get_batch(conn, batch_id)
        limit = server.faults.plan.token_limit(row.model or "")
        if limit is None:
            return []
        others = [r for r in records.live_batches(conn) if r.api == "openai" and r.model == row.model and r.status in COUNTED]
    mine = tokens(server, row)
    total = mine + sum(tokens(server, r) for r in others if r.id != row.id)
    if total <= limit:
        return []
    message = (
        f"Enqueued token limit reached for {row.model} in organization org-lowtide-serve. Limit: {limit:,} enqueued "
        "tokens. Please try again once some in_progress batches have been completed."
    )
    return [{"code": "token_limit_exceeded", "message": message, "param": None, "line": None}]


def tokens(server: Server, row: Row) -> int:
    with _lock:
        known = _tokens.get(row.id)
    if known is not None:
        return known
    with server.store.begin() as conn:
        file = records.get_file(conn, row.input_file_id)
    chars = 0
    if file is not None:
        with server.path(file.path).open("rb") as f:
            for line in f:
                if line.strip():
                    chars += len(fastjson.dumpb(fastjson.loads(line).get("body")))
    with _lock:
        _tokens[row.id] = math.ceil(chars / 4)
    return _tokens[row.id]
