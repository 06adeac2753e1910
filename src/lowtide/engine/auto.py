"""`route: auto`: the cheapest candidate route expected to finish the job's work in time.

    for each candidate:  cost      its tier's prices × the job's counted tokens (engine/counting.py)
                         turnaround p95 measured in this store, per route and model, else a
                                    documented prior (engine/turnaround.py)
    fits: p95 ≤ max_wait (a duration from submission, or the time left to the deadline)
    take: the cheapest that fits (ties: the faster); refuse when none fits, naming the fastest
    the chain:    when the take is a batch route, each faster candidate that fits, slowest
                  first (one a faster candidate is no dearer than is left out; a batch
                  route once): the tiers work moves up as the end of max_wait nears, each
                  taking over its p95 before that end (engine/tiers.py). The end of
                  max_wait becomes the job's deadline. A spec's own `fallback:` is kept
                  instead (engine/fallback.py): it has no chain.

Several providers of one open model (`openai-compatible-batch` with `profile: groq`,
`together`, …: the job's `model` is each host's id for it) are candidates like any other:
each is priced from its host's price list and waited for by its own card's prior or its own
measurements, and `quotes` says for each why it was taken or not (`lowtide estimate`).

Decided before anything is stored (`lowtide submit` and `lowtide estimate` alike), recorded
as a `route_choice` event with its reason, and kept: submitting the same spec again keeps
the choice rather than changing the route of work in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from pydantic import ValidationError
from sqlalchemy import Connection, select

from lowtide.core.auto_spec import AUTO, CandidateSpec, TierSpec, duration_text, route_label
from lowtide.core.cards import CARDS, card_name, check_limit, profiles_of
from lowtide.core.clock import Clock
from lowtide.core.errors import RouteError, SpecError
from lowtide.core.pricing import Catalog, Cost, Tier, attempt_cost, billing_of, load_catalog
from lowtide.core.spec import JobSpec, stored_spec
from lowtide.core.tokens import counter_for
from lowtide.core.types import Usage
from lowtide.engine import turnaround
from lowtide.store.db import Store
from lowtide.store.schema import jobs

SAMPLE_ROWS = 1000  # rows rendered and counted to price the candidates; the rest extrapolated
MIN_MARGIN = 60.0


@dataclass(frozen=True, slots=True)
class Option:
    """One candidate, evaluated for this job's work."""

    index: int
    candidate: CandidateSpec
    kind: str  # batch | direct
    cost: Cost
    took: turnaround.Turnaround

    @property
    def label(self) -> str:
        return label_of(self.candidate)

    def fits(self, wait: float) -> bool:
        return self.took.p95 is not None and self.took.p95 <= wait


@dataclass(frozen=True, slots=True)
class Choice:
    option: Option
    faster: Option | None  # the next tier up (the chain's second), if any
    wait: float
    reason: str
    options: tuple[Option, ...]
    chain: tuple[Option, ...] = ()  # the chosen option, then each tier up, slowest first

    def margins(self) -> list[float]:
        """Seconds before the end of max_wait at which each tier takes over (0 for the
        first): its p95 for the job's work, at least MIN_MARGIN, at most half of max_wait."""
        return [0.0] + [max(MIN_MARGIN, min(o.took.p95 or MIN_MARGIN, self.wait / 2)) for o in self.chain[1:]]


def label_of(candidate: CandidateSpec) -> str:
    """A candidate as reasons name it: its profile's card where it has one
    (`openai-compatible-batch:groq`), and its service tier (`openai (flex)`)."""
    return route_label(card_name(candidate.route, candidate.route_options), candidate.route_options)


@dataclass(frozen=True, slots=True)
class Quote:
    """One candidate as `lowtide estimate` quotes it: price, expected wait, and why it was
    taken or not."""

    option: Option
    verdict: str


