"""Prices and cost arithmetic: the one place that knows what tokens cost.

    genai-prices (base catalog, dated; the
                  hosts' in host_prices.py) ─┐
    prices.yaml (shipped: derived tiers,     │
                 self-hosted entries) ───────┤
    $LOWTIDE_PRICES / --prices ──────────────┴─► load_catalog() ─► Catalog.explain(provider, model, day)
    route, route_options ─► billing_of() ─► Billing(provider, tier, cache-write TTL)
    Usage × Billing × Catalog ─► attempt_cost() ─► Cost(usd, realtime_usd)
    Outcome ─► is_billed()

Costs come from the provider's own usage figures (DESIGN invariant 6), in USD as `Decimal`.
Each provider counts differently, and each rule is written out once, in `token_usd`:

- OpenAI (and OpenAI-compatible servers): `input_tokens` (prompt_tokens) INCLUDES the
  cached tokens; `cached_input_tokens` is the part of it billed at the cached rate.
  `output_tokens` (completion_tokens) includes the reasoning tokens.
- Anthropic: `input_tokens` EXCLUDES cache reads (`cached_input_tokens`) and cache writes
  (`cache_write_tokens`); the three are billed separately, writes at 1.25x input for the
  5-minute TTL and 2x for the 1-hour one. `output_tokens` includes thinking tokens.

Hosts of open models (Groq, Together, Novita, Doubleword: `openai-compatible-batch`'s
profiles) bill by OpenAI's rule. Their batch tier is genai-prices' where it has one, else
their card's flat discount (`card_discounts`), else a price file's; otherwise unknown,
with a note that says how to add it.

`reasoning_tokens` is therefore never added: it is already inside `output_tokens`.
A model the catalog does not know has an unknown cost (`Cost.usd is None`), never a guess.

Where a price comes from, in order: an entry of the user's price file (whole, by name or
alias); else genai-prices at the request's date (core/genai_source.py); a tier the package
has no price for on that date (its batch history starts late 2026, for example) is derived
from that date's real-time price by the provider's documented discount (prices.yaml
`derived`, with its source), and is otherwise not offered. `lowtide prices MODEL` shows it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date as Date
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lowtide.core import genai_source
from lowtide.core.cards import CARDS, card_name
from lowtide.core.errors import InputError
from lowtide.core.host_prices import HOSTS
from lowtide.core.types import Usage
from lowtide.core.yamlfile import parse_mapping, read_text, validate

PRICES_ENV = "LOWTIDE_PRICES"
PROVIDERS = ("openai", "anthropic", "google")
# Every price list: the three providers' and the open-model hosts' (core/host_prices.py);
# a model's provider is guessed among PROVIDERS only (a host serves others' models).
PRICE_LISTS = PROVIDERS + HOSTS
PriceList = Literal["openai", "anthropic", "google", "groq", "together", "novita", "doubleword", "mistral", "openrouter", "azure",
                    "aws"]
ZERO = Decimal(0)
MILLION = Decimal(1_000_000)
HOUR = Decimal(3600)


class Tier(StrEnum):
    REALTIME = "realtime"
    FLEX = "flex"
    PRIORITY = "priority"  # OpenAI's and Anthropic's faster, dearer real-time tier
    BATCH = "batch"
    SELF_HOSTED = "self_hosted"
    FREE = "free"


PROVIDER_TIERS = (Tier.REALTIME, Tier.BATCH, Tier.FLEX, Tier.PRIORITY)  # tiers a provider's price list has

# ---- the catalog file ------------------------------------------------------------------

Money = Annotated[Decimal, Field(ge=0)]
Rate = Annotated[Decimal, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierPrices(_Strict):
    """USD per million tokens. A price left out costs what `input` costs."""

    input: Money
    output: Money
    cached_input: Money | None = None
    cache_write_5m: Money | None = None
    cache_write_1h: Money | None = None


class ModelPrices(_Strict):
    realtime: TierPrices
    batch: TierPrices | None = None
    flex: TierPrices | None = None
    priority: TierPrices | None = None
    aliases: list[str] = Field(default_factory=list)
    note: str | None = None

    def tier_named(self, tier: str) -> TierPrices | None:
        return self.tier(Tier(tier))

    def tier(self, tier: Tier) -> TierPrices | None:
        return {Tier.REALTIME: self.realtime, Tier.BATCH: self.batch, Tier.FLEX: self.flex, Tier.PRIORITY: self.priority}.get(tier)


class SelfHosted(_Strict):
    """A model on your own hardware: the GPU's hourly rate and the server's measured
    throughput over all requests in flight (continuous batching)."""

    gpu_hourly_usd: Money
    input_tokens_per_second: Rate | None = None
    output_tokens_per_second: Rate | None = None
    note: str | None = None

    def seconds(self, usage: Usage) -> Decimal | None:
        """Server time the tokens take; cached prompt tokens are not computed again (tokens
        written to a cache are: an estimate's, priced on a self-hosted route)."""
        if self.input_tokens_per_second is None or self.output_tokens_per_second is None:
            return None
        prefill = max(usage.input_tokens - usage.cached_input_tokens, 0) + usage.cache_write_tokens
        return prefill / self.input_tokens_per_second + usage.output_tokens / self.output_tokens_per_second


class DerivedTier(_Strict):
    """A tier genai-prices has no price for on a request's date, as a fraction of that
    date's real-time prices (every figure, cache prices included), with its source.
    `where: offered` derives it only for models the package lists that tier for at all."""

    factor: Annotated[Decimal, Field(gt=0, le=10)]
    source: str
    where: Literal["always", "offered"] = "always"


class PriceFile(_Strict):
    date: Date | None = None
    source: str | None = None
    openai: dict[str, ModelPrices] = Field(default_factory=dict)
    anthropic: dict[str, ModelPrices] = Field(default_factory=dict)
    google: dict[str, ModelPrices] = Field(default_factory=dict)  # Gemini API
    # hosts of open models (openai-compatible-batch's profiles), by the host's own model id
    groq: dict[str, ModelPrices] = Field(default_factory=dict)
    together: dict[str, ModelPrices] = Field(default_factory=dict)
    novita: dict[str, ModelPrices] = Field(default_factory=dict)
    doubleword: dict[str, ModelPrices] = Field(default_factory=dict)
    # clouds and brokers with batch routes, by their own model ids (Bedrock's anthropic.claude-…)
    mistral: dict[str, ModelPrices] = Field(default_factory=dict)
    openrouter: dict[str, ModelPrices] = Field(default_factory=dict)
    azure: dict[str, ModelPrices] = Field(default_factory=dict)
    aws: dict[str, ModelPrices] = Field(default_factory=dict)
    self_hosted: dict[str, SelfHosted] = Field(default_factory=dict)
    derived: dict[PriceList, dict[Literal["batch", "flex", "priority"], DerivedTier]] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PriceLookup:
    """What applies to one model on one day, and where each tier's figures come from."""

    provider: str
    model: str  # as asked
    name: str  # the entry found: the price file's name, or genai-prices' model id
    day: Date
    prices: ModelPrices
    origins: Mapping[str, str]  # tier -> where its prices come from (offered tiers only)
    not_offered: tuple[str, ...] = ()


_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True, slots=True)
class Catalog:
    """The shipped prices with the user's file merged over them (see `load_catalog`)."""

    date: Date | None
    source: str
    overrides: tuple[str, ...]  # files merged over the shipped catalog
    models: Mapping[str, Mapping[str, ModelPrices]]  # provider -> name -> prices
    self_hosted: Mapping[str, SelfHosted]
    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # provider -> alias -> name
    derived: Mapping[str, Mapping[str, DerivedTier]] = field(default_factory=dict)  # provider -> tier -> rule

    def lookup(self, provider: str, model: str, at: Date | datetime | float | None = None) -> tuple[str, ModelPrices] | None:
        """The prices of `model` at `provider` on the request's date `at` (today if None)."""
        found = self.explain(provider, model, at)
        return None if found is None else (found.name, found.prices)

    def explain(self, provider: str, model: str, at: Date | datetime | float | None = None) -> PriceLookup | None:
        """`lookup`, with where each tier comes from (see the module doc for the order)."""
        day = genai_source.as_day(at)
        own = self._own(provider, model)
        if own is not None:
            name, entry = own
            where = f"price file {self.overrides[-1]}" if self.overrides else "lowtide/core/prices.yaml"
            origins = {t.value: f"{where}: {provider}.{name}.{t.value}" for t in PROVIDER_TIERS if entry.tier(t) is not None}
            missing = tuple(t.value for t in PROVIDER_TIERS if entry.tier(t) is None)
            return PriceLookup(provider, model, name, day, entry, origins, missing)
        rules = {**card_discounts().get(provider, {}), **self.derived.get(provider, {})}  # a file's rule wins
        return _from_genai(provider, model, day, rules)

    def _own(self, provider: str, model: str) -> tuple[str, ModelPrices] | None:
        """An entry of a price file for `model`: by name or alias (case-insensitive), then
        again without a trailing snapshot date (`-2024-07-18`, `-20250514`) or `-latest`."""
        names = self.models.get(provider, {})
        aliases = self.aliases.get(provider, {})
        wanted = model.strip().lower()
        for candidate in dict.fromkeys((wanted, _SNAPSHOT.sub("", wanted))):
            name = candidate if candidate in names else aliases.get(candidate)
            if name is not None:
                return name, names[name]
        return None

    def provider_of(self, model: str) -> str | None:
        return next((p for p in PROVIDERS if self.lookup(p, model)), None)

    def self_hosted_for(self, model: str) -> tuple[str, SelfHosted] | None:
        wanted = model.strip().lower()
        for candidate in dict.fromkeys((wanted, _SNAPSHOT.sub("", wanted))):
            if candidate in self.self_hosted:
                return candidate, self.self_hosted[candidate]
        return None

    def known_models(self, provider: str) -> list[str]:
        """Every model name this catalog prices for `provider`: the price files' and genai-prices'."""
        listed = genai_source.model_ids(provider)
        return sorted(set(self.models.get(provider, {})) | set(listed))

    def describe(self) -> str:
        shipped = f"{genai_source.package()}, tiers it lacks derived by lowtide's catalog of {self.date or 'unknown date'}"
        return shipped + "".join(f", overridden by {f}" for f in self.overrides)


