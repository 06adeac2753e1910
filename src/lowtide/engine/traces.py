"""A job as a trace, from the store alone: one span for the job, one per batch (dispatch),
one per attempt, with the times the store recorded (docs/traces.md).

    job tickets                      jobs.created_at → finished_at
    ├── batch openai-batch           dispatches.created_at → ended_at (events: submitted, phases, cut)
    │   ├── chat gpt-4o-mini         attempts: dispatch submitted (or created) → result recorded (`at`)
    │   └── …
    └── direct openai …

Plain data only: nothing here imports OpenTelemetry (engine/otlp.py turns these records
into OTLP). Names follow the OpenTelemetry GenAI semantic conventions on the attempt spans
(the inference calls) and `lowtide.*` elsewhere; the usage and cost of a job and a batch
are `lowtide.*` sums, never `gen_ai.usage.*`, so a backend that adds up `gen_ai.usage.*`
over a trace counts each token once.

Ids are derived from the job and its rows (BLAKE2b), so exporting a job twice gives the
same trace and span ids. Records come in bounded pages: a job of any size is read a page
at a time, each in its own short read transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy import and_, case, func, select

from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GEMINI,
    MESSAGES,
    MODERATIONS,
    RESPONSES,
)
from lowtide.core.pricing import billing_of
from lowtide.core.spec import stored_spec
from lowtide.core.states import DispatchState, RequestState
from lowtide.engine.report import cost_report
from lowtide.store.db import Store
from lowtide.store.money import PICO
from lowtide.store.queries import get_job
from lowtide.store.schema import attempts, dispatch_phases, dispatches, repair_sends, requests

PAGE = 2000  # records read (and handed on) at a time

# OpenTelemetry GenAI semantic conventions (checked against opentelemetry-semantic-conventions
# by tests/engine/test_traces.py).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
ERROR_TYPE = "error.type"

# The operation an endpoint's request is (gen_ai.operation.name's well-known values; a
# moderation has none, and is named as the convention allows for others).
OPERATIONS = {
    CHAT: "chat", RESPONSES: "chat", MESSAGES: "chat", COMPLETIONS: "text_completion",
    GEMINI: "generate_content", EMBEDDINGS: "embeddings", MODERATIONS: "moderation",
}  # fmt: skip
# lowtide's pricing provider → gen_ai.provider.name. Routes without one (echo, local,
# openai-compatible, plugins) are named by the route itself.
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "google": "gcp.gemini"}

Attributes = dict[str, str | int | float | bool]


@dataclass(slots=True)
class SpanRecord:
    """One span, as plain data. Times are the store's (seconds since the epoch); `error`
    set means status ERROR with that description, None means the status is left unset."""

    trace_id: int  # 128 bits
    span_id: int  # 64 bits
    parent_id: int | None
    name: str
    start: float
    end: float
    kind: str = "internal"  # or "client": an inference call
    attributes: Attributes = field(default_factory=dict)
    events: list[tuple[str, float, Attributes]] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class JobTrace:
    """The job's span and a way to read the rest in pages: `pages()` yields lists of at
    most `page` records (the batches', then the attempts'), reading the store as it goes."""

    store: Store
    job_id: int
    root: SpanRecord
    now: float
    page: int = PAGE

    @property
    def trace_id(self) -> int:
        return self.root.trace_id

    def pages(self) -> Iterator[list[SpanRecord]]:
        yield from _dispatch_pages(self)
        yield from _attempt_pages(self)


def job_trace(store: Store, job_name: str, *, now: float, page: int = PAGE) -> JobTrace:
    """The trace of one job: its span (with the job's totals, as `lowtide report` counts
    them), and its batches and attempts to read page by page. `now` ends the spans of a job
    or batch that has not ended yet."""
    with store.read() as conn:
        job = get_job(conn, job_name)
        counts = dict(
            conn.execute(
                select(requests.c.state, func.count()).where(requests.c.job_id == job.id).group_by(requests.c.state)
            ).all()
        )
    spec = stored_spec(job.spec)
    total = cost_report(store, job=job_name).total
    trace_id = _id(128, "job", job.id, job.name, repr(job.created_at))
    attrs: Attributes = {
        "lowtide.job.name": job.name,
        "lowtide.job.state": job.state,
        "lowtide.route": job.route,
        "lowtide.model": spec.model,
        "lowtide.endpoint": spec.request_endpoint,
        "lowtide.requests": sum(counts.values()),
        **{f"lowtide.requests.{s.value}": int(counts.get(s.value, 0)) for s in RequestState},
        "lowtide.attempts": total.attempts,
        "lowtide.attempts.failed": total.failures,
        "lowtide.attempts.stale": total.stale,
        "lowtide.usage.input_tokens": total.input_tokens,
        "lowtide.usage.output_tokens": total.output_tokens,
        "lowtide.usage.cache_read.input_tokens": total.cached_input_tokens,
        "lowtide.usage.cache_creation.input_tokens": total.cache_write_tokens,
        "lowtide.usage.reasoning.output_tokens": total.reasoning_tokens,
        **_money("lowtide.cost", total.cost_picousd),
        **_money("lowtide.realtime_cost", total.realtime_picousd),
        "lowtide.cost.unknown_attempts": total.unknown,
    }
    if total.tiers:
        attrs["lowtide.tiers"] = ",".join(sorted(total.tiers))
    if spec.tags:
        attrs["lowtide.tags"] = ",".join(spec.tags)
    failed = int(counts.get(RequestState.FAILED.value, 0))
    root = SpanRecord(
        trace_id, _span_id(trace_id, "job"), None, f"job {job.name}", job.created_at,
        job.finished_at if job.finished_at is not None else max(now, job.created_at), attributes=attrs,
        error=f"{failed} of {sum(counts.values())} requests failed" if failed else None,
    )  # fmt: skip
    if job.error:
        root.error = job.error[:500]
    return JobTrace(store, job.id, root, now, page)


def prompt_tokens(route: str, input_tokens: int, cached: int, writes: int) -> int:
    """Every prompt token, by the provider's way of counting (engine/report.py's rule, which
    gen_ai.usage.input_tokens also asks for: cached tokens included)."""
    if _counts_cache_apart(route):  # Anthropic: input excludes cache reads and writes
        return input_tokens + cached + writes
    return input_tokens


@cache
def _counts_cache_apart(route: str) -> bool:
    billing = billing_of(route)
    return billing is not None and billing.provider == "anthropic"


@cache
def provider_name(route: str) -> str:
    billing = billing_of(route)
    return PROVIDERS.get(billing.provider or "", route) if billing is not None else route


# Batches -------------------------------------------------------------------------------
def _dispatch_pages(trace: JobTrace) -> Iterator[list[SpanRecord]]:
    d, a = dispatches.c, attempts.c
    after = 0
    while True:
        with trace.store.read() as conn:
            rows = conn.execute(
                select(dispatches).where(d.job_id == trace.job_id, d.id > after).order_by(d.id).limit(trace.page)
            ).all()
            if not rows:
                return
            ids = [r.id for r in rows]
            sums: dict[int, list[Any]] = {}
            for s in conn.execute(
                select(
                    a.dispatch_id, a.route, func.count().label("n"),
                    func.sum(case((a.ok.is_(False), 1), else_=0)).label("failed"),
                    func.coalesce(func.sum(a.input_tokens), 0).label("input"),
                    func.coalesce(func.sum(a.cached_input_tokens), 0).label("cached"),
                    func.coalesce(func.sum(a.cache_write_tokens), 0).label("writes"),
                    func.coalesce(func.sum(a.output_tokens), 0).label("output"),
                    func.sum(a.cost_picousd).label("cost"),
                    func.sum(a.realtime_picousd).label("realtime"),
                    func.count(a.cost_picousd).label("priced"),
                ).where(a.dispatch_id.in_(ids)).group_by(a.dispatch_id, a.route)
            ):  # fmt: skip
                acc = sums.setdefault(s.dispatch_id, [0, 0, 0, 0, 0, 0, 0, 0])
                acc[0] += s.n
                acc[1] += int(s.failed or 0)
                acc[2] += prompt_tokens(s.route, int(s.input), int(s.cached), int(s.writes))
                acc[3] += int(s.output)
                acc[4] += int(s.cost or 0)
                acc[5] += int(s.realtime or 0)
                acc[6] += s.n - s.priced
                acc[7] += int(s.cached)
            phases: dict[int, list[tuple[str, float]]] = {}
            for p in conn.execute(
                select(dispatch_phases.c.dispatch_id, dispatch_phases.c.phase, dispatch_phases.c.at)
                .where(dispatch_phases.c.dispatch_id.in_(ids))
                .order_by(dispatch_phases.c.dispatch_id, dispatch_phases.c.id)
            ):
                phases.setdefault(p.dispatch_id, []).append((p.phase, p.at))
        yield [_dispatch_span(trace, r, sums.get(r.id), phases.get(r.id, [])) for r in rows]
        after = ids[-1]


def _dispatch_span(trace: JobTrace, row: Any, sums: list[Any] | None, phases: list[tuple[str, float]]) -> SpanRecord:
    n, failed, prompt, output, cost, realtime, unknown, cached = sums or [0] * 8
    billing = billing_of(row.route)
    attrs: Attributes = {
        "lowtide.batch.kind": row.kind,
        "lowtide.batch.state": row.state,
        "lowtide.batch.size": row.size,
        "lowtide.route": row.route,
        "lowtide.attempts": n,
        "lowtide.attempts.failed": failed,
        "lowtide.usage.input_tokens": prompt,
        "lowtide.usage.output_tokens": output,
        "lowtide.usage.cache_read.input_tokens": cached,
        **_money("lowtide.cost", cost),
        **_money("lowtide.realtime_cost", realtime),
        "lowtide.cost.unknown_attempts": unknown,
    }
    tier = row.tier or (billing.tier.value if billing is not None else None)
    for key, value in (("lowtide.batch.id", row.provider_id), ("lowtide.batch.phase", row.phase),
                       ("lowtide.model", row.model), ("lowtide.tier", tier)):  # fmt: skip
        if value is not None:
            attrs[key] = value
    events: list[tuple[str, float, Attributes]] = []
    if row.submitted_at is not None:
        events.append(("submitted", row.submitted_at, {"lowtide.batch.id": row.provider_id or ""}))
    events += [("phase", at, {"lowtide.batch.phase": phase}) for phase, at in phases]
    if row.cut_at is not None:
        events.append(("deadline cut-over", row.cut_at, {}))
    events.sort(key=lambda e: e[1])
    end = row.ended_at if row.ended_at is not None else max(trace.now, row.created_at)
    error = None
    if row.state == DispatchState.FAILED.value:
        error = (row.error or "the batch failed")[:500]
    return SpanRecord(
        trace.trace_id, _span_id(trace.trace_id, "dispatch", row.id), trace.root.span_id,
        f"{row.kind} {row.route}", row.created_at, end, attributes=attrs, events=events, error=error,
    )  # fmt: skip


# Attempts ------------------------------------------------------------------------------
def _attempt_pages(trace: JobTrace) -> Iterator[list[SpanRecord]]:
    a, r, d = attempts.c, requests.c, dispatches.c
    operation = OPERATIONS.get(trace.root.attributes["lowtide.endpoint"], "chat")  # type: ignore[arg-type]
    repair = repair_sends.c.request_id.is_not(None).label("repair")
    stmt = (
        select(
            a.id, a.dispatch_id, a.route, a.ok, a.applied, a.error_code, a.error_message, a.input_tokens,
            a.cached_input_tokens, a.cache_write_tokens, a.output_tokens, a.reasoning_tokens, a.at, a.model, a.tier,
            a.billed, a.cost_picousd, a.realtime_picousd, r.custom_id, r.model.label("request_model"),
            func.coalesce(d.submitted_at, d.created_at).label("sent_at"), repair,
        )
        .select_from(
            attempts.join(requests, r.id == a.request_id)
            .outerjoin(dispatches, d.id == a.dispatch_id)
            .outerjoin(repair_sends, and_(repair_sends.c.request_id == a.request_id, repair_sends.c.dispatch_id == a.dispatch_id))
        )
        .where(a.job_id == trace.job_id)
        .order_by(a.id)
        .limit(trace.page)
    )  # fmt: skip
    parents: dict[int, int] = {}  # dispatch id → its span's id
    after = 0
    while True:
        with trace.store.read() as conn:
            rows = conn.execute(stmt.where(a.id > after)).all()
        if not rows:
            return
        yield [_attempt_span(trace, row, operation, parents) for row in rows]
        after = rows[-1].id


def _attempt_span(trace: JobTrace, row: Any, operation: str, parents: dict[int, int]) -> SpanRecord:
    model = row.model or row.request_model or ""
    attrs: Attributes = {
        OPERATION: operation,
        PROVIDER: provider_name(row.route),
        REQUEST_MODEL: model,
        INPUT_TOKENS: prompt_tokens(row.route, row.input_tokens, row.cached_input_tokens, row.cache_write_tokens),
        OUTPUT_TOKENS: row.output_tokens,
        "lowtide.custom_id": row.custom_id,
        "lowtide.route": row.route,
        "lowtide.ok": bool(row.ok),
        "lowtide.applied": bool(row.applied),  # False: a stale result (paid for, not used)
        "lowtide.repair": bool(row.repair),
    }
    for key, value in ((CACHE_READ_TOKENS, row.cached_input_tokens), (CACHE_WRITE_TOKENS, row.cache_write_tokens),
                       (REASONING_TOKENS, row.reasoning_tokens)):  # fmt: skip
        if value:
            attrs[key] = value
    if row.tier is not None:
        attrs["lowtide.tier"] = row.tier
    if row.billed is not None:
        attrs["lowtide.billed"] = bool(row.billed)
    if row.cost_picousd is not None:
        attrs.update(_money("lowtide.cost", row.cost_picousd))
    if row.realtime_picousd is not None:
        attrs.update(_money("lowtide.realtime_cost", row.realtime_picousd))
    error = None
    if not row.ok:
        code = row.error_code or "unknown"
        attrs[ERROR_TYPE] = code
        if row.error_message:
            attrs["lowtide.error.message"] = row.error_message[:1000]
        error = f"{code}: {row.error_message}"[:500] if row.error_message else code
    start = row.sent_at if row.sent_at is not None else row.at
    parent = parents.get(row.dispatch_id)
    if parent is None:
        parent = parents[row.dispatch_id] = _span_id(trace.trace_id, "dispatch", row.dispatch_id)
    return SpanRecord(
        trace.trace_id, _span_id(trace.trace_id, "attempt", row.id), parent,
        f"{operation} {model}".strip(), min(start, row.at), row.at, kind="client", attributes=attrs, error=error,
    )  # fmt: skip


# Ids and money -------------------------------------------------------------------------
def _id(bits: int, *parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, ("lowtide", *parts))).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1  # an all-zero id is invalid in OTLP


def _span_id(trace_id: int, *parts: object) -> int:
    return _id(64, f"{trace_id:032x}", *parts)


def _money(prefix: str, picousd: int) -> Attributes:
    """Exact picodollars (they add up to `lowtide report`'s figures) and USD as a float
    (for a backend's sums and charts)."""
    return {f"{prefix}.picousd": int(picousd), f"{prefix}.usd": int(picousd) / 10**PICO}