def quotes(options: list[Option], wait: float, choice: Choice | None) -> list[Quote]:
    """Each candidate with the reason it was chosen, is a tier up, or was not taken (no price,
    no known turnaround, too slow, dearer, or slower at the same price)."""
    return [Quote(o, _verdict(o, wait, choice)) for o in options]


def _verdict(o: Option, wait: float, choice: Choice | None) -> str:
    if o.cost.usd is None:
        return f"no price: {o.cost.note}"
    if o.took.p95 is None:
        return f"no known turnaround: {o.took.basis}"
    if not o.fits(wait):
        return f"too slow: p95 {duration_text(o.took.p95)} is over max_wait {duration_text(wait)}"
    if choice is None:
        return "fits; but auto took none (see its refusal)"
    best = choice.option
    if o is best:
        rivals = [q for q in choice.options if q is not o and q.fits(wait) and q.cost.usd is not None]
        return "chosen: the cheapest that fits" if rivals else "chosen: the only one priced that fits"
    if o in choice.chain:
        return f"tier {choice.chain.index(o)} up: takes over as the end of max_wait nears"
    assert best.cost.usd is not None
    if o.cost.usd > best.cost.usd:
        return f"not taken: {money(o.cost.usd - best.cost.usd)} dearer than {best.label}"
    if o.cost.usd == best.cost.usd and (o.took.p95 or 0) >= (best.took.p95 or 0):
        return f"not taken: as cheap as {best.label}, and not faster"
    return "not taken: a faster tier up is no dearer"


def kind_of(route: str, options: dict) -> str:
    billing = billing_of(route, options)
    return "batch" if (billing and billing.tier is Tier.BATCH) or route.endswith("-batch") else "direct"


def evaluate(conn: Connection | None, spec: JobSpec, usage: Usage, requests: int, catalog: Catalog) -> list[Option]:
    assert spec.auto is not None
    out = []
    for i, c in enumerate(spec.auto.candidates):
        kind = kind_of(c.route, c.route_options)
        cost = attempt_cost(usage, spec.model, c.route, c.route_options, catalog=catalog)
        took = turnaround.expected(conn, c.route, c.route_options, spec.model, kind, requests)
        out.append(Option(i, c, kind, cost, took))
    return out


def money(usd: Decimal | None) -> str:
    if usd is None:
        return "unknown"
    return f"${usd:,.2f}" if usd >= 1 else (f"${usd:.4f}".rstrip("0").rstrip(".") if usd else "$0")


def choose(options: list[Option], wait: float, where: str = "job spec", *, strict_prices: bool = True) -> Choice:
    """The cheapest option that fits `wait` seconds; SpecError naming the fix when none can."""
    unpriced = [o for o in options if o.cost.usd is None]
    if strict_prices and unpriced:
        o = unpriced[0]
        how = "or drop the candidate" if "docs/costs.md" in o.cost.note else "add one to a price file (docs/costs.md) or drop the candidate"
        raise SpecError(f"{where}: auto.candidates[{o.index}] ({o.label}) has no price: {o.cost.note}; {how}")
    fitting = [o for o in options if o.fits(wait) and o.cost.usd is not None]
    if not fitting:
        timed = [o for o in options if o.took.p95 is not None]
        if not timed:
            raise SpecError(f"{where}: auto.max_wait: no candidate has a known turnaround ({options[0].took.basis}); add a route lowtide knows")
        fastest = min(timed, key=lambda o: o.took.p95 or 0)
        raise SpecError(
            f"{where}: auto.max_wait {duration_text(wait)}: no candidate is expected to finish in time; the fastest, "
            f"{fastest.label}, takes {duration_text(fastest.took.p95 or 0)} (p95, {fastest.took.basis}); "
            "raise max_wait, or add a faster candidate"
        )
    best = min(fitting, key=lambda o: (o.cost.usd, o.took.p95))
    chain = tiers_up(best, fitting) if best.kind == "batch" else [best]
    up = chain[1] if len(chain) > 1 else None
    others = " / ".join(
        f"{o.label} {money(o.cost.usd)}" + ("" if o.fits(wait) else " (too slow)") for o in options if o is not best
    )
    reason = (
        f"{best.label}: p95 {duration_text(best.took.p95 or 0)} fits {duration_text(wait)} ({best.took.basis}), "
        f"{money(best.cost.usd)}" + (f" vs {others}" if others else "")
    )
    if len(chain) == 2:
        reason += f"; {chain[1].label} takes over as the end of max_wait nears"
    elif len(chain) > 2:
        reason += f"; {', then '.join(o.label for o in chain[1:])} take over, tier by tier, as the end of max_wait nears"
    return Choice(best, up, wait, reason, tuple(options), tuple(chain))