def _from_genai(provider: str, model: str, day: Date, rules: Mapping[str, DerivedTier]) -> PriceLookup | None:
    entry = genai_source.lookup(provider, model.strip(), day)
    realtime = (entry.tiers["realtime"] or {}) if entry is not None else {}
    if entry is not None and "output" not in realtime and "input" in realtime and "embedding" in entry.name.lower():
        realtime = realtime | {"output": Decimal(0)}  # an embedding model bills input tokens only: it has no output
    if entry is None or not {"input", "output"} <= set(realtime):
        return None  # unknown, or priced in units lowtide does not bill by (images, audio)
    source = f"{genai_source.package()} ({entry.provider_id} {entry.name}, prices of {day})"
    tiers: dict[str, TierPrices] = {"realtime": TierPrices(**realtime)}
    origins = {"realtime": source}
    for tier in ("batch", "flex", "priority"):
        fields = entry.tiers[tier]
        rule = rules.get(tier)
        if fields is not None:
            tiers[tier], origins[tier] = TierPrices(**fields), source
        elif rule is not None and (rule.where == "always" or tier in entry.offered):
            tiers[tier] = TierPrices(**{k: v * rule.factor for k, v in realtime.items()})
            origins[tier] = f"derived: {rule.factor:%} of real time (lowtide/core/prices.yaml derived.{provider}.{tier}; {rule.source})"
    prices = ModelPrices(**tiers, note=entry.note)
    missing = tuple(t for t in ("batch", "flex", "priority") if t not in tiers)
    return PriceLookup(provider, model, entry.name, day, prices, origins, missing)


