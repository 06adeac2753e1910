"""How the store keeps money: integer picodollars (10^-12 USD).

Costs are computed as `Decimal` USD (`lowtide.core.pricing`) and must add up exactly on both
backends. SQLite has no exact decimal type (a NUMERIC column holds a float), so money columns
are BIGINT in picodollars: exact for every price with up to six decimals per million tokens
(the catalog's finest has four), a single attempt's self-hosted GPU time rounded to 10^-12
USD. Micro-dollars would not do: 100 cached gpt-4o-mini batch tokens cost $0.00000375.
A BIGINT holds $9.2 million; PostgreSQL sums it as NUMERIC, SQLite's SUM raises on overflow
past that, which one store's ledger is not expected to reach.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

PICO = 12


def to_pico(usd: Decimal | None) -> int | None:
    """USD → picodollars, rounded half-even; None (unknown) stays None."""
    if usd is None:
        return None
    return int(usd.scaleb(PICO).to_integral_value(rounding=ROUND_HALF_EVEN))


def from_pico(pico: int | Decimal | None) -> Decimal | None:
    """Picodollars (a column, or a SUM of one) → USD."""
    if pico is None:
        return None
    usd = Decimal(int(pico)).scaleb(-PICO).normalize()  # no trailing zeros ...
    return usd.quantize(Decimal(1)) if usd.as_tuple().exponent > 0 else usd  # ... and no "1E+1"
