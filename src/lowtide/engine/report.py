"""What the ledger says: tokens, cost, real-time equivalent and savings, summed over
attempts and grouped by route, model, tag or job (`lowtide report`).

Definitions (docs/costs.md "lowtide report"):

- input tokens: every prompt token, cache reads and writes included. OpenAI counts them so
  already; Anthropic reports cache reads and writes apart from `input_tokens`, and they are
  added. Routes without a price rule (plugins) are taken to count as OpenAI does.
- cache hit share: cached input (cache reads) / input tokens.
- cost: the sum of the attempts whose cost is known. Attempts with an unknown cost are
  counted apart (with their models) and never as 0; real-time equivalent and savings cover
  the attempts with a known cost only, so that they compare like with like.
- succeeded saving: real time − cost over the succeeded attempts alone (`--json`'s
  `succeeded_saving_usd` and `_percent`): what the answers saved. A failed attempt's spend,
  however discounted, bought nothing; the dashboard shows this as its saving.
- stale: results that arrived after their request had moved on (to a retry or the fallback
  route). They are paid for, so they are in the cost, and counted apart.
- repair: attempts sent with an invalid answer's repair turns (store `repair_sends`; the
  spec's `repair: false` turns them off). In the cost, and counted apart with their cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, and_, func, select

from lowtide.core.pricing import billing_of
from lowtide.core.spec import stored_spec
from lowtide.store.db import Store
from lowtide.store.money import from_pico
from lowtide.store.queries import get_job
from lowtide.store.schema import attempts, jobs, repair_sends

GROUPINGS = ("route", "model", "tag", "job")
NO_TAG = "(no tag)"
NOT_RECORDED = "(not recorded)"  # attempts recorded before lowtide kept their model


@dataclass(slots=True)
class Figures:
    group: str
    attempts: int = 0
    failures: int = 0
    billed_failures: int = 0
    stale: int = 0
    stale_picousd: int = 0
    repairs: int = 0  # repair attempts, and their known cost
    repair_picousd: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost_picousd: int = 0  # attempts with a known cost
    realtime_picousd: int = 0  # the same attempts at real-time prices
    succeeded_cost_picousd: int = 0  # the succeeded attempts among them (the dashboard's saving)
    succeeded_realtime_picousd: int = 0
    unknown: int = 0  # attempts with an unknown cost
    unknown_models: set[str] = field(default_factory=set)
    tiers: set[str] = field(default_factory=set)

    @property
    def usd(self) -> Decimal:
        return from_pico(self.cost_picousd)

    @property
    def realtime_usd(self) -> Decimal:
        return from_pico(self.realtime_picousd)

    @property
    def stale_usd(self) -> Decimal:
        return from_pico(self.stale_picousd)

    @property
    def repair_usd(self) -> Decimal:
        return from_pico(self.repair_picousd)

    @property
    def saving_usd(self) -> Decimal:
        return from_pico(self.realtime_picousd - self.cost_picousd)

    @property
    def saving_percent(self) -> Decimal | None:
        if not self.realtime_picousd:
            return None
        return (Decimal(self.realtime_picousd - self.cost_picousd) * 100 / self.realtime_picousd).quantize(Decimal("0.1"))

    @property
    def succeeded_saving_usd(self) -> Decimal:
        """What the succeeded attempts saved against real time: a failed attempt's spend,
        however discounted, bought nothing, and is never shown as a saving (the dashboard)."""
        return from_pico(self.succeeded_realtime_picousd - self.succeeded_cost_picousd)

    @property
    def succeeded_saving_percent(self) -> Decimal | None:
        if not self.succeeded_realtime_picousd:
            return None
        saved = self.succeeded_realtime_picousd - self.succeeded_cost_picousd
        return (Decimal(saved) * 100 / self.succeeded_realtime_picousd).quantize(Decimal("0.1"))

    @property
    def cache_hit_share(self) -> Decimal | None:
        if not self.input_tokens:
            return None
        return (Decimal(self.cached_input_tokens) / self.input_tokens).quantize(Decimal("0.0001"))

    def add(self, row: Any, prompt_tokens: int) -> None:
        n = row.n
        self.attempts += n
        if not row.ok:
            self.failures += n
            self.billed_failures += n if row.billed else 0
        known = row.cost is not None
        if row.applied is False:
            self.stale += n
            self.stale_picousd += int(row.cost or 0)
        if row.repair:
            self.repairs += n
            self.repair_picousd += int(row.cost or 0)
        self.input_tokens += prompt_tokens
        self.cached_input_tokens += int(row.cached)
        self.cache_write_tokens += int(row.writes)
        self.output_tokens += int(row.output)
        self.reasoning_tokens += int(row.reasoning)
        if row.tier:
            self.tiers.add(row.tier)
        if known:
            self.cost_picousd += int(row.cost)
            self.realtime_picousd += int(row.realtime or 0)
            if row.ok:
                self.succeeded_cost_picousd += int(row.cost)
                self.succeeded_realtime_picousd += int(row.realtime or 0)
        elif row.billed is not False:  # an unbilled attempt costs nothing, priced or not
            self.unknown += n
            self.unknown_models.add(row.model or NOT_RECORDED)

    def as_dict(self) -> dict[str, Any]:
        def money(d: Decimal | None) -> str | None:
            return None if d is None else str(d)

        pct, share = self.saving_percent, self.cache_hit_share
        return {
            "group": self.group, "tiers": sorted(self.tiers),
            "attempts": self.attempts, "failures": self.failures, "billed_failures": self.billed_failures,
            "stale_attempts": self.stale, "stale_usd": money(self.stale_usd),
            "repair_attempts": self.repairs, "repair_usd": money(self.repair_usd),
            "input_tokens": self.input_tokens, "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens, "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost_usd": money(self.usd), "realtime_usd": money(self.realtime_usd),
            "saving_usd": money(self.saving_usd), "saving_percent": None if pct is None else str(pct),
            "succeeded_saving_usd": money(self.succeeded_saving_usd),
            "succeeded_saving_percent": None if self.succeeded_saving_percent is None else str(self.succeeded_saving_percent),
            "cache_hit_share": None if share is None else str(share),
            "unknown_cost_attempts": self.unknown, "unknown_cost_models": sorted(self.unknown_models),
        }  # fmt: skip


@dataclass(slots=True)
class CostReport:
    by: str | None
    groups: list[Figures]
    total: Figures
    job: str | None = None
    since: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "by": self.by, "job": self.job, "since": self.since, "currency": "USD",
            "groups": [g.as_dict() for g in self.groups], "total": self.total.as_dict(),
        }  # fmt: skip


def cost_report(store: Store, *, job: str | None = None, since: float | None = None, by: str | None = None) -> CostReport:
    """Sum the ledger's attempts (of one job, from a time on) by `by` (see GROUPINGS)."""
    if by is not None and by not in GROUPINGS:
        raise ValueError(f"--by {by}: use one of {', '.join(GROUPINGS)}")
    with store.read() as conn:
        where = []
        if job is not None:
            where.append(attempts.c.job_id == get_job(conn, job).id)
        if since is not None:
            where.append(attempts.c.at >= since)
        rows = ledger_rows(conn, *where)
        specs = {r.id: (r.name, r.spec) for r in conn.execute(select(jobs.c.id, jobs.c.name, jobs.c.spec))}
    return summed(rows, by, specs, job, since)