def _merge(files: list[tuple[str | None, PriceFile]]) -> Catalog:
    """Entries of later files replace entries of the same name (tiers and aliases included)."""
    models: dict[str, dict[str, ModelPrices]] = {p: {} for p in PRICE_LISTS}
    self_hosted: dict[str, SelfHosted] = {}
    derived: dict[str, dict[str, DerivedTier]] = {}
    for _, f in files:
        for provider in PRICE_LISTS:
            models[provider].update({k.lower(): v for k, v in getattr(f, provider).items()})
        self_hosted.update({k.lower(): v for k, v in f.self_hosted.items()})
        for provider, rules in f.derived.items():
            derived.setdefault(provider, {}).update(rules)
    aliases = {
        p: {a.lower(): name for name, entry in entries.items() for a in entry.aliases if a.lower() not in entries}
        for p, entries in models.items()
    }
    shipped = files[0][1]
    return Catalog(
        date=shipped.date,
        source=shipped.source or "",
        overrides=tuple(name for name, _ in files[1:] if name),
        models=models,
        self_hosted=self_hosted,
        aliases=aliases,
        derived=derived,
    )


@lru_cache(maxsize=1)
def card_discounts() -> dict[str, dict[str, DerivedTier]]:
    """A host's batch tier where genai-prices has none: its card's discount (core/cards.py),
    where the provider states one flat share of the real-time price; a price file's
    `derived` wins. A host whose discount is per model or not confirmed derives nothing."""
    out: dict[str, dict[str, DerivedTier]] = {}
    for card in CARDS.values():
        d = card.discount
        if card.billing in HOSTS and d is not None and d.factor is not None and "discount.factor" not in card.unconfirmed:
            out[card.billing] = {"batch": DerivedTier(factor=d.factor, source=f"{d.source} (the {card.name} card)")}
    return out


