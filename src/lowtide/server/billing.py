"""serve's bill: what a provider would have charged for a batch, one row per billable
result line it wrote, with the usage that line reports and its price at the batch tier.

Written once, with the batch's final status (`Worker.end`), from the lines as the fault
plan left them: a dropped line is not billed, a line written twice is billed once, a line
cut in half is billed but marked not `whole`. A simulation holds it against the client's
ledger (its billed attempts): each line booked once, with the same tokens.

    for line in billing.lines(store): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from lowtide.core.types import Usage
from lowtide.engine.ledger import Rate, current_ledger
from lowtide.server.outputs import Result
from lowtide.server.translate import decode_key, encode_key
from lowtide.store.db import Store
from lowtide.store.schema import serve_billing

ROUTE_OF = {"openai": "openai-batch", "anthropic": "anthropic-batch", "gemini": "gemini-batch", "openrouter": "openrouter-batch"}  # whose prices apply


@dataclass(frozen=True, slots=True)
class Line:
    batch_id: str
    api: str
    custom_id: str
    model: str | None
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cost_picousd: int | None
    whole: bool
    at: float


class Bill:
    """The billable lines of one batch as they are written; `rows()` once it is done."""

    def __init__(self, batch_id: str, api: str, at: float):
        self.batch_id, self.api, self.at = batch_id, api, at
        self._lines: dict[str, dict[str, Any]] = {}
        # Priced as the client's ledger prices its attempts: each model's rate looked up once
        # and each set of token counts costed once (a catalog lookup per line was most of
        # ending a batch).
        self._ledger = current_ledger()
        self._rates: dict[str | None, Rate] = {}

    def note(self, r: Result, fate: str) -> None:
        """A line written for `r` (fate: whole, or corrupt); only a succeeded request's is billed."""
        if r.kind != "succeeded":
            return
        if r.custom_id in self._lines:  # written twice: one request, billed once
            return
        rate = self._rates.get(r.model)
        if rate is None:
            rate = self._rates[r.model] = self._ledger.rate(ROUTE_OF[self.api], None, r.model, at=self.at)
        _, cost_picousd, _ = self._ledger.columns(_Billed(r.usage), rate)
        self._lines[r.custom_id] = {
            # Kept as the jobs keep it: PostgreSQL's text holds no NUL (server/translate.py).
            "batch_id": self.batch_id, "api": self.api, "custom_id": encode_key(r.custom_id), "model": r.model,
            "input_tokens": r.usage.input_tokens, "cached_input_tokens": r.usage.cached_input_tokens,
            "output_tokens": r.usage.output_tokens, "cost_picousd": cost_picousd,
            "whole": fate != "corrupt", "at": self.at,
        }  # fmt: skip

    def rows(self) -> list[dict[str, Any]]:
        return list(self._lines.values())


@dataclass(frozen=True, slots=True)
class _Billed:
    """A succeeded line as the ledger reads an outcome."""

    usage: Usage
    ok: bool = True
    error_code: None = None


def record(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(serve_billing.insert(), rows)


def lines(store: Store, batch_id: str | None = None) -> list[Line]:
    """Every billed line (of one batch, if given), in the order written."""
    stmt = select(*(serve_billing.c[f] for f in Line.__slots__)).order_by(serve_billing.c.id)
    if batch_id is not None:
        stmt = stmt.where(serve_billing.c.batch_id == batch_id)
    with store.read() as conn:
        return [Line(*row[:2], decode_key(row[2]), *row[3:]) for row in conn.execute(stmt)]