def ledger_rows(conn: Connection, *where: Any) -> list[Any]:
    """The attempts that `where` selects, summed per job and per what tells their figures
    apart (route, model, tier, outcome, billing, repair, a known cost): what `summed` adds up."""
    a = attempts.c
    repair = repair_sends.c.request_id.is_not(None).label("repair")
    keys = (a.job_id, a.route, a.model, a.tier, a.ok, a.applied, a.billed, repair, a.cost_picousd.is_(None))
    stmt = select(
        *keys[:-1],
        func.count().label("n"),
        func.coalesce(func.sum(a.input_tokens), 0).label("input"),
        func.coalesce(func.sum(a.cached_input_tokens), 0).label("cached"),
        func.coalesce(func.sum(a.cache_write_tokens), 0).label("writes"),
        func.coalesce(func.sum(a.output_tokens), 0).label("output"),
        func.coalesce(func.sum(a.reasoning_tokens), 0).label("reasoning"),
        func.sum(a.cost_picousd).label("cost"),  # NULL for the group of unknown costs
        func.sum(a.realtime_picousd).label("realtime"),
    ).select_from(
        attempts.outerjoin(repair_sends, and_(repair_sends.c.request_id == a.request_id, repair_sends.c.dispatch_id == a.dispatch_id))
    ).where(*where).group_by(*keys)
    return conn.execute(stmt).all()


def summed(rows: Iterable[Any], by: str | None, specs: dict[int, tuple[str, Any]], job: str | None = None,
           since: float | None = None) -> CostReport:  # fmt: skip
    """A report of `ledger_rows` grouped `by`; `specs`: job id -> (name, stored spec)."""
    names = {jid: name for jid, (name, _) in specs.items()}
    tags = {jid: stored_spec(spec).tags for jid, (_, spec) in specs.items()} if by == "tag" else {}
    total = Figures("total")
    groups: dict[str, Figures] = {}
    for row in rows:
        prompt = _prompt_tokens(row)
        total.add(row, prompt)
        for key in _group_keys(row, by, names, tags):
            groups.setdefault(key, Figures(key)).add(row, prompt)
    return CostReport(by, sorted(groups.values(), key=lambda g: g.group), total, job, since)


def _prompt_tokens(row: Any) -> int:
    """Every prompt token of the row's attempts, by its provider's way of counting."""
    billing = billing_of(row.route)
    if billing is not None and billing.provider == "anthropic":  # input excludes cache reads and writes
        return int(row.input) + int(row.cached) + int(row.writes)
    return int(row.input)  # OpenAI and OpenAI-compatible: prompt_tokens includes cached ones


def _group_keys(row: Any, by: str | None, names: dict[int, str], tags: dict[int, list[str]]) -> Iterable[str]:
    if by is None:
        return ()
    if by == "route":
        return (row.route,)
    if by == "model":
        return (row.model or NOT_RECORDED,)
    if by == "job":
        return (names.get(row.job_id, str(row.job_id)),)
    return tags.get(row.job_id) or (NO_TAG,)