@lru_cache(maxsize=1)
def _shipped() -> PriceFile:
    text = resources.files("lowtide.core").joinpath("prices.yaml").read_text(encoding="utf-8")
    return parse_price_file(text, "lowtide/core/prices.yaml")


@lru_cache(maxsize=8)
def _load(path: str | None, _mtime: int) -> Catalog:
    files: list[tuple[str | None, PriceFile]] = [(None, _shipped())]
    if path:
        files.append((path, read_price_file(path)))
    return _merge(files)


def load_catalog(prices: str | Path | None = None) -> Catalog:
    """The shipped catalog with `prices` (else the file $LOWTIDE_PRICES names) merged over
    it. Cached per file and modification time, so the ingest path may call it per attempt."""
    path = str(prices) if prices else os.environ.get(PRICES_ENV) or None
    mtime = 0
    if path:
        try:
            mtime = Path(path).stat().st_mtime_ns
        except OSError as err:
            where = "--prices" if prices else f"${PRICES_ENV}"
            raise InputError(f"{path}: cannot read the price file ({err.strerror or err}); fix {where}") from None
    return _load(path, mtime)


def read_price_file(path: str | Path) -> PriceFile:
    return parse_price_file(read_text(Path(path), "price file", InputError), str(path))


def parse_price_file(text: str, where: str) -> PriceFile:
    """Validate a price file; every problem names the file, line and key, and the fix."""
    not_a_mapping = f"a price file is a YAML mapping with keys {', '.join(PriceFile.model_fields)}"
    data, lines = parse_mapping(text, where, not_a_mapping, InputError, empty_ok=True)
    return validate(PriceFile, data, where, "price file", lines, InputError, _price_hint)


def _price_hint(loc: tuple[str, ...]) -> str:
    if loc and loc[-1] in TierPrices.model_fields:
        return "; give USD per million tokens as a number, e.g. 2.50"
    if loc and loc[-1] in SelfHosted.model_fields and loc[-1] != "note":
        return "; give a number (USD per hour, or tokens per second)"
    return ""


# ---- routes to tiers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Billing:
    """How a route bills: the provider's price list, the tier, the cache-write TTL."""

    provider: str | None  # "openai", "anthropic"; None for self-hosted and free routes
    tier: Tier
    cache_write_ttl: Literal["5m", "1h"] = "5m"


# route -> (price list, tier): each route's card (core/cards.py).
_ROUTES: dict[str, tuple[str | None, Tier]] = {name: (card.billing, Tier(card.tier)) for name, card in CARDS.items()}


