"""The base price catalog: pydantic's `genai-prices` package, read as lowtide's tiers.

genai-prices keeps dated, historic prices for many providers; per model a standard price
(which may change on given dates) and *variants* selected by request context: service tier
(`{"service_tier": "flex"}`, `"priority"`) or processing (`{"processing": "batch"}`), each
from a start date. This module answers "what did `model` cost at `provider` on `day`, per
tier, and where does each figure come from" without any of lowtide's own rules: a tier the
package has no variant for on that day is `None` here, and `pricing.Catalog` decides
whether a documented discount fills it (core/prices.yaml `derived`).

Read from the package's own types (genai_prices/types.py, data_snapshot.py): a
`ModelInfo` has `prices` (a `ModelPrice` or dated `ConditionalPrice`s) and
`price_variants` (`PriceVariant(when, prices, constraint)`); `get_prices(ts, context)`
resolves both. A `TieredPrices` value (long prompts cost more) is read at its base rate,
and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from functools import lru_cache
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo

# genai-prices is imported where a price is first looked up, not with this module: it brings
# its own HTTP client (~60 ms), and most runs (own routes, a job with no cost asked) never price.

# lowtide's provider name -> genai-prices' provider id
# lowtide's price-list name -> genai-prices' provider id: the three providers, and the hosts of
# open models and the clouds (core/host_prices.py), listed under the same ids.
PROVIDER_IDS = {"openai": "openai", "anthropic": "anthropic", "gemini": "google", "google": "google",
                "groq": "groq", "together": "together", "novita": "novita", "doubleword": "doubleword",
                "mistral": "mistral", "openrouter": "openrouter", "azure": "azure", "aws": "aws"}  # fmt: skip
# lowtide's tier -> the request context genai-prices selects that tier's variant by
CONTEXTS: dict[str, dict[str, str]] = {
    "batch": {"processing": "batch"},
    "flex": {"service_tier": "flex"},
    "priority": {"service_tier": "priority"},
}
# genai-prices' price keys -> lowtide's TierPrices fields
FIELDS = {
    "input_mtok": "input",
    "output_mtok": "output",
    "cache_read_mtok": "cached_input",
    "cache_write_mtok": "cache_write_5m",
    "cache_write_1h_mtok": "cache_write_1h",
}


@lru_cache(maxsize=1)  # read from the package's metadata on disk: once per process, not per priced line
def package() -> str:
    return f"genai-prices {version('genai_prices')}"


@dataclass(frozen=True, slots=True)
class GenaiEntry:
    """One model on one day: `tiers` maps realtime/batch/flex/priority to price fields (USD
    per million tokens), or None where the package has no variant for that tier that day.
    `offered` lists the tiers the package has a variant for on any day."""

    name: str  # the package's model id
    provider_id: str
    day: date
    tiers: dict[str, dict[str, Decimal] | None]
    offered: frozenset[str]
    note: str | None


def as_day(at: date | datetime | float | None) -> date:
    """A request's date (UTC) from a date, a datetime or Unix seconds; today when None."""
    if at is None:
        return datetime.now(tz=UTC).date()
    if isinstance(at, datetime):
        return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).date()
    if isinstance(at, date):
        return at
    return datetime.fromtimestamp(float(at), tz=UTC).date()


@lru_cache(maxsize=4096)
def lookup(provider: str, model: str, day: date) -> GenaiEntry | None:
    """`model` at `provider` on `day`, or None where the package does not know it."""
    found = _find(provider, model)
    if found is None:
        return None
    found_provider, info = found
    ts = datetime.combine(day, time(12), tzinfo=UTC)  # midday: the day's price, whatever the zone
    notes: list[str] = []
    tiers: dict[str, dict[str, Decimal] | None] = {"realtime": _fields(info.get_prices(ts), notes)}
    for tier, context in CONTEXTS.items():  # long-prompt notes: the real-time tier's say it
        tiers[tier] = _fields(info.get_prices(ts, context), []) if _active_variant(info, context, ts) else None
    offered = frozenset(t for t, c in CONTEXTS.items() if any(v.when == c for v in info.price_variants or ()))
    note = "; ".join(dict.fromkeys(notes)) or None
    return GenaiEntry(info.id, found_provider.id, day, tiers, offered | {"realtime"}, note)


def _active_variant(info: ModelInfo, context: dict[str, str], ts: datetime) -> bool:
    return any(v.when == context and (v.constraint is None or v.constraint.active(ts)) for v in info.price_variants or ())


def _fields(price: Any, notes: list[str]) -> dict[str, Decimal]:
    from genai_prices.types import TieredPrices

    out: dict[str, Decimal] = {}
    for key, field in FIELDS.items():
        value = getattr(price, key, None)
        if isinstance(value, TieredPrices):
            above = ", ".join(f"{t.price} from {t.start:,} prompt tokens" for t in value.tiers)
            notes.append(f"long prompts cost more ({field}: {above}); priced at the base rate")
            value = value.base
        if value is not None:
            out[field] = Decimal(value)
    return out


@lru_cache(maxsize=1024)
def context_window(provider: str, model: str) -> int | None:
    """The model's whole context window in tokens, where the package knows it."""
    found = _find(provider, model)
    return None if found is None else found[1].context_window


def _find(provider: str, model: str) -> tuple[Any, ModelInfo] | None:
    """The package's provider and model entry for `model` at one of lowtide's providers."""
    provider_id = PROVIDER_IDS.get(provider)
    if provider_id is None:
        return None
    try:
        return _snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None


def model_ids(provider: str) -> list[str]:
    """The package's model ids for one of lowtide's providers (for messages that list them)."""
    pid = PROVIDER_IDS.get(provider)
    found = next((p for p in _snapshot().providers if p.id == pid), None)
    return sorted(m.id for m in found.models) if found else []


def providers() -> list[str]:
    return [p.id for p in _snapshot().providers]


def _snapshot() -> Any:
    from genai_prices import data_snapshot

    return data_snapshot.get_snapshot()


__all__ = ["GenaiEntry", "as_day", "context_window", "lookup", "package", "providers"]
