"""Pricing attempts as they are recorded: the ledger is the sum of attempts (DESIGN
invariant 6).

Each attempt is priced from the provider's own usage figures, at the tier its route billed
(`lowtide.core.pricing`), beside the real-time equivalent, and stored in picodollars
(`lowtide.store.money`). A cost that cannot be known — an unknown model or route, a price
file that does not load — is stored as NULL and an event names why; it is never a guess.

Ingest is hot (100,000 outcomes on `echo` in seconds), so the catalog is loaded once per
file version and what a (route, route_options, model) bills at is looked up once; only the
arithmetic runs per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, select

from lowtide.core.errors import InputError
from lowtide.core.genai_source import as_day
from lowtide.core.pricing import (
    Catalog,
    SelfHosted,
    Tier,
    TierPrices,
    billing_of,
    is_billed,
    load_catalog,
    self_hosted_usd,
    token_usd,
)
from lowtide.core.types import Outcome, Usage
from lowtide.store.money import to_pico
from lowtide.store.queries import add_event
from lowtide.store.schema import events

ZERO = Decimal(0)
# Tiers a provider may report serving a request at (Outcome.tier).
PROVIDER_TIERS = frozenset({Tier.REALTIME.value, Tier.FLEX.value, Tier.PRIORITY.value, Tier.BATCH.value})
MAX_MEMO = 20_000  # remembered attempt costs (about 5 MB at most)


@dataclass(frozen=True, slots=True)
class Rate:
    """What attempts of one model on one route bill at, resolved against the catalog once.
    Mirrors `pricing.attempt_cost` branch for branch (a test holds them equal)."""

    tier: Tier | None  # None: a route lowtide has no price rule for
    provider: str | None = None
    prices: TierPrices | None = None  # the tier's prices; None with `realtime`: tier not offered
    realtime: TierPrices | None = None
    hosted: SelfHosted | None = None
    cache_write_ttl: str = "5m"
    free: bool = False
    note: str = ""  # why a cost is unknown; empty when it is known

    def usd(self, usage: Usage, billed: bool) -> tuple[Decimal | None, Decimal | None]:
        """(cost, real-time equivalent) of one attempt; None where unknown."""
        if self.tier is None:
            return None, None
        if not billed or self.free:
            return ZERO, ZERO
        if self.hosted is not None:
            usd = self_hosted_usd(usage, self.hosted)
            return usd, usd
        if self.realtime is None:
            return None, None
        realtime = token_usd(self.provider or "", usage, self.realtime, self.cache_write_ttl)
        if self.prices is None:
            return None, realtime
        return token_usd(self.provider or "", usage, self.prices, self.cache_write_ttl), realtime


class Ledger:
    """Prices outcomes with one catalog. `problem` is set when the price file did not load:
    then every cost that needs the catalog is unknown."""

    def __init__(self, catalog: Catalog | None, problem: str | None = None):
        self.catalog = catalog
        self.problem = problem
        self._rates: dict[tuple, Rate] = {}
        # Costs by (rate, billed, token counts): attempts of one job repeat the same few
        # counts, and Decimal arithmetic costs more than the rest of ingesting an outcome.
        self._costs: dict[tuple, tuple[int | None, int | None]] = {}

    def rate(
        self, route: str, options: Mapping[str, Any] | None, model: str, reported: str | None = None, at: float | None = None
    ) -> Rate:
        """`reported`: the tier the provider said it served at (`Outcome.tier`); it wins
        over the one the route's options imply, on a route a provider bills. `at`: when the
        attempt ran (Unix seconds): prices are those of its date."""
        day = as_day(at)
        key = (route, repr(sorted((options or {}).items())), model, reported, day)
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= MAX_MEMO:
                self._rates.clear()
            rate = self._rates[key] = self._resolve(route, options, model, reported, day)
        return rate

    def _resolve(
        self, route: str, options: Mapping[str, Any] | None, model: str, reported: str | None = None, day: date | None = None
    ) -> Rate:
        billing = billing_of(route, options)
        if billing is None:
            return Rate(None, note=f'no price rule for route "{route}"')
        if reported in PROVIDER_TIERS and billing.provider is not None:
            billing = replace(billing, tier=Tier(reported))
        if billing.tier is Tier.FREE:
            return Rate(Tier.FREE, free=True)
        if self.catalog is None:
            return Rate(billing.tier, note=f"the price file did not load: {self.problem}")
        if billing.tier is Tier.SELF_HOSTED:
            found = self.catalog.self_hosted_for(model)
            if found is None:
                return Rate(billing.tier, note=f'no self_hosted price for "{model}"; add one to a price file (docs/costs.md)')
            name, hosted = found
            known = hosted.gpu_hourly_usd == 0 or hosted.seconds(Usage()) is not None
            note = "" if known else f"self_hosted.{name} has no throughput; add input_ and output_tokens_per_second"
            return Rate(billing.tier, hosted=hosted, note=note)
        if billing.provider is None:  # a provider with no price list anywhere (its card says why): booked unpriced
            return Rate(billing.tier, note=f'route "{route}" has no price list (`lowtide routes {route}`); its cost is not estimated')
        found_model = self.catalog.lookup(billing.provider, model, day)
        if found_model is None:
            note = f'{billing.provider} model "{model}" is not in the price catalog; add it to a price file (docs/costs.md)'
            return Rate(billing.tier, provider=billing.provider, note=note)
        name, entry = found_model
        prices = entry.tier(billing.tier)
        note = "" if prices is not None else f"the catalog has no {billing.tier} price for {name} (not offered)"
        return Rate(billing.tier, billing.provider, prices, entry.realtime, cache_write_ttl=billing.cache_write_ttl, note=note)

    def columns(self, outcome: Outcome, rate: Rate) -> tuple[bool, int | None, int | None]:
        """An attempt's `billed`, `cost_picousd` and `realtime_picousd`."""
        billed = is_billed(outcome.ok, outcome.error_code, outcome.usage)
        if rate.free or (not billed and rate.tier is not None):
            return billed, 0, 0  # the hot path of `echo`: no Decimal arithmetic
        u = outcome.usage
        key = (id(rate), billed, u.input_tokens, u.cached_input_tokens, u.cache_write_tokens, u.output_tokens, u.reasoning_tokens)
        costs = self._costs.get(key)
        if costs is None:
            if len(self._costs) >= MAX_MEMO:
                self._costs.clear()
            usd, realtime = rate.usd(u, billed)
            costs = self._costs[key] = (to_pico(usd), to_pico(realtime))
        return billed, *costs


_cached: Ledger | None = None


def current_ledger() -> Ledger:
    """A ledger over the catalog as it is now ($LOWTIDE_PRICES merged over the shipped
    prices); the same one, with its looked-up rates, while the file does not change."""
    global _cached
    try:
        catalog = load_catalog()
    except InputError as err:
        return Ledger(None, str(err))
    if _cached is None or _cached.catalog is not catalog:
        _cached = Ledger(catalog)
    return _cached


def note_once(conn: Connection, job_id: int, kind: str, message: str, now: float) -> None:
    """Add an event unless the job already has this very one (ingest runs chunk by chunk)."""
    seen = conn.execute(
        select(events.c.id).where(events.c.job_id == job_id, events.c.kind == kind, events.c.message == message).limit(1)
    ).first()
    if seen is None:
        add_event(conn, job_id, kind, message, now)