def billing_of(route: str, route_options: Mapping[str, Any] | None = None) -> Billing | None:
    """The tier a route bills at; None for a route lowtide has no price rule for (a plugin).

    `openai` with `route_options.service_tier: flex` (or `priority`) bills at that tier,
    until a response says otherwise (`Outcome.tier`, engine/ledger.py). Anthropic routes with
    `cache_prefix: true` write their cache with the 1-hour TTL (what anthropic-batch sends)."""
    options = route_options or {}
    route = card_name(route, options)  # a profile's card: `openai-compatible-batch:groq`
    if route not in _ROUTES:
        return None
    provider, tier = _ROUTES[route]
    if route in ("openai", "gemini") and options.get("service_tier") in (Tier.FLEX, Tier.PRIORITY):
        tier = Tier(options["service_tier"])
    ttl: Literal["5m", "1h"] = "1h" if provider == "anthropic" and options.get("cache_prefix") else "5m"
    return Billing(provider, tier, ttl)


# ---- arithmetic ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cost:
    """What one attempt (or a sum of them) cost, beside the same tokens at real-time prices.

    `usd` None: unknown (an unknown model or route, or a missing throughput); `note` says why.
    For self-hosted and free routes the real-time equivalent is the cost itself."""

    usd: Decimal | None
    realtime_usd: Decimal | None
    tier: Tier | None
    billed: bool = True
    entry: str | None = None  # the catalog entry the price came from
    note: str = ""

    @property
    def known(self) -> bool:
        return self.usd is not None

    @property
    def saving_usd(self) -> Decimal | None:
        if self.usd is None or self.realtime_usd is None:
            return None
        return self.realtime_usd - self.usd


def token_usd(provider: str, usage: Usage, prices: TierPrices, cache_write_ttl: str = "5m") -> Decimal:
    """USD for `usage` at `prices`, by the provider's rule (see the module doc)."""
    cached_rate = prices.input if prices.cached_input is None else prices.cached_input
    write_rate = prices.cache_write_1h if cache_write_ttl == "1h" else prices.cache_write_5m
    write_rate = prices.input if write_rate is None else write_rate
    if provider == "anthropic":  # input excludes cache reads and writes
        uncached = usage.input_tokens
    else:  # OpenAI: prompt_tokens includes cached_tokens
        uncached = max(usage.input_tokens - usage.cached_input_tokens, 0)
    total = (
        uncached * prices.input
        + usage.cached_input_tokens * cached_rate
        + usage.cache_write_tokens * write_rate
        + usage.output_tokens * prices.output  # reasoning tokens are inside output_tokens
    )
    return total / MILLION


def self_hosted_usd(usage: Usage, entry: SelfHosted) -> Decimal | None:
    """GPU time at the hourly rate; None when the throughput is not known (and the rate is not 0)."""
    if entry.gpu_hourly_usd == 0:
        return ZERO
    seconds = entry.seconds(usage)
    return None if seconds is None else entry.gpu_hourly_usd * seconds / HOUR


