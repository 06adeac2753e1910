"""The advisor: a job's cost curve, tier by tier, and which tier `route: auto` would take.

    real time             the provider's real-time route
    real time + cache     the same, with the shared prompt prefix read from the cache
    flex                  OpenAI's flex service tier (where the model has it)
    batch                 the provider's batch route
    batch + prompt cache  the same, with the prefix cached (Anthropic: 1-hour cache writes)
    self-hosted           the catalog's GPU-hour entry at its measured throughput

Each tier: the expected cost (the counted tokens at its prices) and the expected wait
(engine/turnaround.py: measured in the store where given, else the priors). Cached rows
assume every request but the first reads the shared prefix (the system prompt) from the
provider's cache, which the providers only do for prefixes of at least CACHE_MIN tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from lowtide.core.auto_spec import CandidateSpec
from lowtide.core.errors import SpecError
from lowtide.core.pricing import Catalog, Cost, attempt_cost
from lowtide.core.spec import JobSpec
from lowtide.core.types import Usage
from lowtide.engine import turnaround
from lowtide.engine.auto import Choice, Option, Quote, choose, evaluate, kind_of, quotes
from lowtide.engine.counting import Count

# Shortest prompt prefix a provider caches (OpenAI's prompt-caching guide: 1,024 tokens;
# Anthropic's: 1,024 for most models, more for some Haiku and Opus models: UNCONFIRMED per model).
CACHE_MIN = {"openai": 1024, "anthropic": 1024}

TIERS: dict[str, list[tuple[str, str, dict[str, Any], bool]]] = {  # provider -> (tier, route, options, cached)
    "openai": [
        ("real time", "openai", {}, False),
        ("real time + cache", "openai", {}, True),
        ("flex", "openai", {"service_tier": "flex"}, False),
        ("batch", "openai-batch", {}, False),
        ("batch + prompt cache", "openai-batch", {}, True),
    ],
    "anthropic": [
        ("real time", "anthropic", {}, False),
        ("real time + cache", "anthropic", {}, True),
        ("batch", "anthropic-batch", {}, False),
        ("batch + prompt cache", "anthropic-batch", {"cache_prefix": True}, True),
    ],
}


@dataclass(frozen=True, slots=True)
class Point:
    tier: str
    route: str
    options: dict[str, Any]
    cost: Cost
    took: turnaround.Turnaround
    note: str

    @property
    def candidate(self) -> CandidateSpec:
        return CandidateSpec(route=self.route, route_options=self.options)


def cached_usage(provider: str, usage: Usage, count: Count) -> tuple[Usage, str]:
    """`usage` with the shared prefix read from the cache by all requests but the first."""
    prefix, n = count.prefix_tokens, count.rows
    minimum = CACHE_MIN.get(provider, 1024)
    if prefix < minimum or n < 2:
        return usage, f"no cache: the shared prefix ({prefix:,} tokens) is under the {minimum:,}-token minimum"
    reads = prefix * (n - 1)
    note = f"{prefix:,}-token shared prefix read from the cache by {n - 1:,} requests"
    if provider == "anthropic":  # input excludes cache reads and writes; the first request writes
        return Usage(input_tokens=usage.input_tokens - reads - prefix, cached_input_tokens=reads,
                     cache_write_tokens=prefix, output_tokens=usage.output_tokens), note  # fmt: skip
    return Usage(input_tokens=usage.input_tokens, cached_input_tokens=reads, output_tokens=usage.output_tokens), note


def _unwritten(usage: Usage) -> Usage:
    """`usage` with the tokens its requests ask to write to a cache counted as plain input."""
    return Usage(input_tokens=usage.input_tokens + usage.cache_write_tokens, output_tokens=usage.output_tokens)


def curve(conn: Connection | None, spec: JobSpec, provider: str | None, count: Count, catalog: Catalog) -> list[Point]:
    usage = count.usage
    points = []
    for tier, route, options, cached in TIERS.get(provider or "", []):
        # A cached line models its own writes (the shared prefix); the others price what the
        # requests ask to write themselves at the longest TTL they ask for.
        used, note = cached_usage(provider or "", _unwritten(usage), count) if cached else (usage, "")
        ttl = None if cached else count.cache_write_ttl
        cost = attempt_cost(used, spec.model, route, options, catalog=catalog, cache_write_ttl=ttl if used.cache_write_tokens else None)
        took = turnaround.expected(conn, route, options, spec.model, kind_of(route, options), count.rows)
        points.append(Point(tier, route, options, cost, took, "; ".join(x for x in (note, cost.note) if x)))
    hosted_route = "local" if spec.route == "local" else "openai-compatible"
    cost = attempt_cost(usage, spec.model, hosted_route, {}, catalog=catalog)
    found = catalog.self_hosted_for(spec.model)
    seconds = found[1].seconds(usage) if found else None
    took = (
        turnaround.Turnaround(float(seconds), float(seconds), "the catalog's measured throughput") if seconds is not None
        else turnaround.Turnaround(None, None, "no measured throughput in the catalog (docs/costs.md)")
    )  # fmt: skip
    points.append(Point("self-hosted", hosted_route, {}, cost, took, cost.note))
    return points


def candidate_quotes(conn: Connection | None, spec: JobSpec, count: Count, catalog: Catalog, wait: float,
                     pick: Choice | str) -> list[Quote]:  # fmt: skip
    """An auto job's candidates, each quoted with its price, expected wait and why `pick` took
    it or not (none for a job without `auto:`)."""
    if spec.auto is None:
        return []
    options = pick.options if isinstance(pick, Choice) else tuple(evaluate(conn, spec, count.usage, count.rows, catalog))
    return quotes(list(options), wait, pick if isinstance(pick, Choice) else None)


def auto_pick(conn: Connection | None, spec: JobSpec, points: list[Point], count: Count, catalog: Catalog,
              wait: float) -> Choice | str:  # fmt: skip
    """What `route: auto` would take with `wait` seconds: among the spec's own candidates
    when it is an auto job, else among the curve's routes (not its cached variants). The
    refusal `submit` would give, as text, when none can."""
    if spec.auto is not None:
        options = evaluate(conn, spec, count.usage, count.rows, catalog)
    else:
        plain = [p for p in points if "cache" not in p.tier]
        options = [Option(i, p.candidate, kind_of(p.route, p.options), p.cost, p.took) for i, p in enumerate(plain)]
    try:
        return choose(options, wait, "auto", strict_prices=spec.auto is not None)
    except SpecError as err:
        return str(err)
