"""`lowtide prices MODEL`: what a model costs on each tier on a given day, and where each
figure comes from (the user's price file, genai-prices, or a discount lowtide derives)."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from lowtide.cli.common import fail, out
from lowtide.core.errors import InputError, LowtideError
from lowtide.core.genai_source import as_day
from lowtide.core.pricing import PRICE_LISTS, PRICES_ENV, PriceLookup, TierPrices, load_catalog

FIELDS = ("input", "cached_input", "cache_write_5m", "cache_write_1h", "output")


def prices(
    model: Annotated[str, typer.Argument(help="A model name as requests send it, e.g. gpt-4o-mini-2024-07-18.", show_default=False)],
    provider: Annotated[str | None, typer.Option("--provider", help=f"One of {', '.join(PRICE_LISTS)} (default: the first that knows the model).")] = None,
    on: Annotated[str | None, typer.Option("--date", help="The request's date, YYYY-MM-DD (default: today): prices are those of that day.")] = None,
    price_file: Annotated[Path | None, typer.Option("--prices", help=f"A price file merged over the catalog (default: ${PRICES_ENV}).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Show the prices that apply to MODEL, per tier, and where they come from.

    USD per million tokens. Example: lowtide prices gpt-4o-mini --date 2026-03-01
    """
    try:
        day = _day(on)
        if provider is not None and provider not in PRICE_LISTS:
            raise InputError(f'--provider "{provider}" is not known; use one of {", ".join(PRICE_LISTS)}')
        catalog = load_catalog(price_file)
        found = next((f for p in ([provider] if provider else PRICE_LISTS) if (f := catalog.explain(p, model, day))), None)
        if found is None:
            where = provider or " or ".join(PRICE_LISTS)
            raise InputError(
                f'model "{model}" has no {where} price on {as_day(day)} ({catalog.describe()}); '
                f"add it to a price file and name it with --prices or ${PRICES_ENV} (docs/costs.md)"
            )
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps(as_dict(found), indent=2))
        return
    out.print(f"{found.provider} {found.model} → {found.name}, prices of {found.day} (USD per million tokens)", markup=False)
    table = Table(box=None, pad_edge=False)
    for col in ("tier", *FIELDS, "from"):
        table.add_column(col, justify="left" if col in ("tier", "from") else "right")
    for tier, origin in found.origins.items():
        p = found.prices.tier_named(tier)
        table.add_row(tier, *(_fmt(getattr(p, f)) for f in FIELDS), origin)
    out.print(table)
    if found.not_offered:
        out.print(f"not offered: {', '.join(found.not_offered)} (its cost is unknown, never borrowed)", markup=False)
    if found.prices.note:
        out.print(f"note: {found.prices.note}", markup=False)


def as_dict(found: PriceLookup) -> dict[str, Any]:
    def tier(p: TierPrices) -> dict[str, str | None]:
        return {f: None if getattr(p, f) is None else str(getattr(p, f)) for f in FIELDS}

    return {
        "provider": found.provider, "model": found.model, "entry": found.name, "date": str(found.day),
        "currency": "USD per million tokens",
        "tiers": {t: tier(found.prices.tier_named(t)) | {"from": o} for t, o in found.origins.items()},
        "not_offered": list(found.not_offered), "note": found.prices.note,
    }  # fmt: skip


def _day(text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InputError(f'--date "{text}" is not a date; give YYYY-MM-DD, e.g. 2026-03-01') from None


def _fmt(value: Decimal | None) -> str:
    return "-" if value is None else f"{value.normalize():f}"
