"""How long work takes on a route: measured in this store, per route and model, with
documented priors until there is enough data.

    batch routes   one batch's submit → end time (chunks run side by side, so a job's work
                   takes about one batch's time): p50 and p95 of the route's last batches
                   of the model that ended on their own (not cut by a deadline)
    direct routes  seconds per request, in effect (a dispatch's run time / its requests,
                   with all it runs at once): a job's work takes requests × that
    self-hosted    the catalog's measured throughput (core/pricing.py `SelfHosted`)

A route with profiles (`openai-compatible-batch`: Groq, Together, …) is measured per
profile: a Groq batch says nothing of how long Together takes. A dispatch's profile is its
job's (the job spec's options for that route: its own, or a tier's of its chain).

Measurements are kept per service tier too (a dispatch's `tier`: flex work on `openai` is
not read as real time's, nor the other way round). A route, model and tier with fewer than
MIN_SAMPLES measured dispatches use the route's PRIOR
(docs/routing.md says where each comes from); a route with neither is unknown.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sqlalchemy import Connection, select

from lowtide.core.auto_spec import duration_text
from lowtide.core.cards import CARDS, Prior, card_name, profiles_of
from lowtide.core.states import DispatchState
from lowtide.store.schema import dispatches, jobs

HISTORY = 50  # recent dispatches a turnaround is measured over
PROFILED_HISTORY = 10 * HISTORY  # read to find HISTORY of one profile among a route's dispatches
MIN_SAMPLES = 3


# Seconds: each route's card (core/cards.py) — for batch routes the providers' own
# statements; for direct ones a request's latency divided by the requests a route keeps in
# flight (16 by default), rounded up — and a service tier's own (`openai:flex`).
PRIORS: dict[str, Prior] = {
    **{name: card.turnaround for name, card in CARDS.items() if card.turnaround is not None},
    **{f"{name}:{tier}": prior for name, card in CARDS.items() for tier, prior in card.tier_turnaround.items()},
}


@dataclass(frozen=True, slots=True)
class Turnaround:
    """Expected seconds for a job's work of `requests` requests on one route."""

    p50: float | None
    p95: float | None
    basis: str  # "measured: 12 batches", "prior: …", or why unknown

    @property
    def known(self) -> bool:
        return self.p95 is not None

    def text(self) -> str:
        if self.p95 is None:
            return "unknown"
        return f"p50 {duration_text(self.p50 or 0)}, p95 {duration_text(self.p95)}"


def service_tier(options: dict) -> str | None:
    """The service tier route options ask for (flex, priority, …); None: the route's default."""
    tier = options.get("service_tier")
    return tier if isinstance(tier, str) else None


def prior_key(route: str, options: dict) -> str:
    tier = service_tier(options)
    if tier is not None and f"{route}:{tier}" in PRIORS:
        return f"{route}:{tier}"
    return card_name(route, options)  # a profile's own card: `openai-compatible-batch:groq`


def profile_of(spec_json: str, route: str) -> str | None:
    """The profile a job's work on `route` runs with: the spec's own options for it, or the
    first tier of its chain on that route."""
    spec = json.loads(spec_json)
    tiers = [{"route": spec.get("route"), "route_options": spec.get("route_options")}]
    tiers += ((spec.get("auto") or {}).get("chain") or [])
    for t in tiers:
        if t.get("route") == route:
            return (t.get("route_options") or {}).get("profile")
    return None


def measured(conn: Connection, route: str, model: str, kind: str, tier: str | None = None,
             options: dict | None = None) -> list[float]:  # fmt: skip
    """Seconds per batch (kind batch) or per request (kind direct) at `tier`, newest first;
    on a route with profiles, only the dispatches of `options`' profile."""
    profiled = bool(profiles_of(route))
    if kind == "batch":
        took = dispatches.c.ended_at - dispatches.c.submitted_at
        start = dispatches.c.submitted_at
    else:
        took = (dispatches.c.ended_at - dispatches.c.created_at) / dispatches.c.size
        start = dispatches.c.created_at
    query = select(took, jobs.c.spec).join(jobs, jobs.c.id == dispatches.c.job_id).where(
        dispatches.c.route == route, dispatches.c.model == model, dispatches.c.kind == kind,
        dispatches.c.tier.is_(None) if tier is None else dispatches.c.tier == tier,
        dispatches.c.state == DispatchState.ENDED.value, start.is_not(None), dispatches.c.cut_at.is_(None),
        dispatches.c.size > 0,
    ).order_by(dispatches.c.ended_at.desc()).limit(PROFILED_HISTORY if profiled else HISTORY)  # fmt: skip
    rows = conn.execute(query).all()
    if profiled:
        wanted = (options or {}).get("profile")
        rows = [r for r in rows if profile_of(r.spec, route) == wanted][:HISTORY]
    return [float(r[0]) for r in rows if r[0] is not None and r[0] >= 0]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def expected(conn: Connection | None, route: str, options: dict, model: str, kind: str, requests: int) -> Turnaround:
    """The turnaround of `requests` requests of `model` on `route` (see the module doc)."""
    scale = requests if kind == "direct" else 1
    what = "dispatches" if kind == "direct" else "batches"
    tier = service_tier(options) if kind == "direct" else None  # only direct dispatches keep a tier
    samples = measured(conn, route, model, kind, tier, options) if conn is not None else []
    if len(samples) >= MIN_SAMPLES:
        return Turnaround(percentile(samples, 0.5) * scale, percentile(samples, 0.95) * scale, f"measured: {len(samples)} {what}")
    key = prior_key(route, options)
    prior = PRIORS.get(key)
    if prior is None:
        return Turnaround(None, None, f"no {what} of {key} measured yet and no prior for it")
    scale = requests if prior.per_request else 1
    return Turnaround(prior.p50 * scale, prior.p95 * scale, f"prior: {prior.source}")