def tiers_up(best: Option, fitting: list[Option]) -> list[Option]:
    """`best`, then each fitting candidate faster than the tier before it, slowest first.
    Left out: one a faster candidate is no dearer than (it would only cost more), and a
    second tier on a batch route already in the chain (its batches are told apart by route)."""

    def p95(o: Option) -> float:
        return o.took.p95 or 0.0

    chain = [best]
    for o in sorted((o for o in fitting if p95(o) < p95(best)), key=lambda o: (-p95(o), o.cost.usd)):
        dominated = any(p95(q) < p95(o) and (q.cost.usd or 0) <= (o.cost.usd or 0) for q in fitting)
        same_batch = o.kind == "batch" and any(t.candidate.route == o.candidate.route for t in chain)
        if not dominated and not same_batch and p95(o) < p95(chain[-1]):
            chain.append(o)
    return chain


def wait_of(spec: JobSpec, now: float) -> float:
    assert spec.auto is not None
    seconds = spec.auto.wait_seconds()
    if seconds is None:
        assert spec.deadline is not None
        return spec.deadline.timestamp() - now
    if spec.deadline is not None:
        return min(seconds, spec.deadline.timestamp() - now)
    return seconds


def resolve(store: Store, spec: JobSpec, clock: Clock, where: str = "job spec") -> tuple[JobSpec, Choice | None]:
    """The job's spec with `route: auto` decided (see the module doc); None as the choice
    when an earlier submission decided it already."""
    assert spec.route == AUTO and spec.auto is not None
    with store.begin() as conn:
        stored = conn.execute(select(jobs.c.spec).where(jobs.c.name == spec.name)).scalar_one_or_none()
        if stored is not None:
            before = stored_spec(stored)
            # Decided with the same auto section and fallback: the choice is kept. The spec's
            # deadline is its own now (a chain's, held against the end of max_wait); a new
            # fallback decides again (a chain is only made without one).
            decided = before.auto is not None and before.auto.undecided() == spec.auto and before.route != AUTO
            if decided and before.fallback == spec.fallback:
                kept = {k: getattr(before, k) for k in ("route", "route_options", "auto")}
                return _readable(spec.model_copy(update=kept | {"deadline": _deadline(before, spec)}), where), None
    check_candidates(spec, where)
    now = clock.now()
    wait = wait_of(spec, now)
    if wait <= 0:
        raise SpecError(f"{where}: auto.max_wait: the deadline {spec.deadline} has passed; set a later one")
    first = spec.auto.candidates[0]
    counted_spec = spec.model_copy(update={"route": first.route, "route_options": first.route_options})
    from lowtide.engine.counting import count_rows  # the loader imports this module
    from lowtide.engine.watermarks import stored_watermark

    catalog = load_catalog()
    billing = billing_of(first.route, first.route_options)
    counter = counter_for(spec.model, (billing.provider if billing else None) or catalog.provider_of(spec.model))
    count = count_rows(counted_spec, where, counter, SAMPLE_ROWS, None, routes_checked=True, after=stored_watermark(store, spec))
    with store.begin() as conn:
        options = evaluate(conn, spec, count.usage, count.rows, catalog)
    choice = choose(options, wait, where)
    chosen = choice.option.candidate.route
    if spec.fallback is not None and spec.fallback.route == chosen:
        # The run would be on the fallback's own route: a spec lowtide could not read back.
        raise SpecError(
            f"{where}: auto chose {label_of(choice.option.candidate)} ({choice.reason}); `fallback.route` is {chosen} too, "
            "and a fallback must differ from the route: drop the fallback (a chain of candidates moves work up by itself), "
            "or name another route there"
        )
    return _readable(effective(spec, choice, now), where), choice