def attempt_cost(
    usage: Usage,
    model: str,
    route: str,
    route_options: Mapping[str, Any] | None = None,
    *,
    billed: bool = True,
    catalog: Catalog | None = None,
    at: Date | datetime | float | None = None,
    cache_write_ttl: Literal["5m", "1h"] | None = None,
) -> Cost:
    """The cost of one attempt's `usage` on `route` at the tier it used, and its real-time
    equivalent, at the prices of the request's date `at` (today if None). `billed` False
    (see `is_billed`) costs nothing. `cache_write_ttl` prices the cache writes at that TTL
    where the requests asked for it themselves (a budget's estimate); else the route's."""
    billing = billing_of(route, route_options)
    if billing is not None and cache_write_ttl is not None:
        billing = Billing(billing.provider, billing.tier, cache_write_ttl)
    if billing is None:
        return Cost(None, None, None, billed, note=f'no price rule for route "{route}"')
    if not billed:
        return Cost(ZERO, ZERO, billing.tier, False, note="not billed")
    if billing.tier is Tier.FREE:
        return Cost(ZERO, ZERO, Tier.FREE, note=f"{route} is not a model: free")
    catalog = catalog or load_catalog()
    if billing.tier is Tier.SELF_HOSTED:
        found = catalog.self_hosted_for(model)
        if found is None:
            return Cost(None, None, Tier.SELF_HOSTED, note=f'no self_hosted price for "{model}"; add one to a price file (docs/costs.md)')
        name, hosted = found
        usd = self_hosted_usd(usage, hosted)
        note = hosted.note or ("" if usd is not None else f"self_hosted.{name} has no throughput; add input_ and output_tokens_per_second")
        return Cost(usd, usd, Tier.SELF_HOSTED, entry=name, note=note)
    if billing.provider is None:  # DigitalOcean's: no price list anywhere, and a price file cannot name one
        return Cost(None, None, billing.tier, note=f"{route} has no price list (no price source lowtide reads lists its models)")
    if billing.provider not in PRICE_LISTS:  # Azure's, OpenRouter's, …: no price list here, never a guess
        return Cost(
            None, None, billing.tier,
            note=f'no {billing.provider} prices: lowtide prices {", ".join(PRICE_LISTS)} models, so "{model}" '
            f"on {route} has no estimate (its share of the real-time price: `lowtide routes {card_name(route, route_options)}`)",
        )  # fmt: skip
    found_model = catalog.lookup(billing.provider, model, at)
    if found_model is None:
        return Cost(
            None, None, billing.tier,
            note=f'{billing.provider} model "{model}" is not in the price catalog; add it under `{billing.provider}:` '
            "in a price file (docs/costs.md)",
        )  # fmt: skip
    name, entry = found_model
    realtime = token_usd(billing.provider, usage, entry.realtime, billing.cache_write_ttl)
    prices = entry.tier(billing.tier)
    if prices is None and billing.provider in HOSTS:
        return Cost(None, realtime, billing.tier, entry=name,
                    note=f"no {billing.tier} price for {name} at {billing.provider}: genai-prices has none and the "
                    f"{card_name(route, route_options)} card states no flat discount; add `{billing.tier}:` prices for "
                    f"{name} under `{billing.provider}:` in a price file (docs/costs.md)")  # fmt: skip
    if prices is None:
        return Cost(None, realtime, billing.tier, entry=name, note=f"the catalog has no {billing.tier} price for {name} (not offered)")
    usd = token_usd(billing.provider, usage, prices, billing.cache_write_ttl)
    return Cost(usd, realtime, billing.tier, entry=name, note=entry.note or "")


# ---- what is billed --------------------------------------------------------------------

# Failures no provider bills, whatever usage they carry: the request expired or was
# cancelled in its batch, was refused by a rate limit, or never left lowtide.
NOT_BILLED = frozenset(
    {
        "batch_expired", "expired", "batch_cancelled", "cancelled", "canceled",
        "rate_limit_exceeded", "rate_limit_error", "http_429",
        "batch_rejected", "deadline_passed", "no_result",
    }
)  # fmt: skip


def is_billed(ok: bool, error_code: str | None, usage: Usage) -> bool:
    """Whether a provider bills an attempt:

    1. a succeeded attempt is billed (at its usage, which may be 0);
    2. an attempt failed with a code in `NOT_BILLED` is not;
    3. any other failure is billed when the provider reported tokens for it (it processed
       the request: e.g. an answer that then failed the schema), and not otherwise
       (Anthropic's `errored` results and HTTP errors carry no usage).
    """
    if ok:
        return True
    if error_code in NOT_BILLED:
        return False
    return (usage.input_tokens + usage.cached_input_tokens + usage.cache_write_tokens + usage.output_tokens) > 0


def outcome_cost(outcome: Any, model: str, route: str, route_options: Mapping[str, Any] | None = None, *, catalog: Catalog | None = None) -> Cost:
    """`attempt_cost` of an `Outcome` (or anything with ok, error_code and usage)."""
    billed = is_billed(outcome.ok, outcome.error_code, outcome.usage)
    return attempt_cost(outcome.usage, model, route, route_options, billed=billed, catalog=catalog)
