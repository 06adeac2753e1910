"""Applying outcomes to requests: at most once per request, never from a stale dispatch.

Each outcome is matched by custom_id alone (DESIGN invariant 5). It becomes an attempt row
(with its usage, model, tier and cost, whether or not it is applied: a stale result is paid
for too) and, if the request is still in the dispatch the outcome came from, the request's
next state: succeeded, a retry, or failed. An attempt is recorded once per (request,
dispatch), so ingesting the same results again never counts a cost twice.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.core import fastjson
from lowtide.core.answers import tool_calls
from lowtide.core.native_schema import unwrap_choice
from lowtide.core.outputs import (
    ToolSchemas,
    tool_schemas,
)
from lowtide.core.states import JobState, RequestState
from lowtide.core.types import Outcome, Request
from lowtide.engine import fate
from lowtide.engine.answer_columns import plain_chat_record, plain_record
from lowtide.engine.context import JobContext
from lowtide.engine.ledger import Rate, current_ledger, note_once
from lowtide.store.bulk import among, executemany, fixed
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, requests
from lowtide.store.transitions import lock_job

DISPATCHED = RequestState.DISPATCHED.value
# Read from their class once: a member read from an Enum costs ~70 ns (Python 3.11), and each outcome is told by them.
SUCCEEDED, PENDING, CANCELLED = RequestState.SUCCEEDED, RequestState.PENDING, RequestState.CANCELLED
TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens")
# What an outcome writes on its request: a success only these (its error columns are
# cleared); any other outcome these and more (see `fate.after_outcome`). `plain_answer` goes
# with `response` wherever that is written (the export trusts one for the other).
SUCCEEDED_COLUMNS = ("output", "parsed", "response", "plain_answer", *TOKENS)
OTHER_COLUMNS = (*SUCCEEDED_COLUMNS, "error_code", "error_message", "not_before", "repair", "lane", "lane_reason", "lane_base_attempts")
ATTEMPT_COLUMNS = (
    "request_id", "ok", "applied", "error_code", "error_message", *TOKENS, "billed", "cost_picousd", "realtime_picousd",
    "model", "tier",
)  # fmt: skip


@dataclass(slots=True)
class IngestCounts:
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    stale: int = 0
    unknown: list[str] = field(default_factory=list)

    def add(self, other: IngestCounts) -> None:
        self.succeeded += other.succeeded
        self.retried += other.retried
        self.failed += other.failed
        self.cancelled += other.cancelled
        self.stale += other.stale
        self.unknown.extend(other.unknown)


def apply_outcomes(
    conn: Connection,
    job: JobContext,
    dispatch_id: int,
    route: str,
    outcomes: Sequence[Outcome],
    now: float,
    rng: random.Random,
    *,
    whole_dispatch: bool = False,
    lane: str | None = None,
    together: float = 0.0,
) -> IngestCounts:
    """`whole_dispatch`: the dispatch is small (a direct route's), so its requests are read
    by dispatch rather than looked up one custom_id at a time. `lane`: the dispatch's lane,
    where tiers of a chain share a route (priced at its options). `together`: retries are
    due on a grid of this many seconds (a batch route's: they share batches)."""
    counts = IngestCounts()
    if not outcomes:
        return counts
    # The job's state now, its row held (store/transitions.lock_job): a cancel that landed
    # since this tick read the job must decide, not the tick's copy (a retryable outcome
    # would be requeued in a cancelled job and stay pending for ever).
    state = JobState(lock_job(conn, job.id))
    current, seen = _lookup(conn, job.id, dispatch_id, outcomes, whole_dispatch)
    # An answer that is a tool call is checked against the tools its request declared, read
    # from the stored body for those answers only (any other answer costs a few lookups).
    # An answer the route wrote as text (`Outcome.written`) is one of text alone: no call.
    calls = {o.custom_id: c for o in outcomes if o.ok and o.written is None and o.response is not None and (c := tool_calls(o.response))}
    tools = _tools(conn, [current[cid].id for cid in calls if cid in current]) if calls else {}
    by_target: dict[RequestState, list[dict]] = {}
    attempt_rows = []
    spec = job.spec
    choices = spec.effective_choices
    ledger = current_ledger()  # the catalog, loaded once per price-file version
    options, lane_model = job.sent_as(route, lane)
    # (model, reported tier) -> its rate and the rate's tier as stored, looked up once
    rates: dict[tuple[str, str | None], tuple[Rate, str | None]] = {}
    unknown_costs: dict[str, str] = {}  # model -> why its cost is unknown
    for outcome in outcomes:
        req = current.get(outcome.custom_id)
        if req is None:
            counts.unknown.append(outcome.custom_id)
            continue
        if req.id in seen:  # the same line twice, or the same file ingested again
            continue
        seen.add(req.id)
        live = req.state == DISPATCHED and req.dispatch_id == dispatch_id
        u = outcome.usage
        # Priced as what was sent: the request's own model (a fallback lane's where it ran
        # there), at the tier the provider reports, else the route's. Every stored request has
        # its model (m008 filled it in for older rows from their payload).
        model = lane_model or req.model
        found = rates.get((model, outcome.tier))
        if found is None:
            rate = ledger.rate(route, options, model, outcome.tier, now)
            found = rates[(model, outcome.tier)] = (rate, rate.tier.value if rate.tier else None)
        rate, tier = found
        billed, cost, realtime = ledger.columns(outcome, rate)
        if cost is None:
            unknown_costs[model] = rate.note
        attempt = {
            "request_id": req.id, "ok": outcome.ok, "applied": live, "error_code": outcome.error_code,
            "error_message": outcome.error_message, "input_tokens": u.input_tokens,
            "cached_input_tokens": u.cached_input_tokens, "cache_write_tokens": u.cache_write_tokens,
            "output_tokens": u.output_tokens, "reasoning_tokens": u.reasoning_tokens,
            "billed": billed, "cost_picousd": cost, "realtime_picousd": realtime,
            "model": model, "tier": tier,
        }  # fmt: skip
        attempt_rows.append(attempt)
        if not live:
            counts.stale += 1
            continue
        written = outcome.written
        if written is None:
            response = None if outcome.response is None else fastjson.dumps(outcome.response)
            plain = plain_record(outcome.response)
        else:  # the route wrote it (core/types.py `WrittenOutcome`): one chat choice of text alone
            response, plain = written, plain_chat_record(outcome.chat_finish)
        row = {
            "_id": req.id, "output": unwrap_choice(outcome.text) if choices else outcome.text, "parsed": None, "input_tokens": u.input_tokens,
            "response": response, "plain_answer": plain,
            "cached_input_tokens": u.cached_input_tokens, "cache_write_tokens": u.cache_write_tokens,
            "output_tokens": u.output_tokens, "reasoning_tokens": u.reasoning_tokens,
        }  # fmt: skip
        called = calls.get(outcome.custom_id)
        target = fate.after_outcome(
            job, state, req, outcome, row, route, choices, now, rng, (called, *tools[req.id]) if called else None, together
        )
        if row.get("error_code") == "invalid_output":  # an answer that failed validation is a failure, still billed
            attempt.update(ok=False, error_code="invalid_output", error_message=row["error_message"])
        by_target.setdefault(target, []).append(row)
        if target is SUCCEEDED:
            counts.succeeded += 1
        elif target is PENDING:
            counts.retried += 1
        elif target is CANCELLED:
            counts.cancelled += 1
        else:
            counts.failed += 1
    shared = {"route": route, "updated_at": now}
    for target, rows in by_target.items():
        if target is RequestState.SUCCEEDED:
            fate.settle(conn, target, dispatch_id, rows, SUCCEEDED_COLUMNS, shared | {"error_code": None, "error_message": None})
        else:
            fate.settle(conn, target, dispatch_id, rows, OTHER_COLUMNS, shared)
    if attempt_rows:
        insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(attempts)
        # Numbers and lowtide's own names go into the SQL; the model name, which comes from
        # the spec, stays a bound parameter.
        each = {c: fixed(conn, v) for c, v in {"job_id": job.id, "dispatch_id": dispatch_id, "route": route, "at": now}.items()}
        insert = insert.values(**each, **{c: bindparam(c) for c in ATTEMPT_COLUMNS})
        executemany(conn, insert.on_conflict_do_nothing(index_elements=["request_id", "dispatch_id"]), attempt_rows)
    for model, why in unknown_costs.items():
        note_once(conn, job.id, "cost_unknown", f"cost of attempts on {route} ({model}) is unknown: {why}", now)
    return counts


# What a late line writes on an attempt its request already has in that batch (the one
# recorded when the batch was given up): its bill, nothing of its fate.
BILL_COLUMNS = (*TOKENS, "billed", "cost_picousd", "realtime_picousd", "model", "tier")


def book_late(conn: Connection, job: JobContext, dispatch_id: int, route: str, outcomes: Sequence[Outcome], now: float) -> int:
    """Book what a batch given up as lost (`batch_lost`) bills after all; apply nothing: its
    requests went on without it. A line's usage and cost go on its request's attempt in
    that batch (recorded, unbilled, when the batch was given up) or, for a request that
    had left it before, on a new attempt, not applied. A line booked already is not booked
    again (the same results read twice). Returns the lines booked."""
    current, _ = _lookup(conn, job.id, dispatch_id, outcomes, whole_dispatch=False)
    ledger = current_ledger()
    options, lane_model = job.sent_as(route, None)
    rows, seen = [], set()
    for outcome in outcomes:
        req = current.get(outcome.custom_id)
        if req is None or req.id in seen:  # not ours; a line given twice (billed once)
            continue
        seen.add(req.id)
        model = lane_model or req.model
        rate = ledger.rate(route, options, model, outcome.tier, now)
        billed, cost, realtime = ledger.columns(outcome, rate)
        if billed:
            u = outcome.usage
            rows.append({
                "request_id": req.id, "ok": outcome.ok, "applied": False, "error_code": outcome.error_code,
                "error_message": outcome.error_message, **{t: getattr(u, t) for t in TOKENS},
                "billed": True, "cost_picousd": cost, "realtime_picousd": realtime,
                "model": model, "tier": rate.tier.value if rate.tier else None,
            })  # fmt: skip
    if rows:
        insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(attempts)
        insert = insert.values(job_id=job.id, dispatch_id=dispatch_id, route=route, at=now, **{c: bindparam(c) for c in ATTEMPT_COLUMNS})
        upsert = insert.on_conflict_do_update(
            index_elements=["request_id", "dispatch_id"],
            set_={c: insert.excluded[c] for c in BILL_COLUMNS},
            where=attempts.c.billed.is_not(True),
        )
        executemany(conn, upsert, rows)
    return len(rows)


_COLS = (
    requests.c.id, requests.c.custom_id, requests.c.state, requests.c.dispatch_id,
    requests.c.attempts, requests.c.repair, requests.c.lane, requests.c.lane_reason,
    requests.c.lane_base_attempts, requests.c.model,
)  # fmt: skip


class Current(NamedTuple):
    """A request as an outcome finds it (`_COLS`). A plain tuple, not the SQLAlchemy row:
    ingest reads several of its fields per outcome, and a row's attribute costs ten times a
    tuple's (SQLAlchemy 2.1 checks the row's class for the name first)."""

    id: int
    custom_id: str
    state: str
    dispatch_id: int | None
    attempts: int
    repair: str | None
    lane: str
    lane_reason: str | None
    lane_base_attempts: int
    model: str | None


def _lookup(conn: Connection, job_id: int, dispatch_id: int, outcomes, whole_dispatch: bool):
    """The requests the outcomes are for, and which of them already have an attempt from
    this dispatch. A request still waiting in this dispatch never has one (an attempt is
    recorded in the same transaction that moves it on), so only the others are checked."""
    current = {}
    if whole_dispatch:
        live = select(*_COLS).where(
            requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value
        )
        if conn.dialect.name == "postgresql":
            live = live.with_for_update()
        current = {r[1]: Current._make(r) for r in conn.execute(live).fetchall()}  # whole: no fetch per row
    others = list({o.custom_id for o in outcomes if o.custom_id not in current})
    moved_on = []  # (those read by dispatch are all still in it)
    if others:
        stmt = select(*_COLS).where(requests.c.job_id == job_id, among(conn, requests.c.custom_id, others))
        if conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        found = {r[1]: Current._make(r) for r in conn.execute(stmt).fetchall()}
        current.update(found)
        moved_on = [r.id for r in found.values() if not (r.state == DISPATCHED and r.dispatch_id == dispatch_id)]
    seen = set()
    if moved_on:
        seen = set(
            conn.scalars(
                select(attempts.c.request_id).where(
                    attempts.c.dispatch_id == dispatch_id, attempts.c.request_id.in_(moved_on)
                )
            )
        )
    return current, seen


def _tools(conn: Connection, ids: list[int]) -> dict[int, tuple[str, ToolSchemas]]:
    """request id -> (its endpoint, the tools its body declares)."""
    out = {}
    for rid, payload in conn.execute(select(requests.c.id, payload_text()).where(among(conn, requests.c.id, ids))):
        request = Request.from_payload("", fastjson.loads(payload))
        out[rid] = (request.endpoint, tool_schemas(request.endpoint, request.body))
    return out