def _readable(spec: JobSpec, where: str) -> JobSpec:
    """The decided spec as the store will read it back (a copy with the choice is not
    validated): a spec every later command could not read is refused before it is stored."""
    try:
        return JobSpec.model_validate_json(spec.model_dump_json())
    except ValidationError as err:
        raise SpecError(f"{where}: as decided ({spec.route}): {err.errors()[0]['msg']}") from None


def _deadline(before: JobSpec, spec: JobSpec) -> datetime | None:
    """The deadline of a kept choice: the spec's own; for a chain, no later than the end of
    max_wait it was decided with (a store from before `ends_at` kept the deadline it decided)."""
    assert before.auto is not None
    if not before.chain or before.auto.max_wait == "deadline":
        return spec.deadline
    end = before.auto.ends_at
    if end is None:
        return before.deadline if spec.deadline is None or before.deadline is None else min(before.deadline, spec.deadline)
    end_at = datetime.fromtimestamp(end, tz=UTC)
    return end_at if spec.deadline is None or end_at < spec.deadline else spec.deadline


def check_candidates(spec: JobSpec, where: str) -> None:
    """What a candidate's options say against its card, before it is priced: a profile the
    route does not have (it would be priced as the route without one), and a limit looser
    than the profile's. The chosen route is made and checked whole when the job is loaded."""
    assert spec.auto is not None
    for i, c in enumerate(spec.auto.candidates):
        profile, known = c.route_options.get("profile"), profiles_of(c.route)
        if profile is not None and known and profile not in known:
            raise SpecError(f"{where}: auto.candidates[{i}] ({c.route}): unknown route_options.profile {profile!r}; "
                            f"known: {', '.join(known)}")  # fmt: skip
        card = CARDS.get(card_name(c.route, c.route_options))
        for key in ("max_requests", "max_bytes"):
            value = c.route_options.get(key)
            if card is not None and isinstance(value, int) and not isinstance(value, bool):
                try:
                    check_limit(card.name, key, value, getattr(card.limits, key), key.removeprefix("max_"))
                except RouteError as err:
                    raise SpecError(f"{where}: auto.candidates[{i}]: {err}") from None


def effective(spec: JobSpec, choice: Choice, now: float) -> JobSpec:
    """The spec the engine runs: the chosen route; with tiers up (and no fallback of the
    spec's own), the chain in `auto.chain` and the end of max_wait as its deadline."""
    c = choice.option.candidate
    assert spec.auto is not None
    auto = spec.auto.model_copy(update={"chosen": c.route})
    update: dict = {"route": c.route, "route_options": c.route_options, "auto": auto}
    if spec.fallback is None and len(choice.chain) > 1:
        # The end of max_wait becomes the deadline the tiers work to. Only here: on a direct
        # route (or with the spec's own fallback) max_wait never fails a request.
        end = datetime.fromtimestamp(now + choice.wait, tz=UTC)
        update["deadline"] = end if spec.deadline is None or end < spec.deadline else spec.deadline
        chain = [
            TierSpec(route=o.candidate.route, route_options=o.candidate.route_options, margin=margin)
            for o, margin in zip(choice.chain, choice.margins(), strict=True)
        ]
        seconds = spec.auto.wait_seconds()  # None: max_wait is the job's deadline, which is then the end
        update["auto"] = auto.model_copy(update={"chain": chain, "ends_at": None if seconds is None else now + seconds})
    return spec.model_copy(update=update)
