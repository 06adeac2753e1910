"""Budgets: a job with `budget_usd` never sends work that its estimate says could take it
over.

    before a batch is submitted or a direct dispatch runs:
        estimate = the dispatch's requests priced at the route's tier
                   (input ≈ the stored request's characters / 4, and half a token for each
                   UTF-8 byte past a character's first: core/tokens.py; output = each
                   request's max_tokens times the answers it asks for (n), none for an
                   embedding or a moderation)
        spent + reserved + estimate > budget ─► do not send; job → budget_exhausted
        else reserve the estimate on the dispatch
    as results come in: the dispatch's reservation shrinks by what its attempts cost, and
    ends with the dispatch (settled to the actual cost, which the ledger holds)

`spent` is the sum of the job's attempts (stale ones included: they are paid for). A price
the catalog does not know refuses the dispatch rather than guessing, as does a job whose
billed attempts have an unknown cost. Batches already in flight are still collected while
the job is budget_exhausted; `lowtide submit` of the spec (with a bigger budget) resumes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import ColumnElement, Connection, and_, case, func, select, update

from lowtide.core.endpoints import NO_TEXT
from lowtide.core.errors import InputError
from lowtide.core.pricing import attempt_cost, load_catalog
from lowtide.core.states import DispatchState, JobState, RequestState
from lowtide.core.tokens import approx_from
from lowtide.core.types import Request, Usage
from lowtide.engine import fate, notify
from lowtide.engine.context import JobContext
from lowtide.store.money import from_pico, to_pico
from lowtide.store.payloads import payload_bytes, payload_chars, payload_text
from lowtide.store.queries import add_event, stored_bytes
from lowtide.store.schema import attempts, dispatches, jobs, requests
from lowtide.store.transitions import lock_job, move_job

# A dispatch holds its reservation from the moment it may reach the provider.
RESERVING_STATES = (DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value, DispatchState.RUNNING.value)


@dataclass(frozen=True, slots=True)
class Estimate:
    requests: int
    input_tokens: int
    output_tokens: int
    usd: Decimal | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a job stands against its budget, in USD."""

    spent: Decimal  # the known cost of its attempts
    reserved: Decimal  # estimates of live dispatches, less what their attempts cost so far
    unknown: int  # billed attempts whose cost is unknown


def usd(amount: Decimal) -> str:
    """$0.000012345, $10: exact, without exponent or trailing zeros."""
    return f"${amount.normalize():f}"


def estimate(conn: Connection, job: JobContext, dispatch_id: int, route: str) -> Estimate:
    """What the requests waiting in a dispatch may cost on `route`: the approximation of
    `lowtide.core.tokens` over the stored request's whole JSON (its keys and syntax make it
    an over-count) of input, and max_tokens of output for each answer it asks for (n)."""
    waiting = and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value)
    return estimate_requests(conn, job, waiting, route)


def estimate_requests(conn: Connection, job: JobContext, waiting: ColumnElement[bool], route: str) -> Estimate:
    """`estimate` of the job's requests that `waiting` selects (the dashboard: all of them)."""
    n, chars, nbytes = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(payload_chars() + func.coalesce(func.length(requests.c.repair), 0)), 0),
            func.coalesce(func.sum(payload_bytes() + func.coalesce(stored_bytes(requests.c.repair), 0)), 0),
        ).where(waiting)
    ).one()
    spec = job.spec
    if spec.request_endpoint in NO_TEXT:  # an embedding or a moderation is billed its input alone
        output = 0
    elif spec.output_bound is not None:  # the same for every request: no body need be read
        output = n * spec.output_bound
    else:  # rows may carry their own limit or n
        bounds = [Request.from_payload("", json.loads(p)).output_bound for p in conn.scalars(select(payload_text()).where(waiting))]
        if None in bounds:
            return Estimate(n, 0, 0, None, "a request sets no output limit, so its cost has no bound; give every row max_tokens")
        output = sum(bounds)
    input_tokens = approx_from(int(chars), int(nbytes))
    model, options = job.priced_as(route)
    try:
        catalog = load_catalog()
    except InputError as err:
        return Estimate(n, input_tokens, output, None, f"the price file did not load: {err}")
    cost = attempt_cost(Usage(input_tokens=input_tokens, output_tokens=output), model, route, options, catalog=catalog)
    return Estimate(n, input_tokens, output, cost.usd, cost.note)


def position(conn: Connection, job_id: int) -> Position:
    spent, unknown = conn.execute(
        select(
            func.coalesce(func.sum(attempts.c.cost_picousd), 0),
            func.coalesce(func.sum(case((and_(attempts.c.billed.is_(True), attempts.c.cost_picousd.is_(None)), 1), else_=0)), 0),
        ).where(attempts.c.job_id == job_id)
    ).one()
    live = dict(
        conn.execute(
            select(dispatches.c.id, dispatches.c.reserved_picousd).where(
                dispatches.c.job_id == job_id,
                dispatches.c.state.in_(RESERVING_STATES),
                dispatches.c.reserved_picousd.is_not(None),
            )
        ).all()
    )
    reserved = 0
    if live:
        used = dict(
            conn.execute(
                select(attempts.c.dispatch_id, func.coalesce(func.sum(attempts.c.cost_picousd), 0))
                .where(attempts.c.dispatch_id.in_(list(live)))
                .group_by(attempts.c.dispatch_id)
            ).all()
        )
        reserved = sum(max(int(r) - int(used.get(d, 0)), 0) for d, r in live.items())
    return Position(from_pico(spent), from_pico(reserved), int(unknown))


def reserve(conn: Connection, job: JobContext, dispatch_id: int, route: str) -> str | None:
    """Reserve the dispatch's estimated cost against the job's budget; or, without writing
    anything, say why it must not be sent. Nothing to do for a job without a budget."""
    budget = job.spec.budget_usd
    if budget is None:
        return None
    if lock_job(conn, job.id) == JobState.BUDGET_EXHAUSTED.value:  # one reservation at a time per job
        return "the job's budget is exhausted"
    est = estimate(conn, job, dispatch_id, route)
    if est.usd is None:
        return (
            f"the cost of {est.requests} request(s) on {route} cannot be estimated ({est.note}); "
            "a budgeted job sends nothing it cannot price"
        )
    pos = position(conn, job.id)
    if pos.unknown:
        return f"the cost of {pos.unknown} billed attempt(s) is unknown, so what is left of the budget is unknown"
    if est.usd > 0 and pos.spent + pos.reserved + est.usd > budget:
        return (
            f"{usd(pos.spent)} spent + {usd(pos.reserved)} reserved + {usd(est.usd)} estimated for the next "
            f"{est.requests} request(s) on {route} would pass the budget of {usd(budget)}"
        )
    conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(reserved_picousd=to_pico(est.usd)))
    return None


def exhaust(conn: Connection, job: JobContext, reason: str, now: float) -> None:
    """Stop sending: the job becomes budget_exhausted and its unsent batches are taken apart
    (their requests wait, pending, for the budget to be raised). The job's row is locked
    first, as `reserve` and `cancel` lock it, so that none of them waits on the other."""
    job_id = job.id
    state = lock_job(conn, job_id)
    planned = conn.scalars(
        select(dispatches.c.id).where(dispatches.c.job_id == job_id, dispatches.c.state == DispatchState.PLANNED.value)
    ).all()
    for dispatch_id in planned:  # one another worker has just begun to send is not taken apart
        fate.undo_planned(conn, job, dispatch_id, now)
    if state == JobState.ACTIVE.value:
        move_job(conn, job_id, JobState.BUDGET_EXHAUSTED, updated_at=now)
        add_event(
            conn, job_id, "budget_exhausted",
            f"stopped sending: {reason}. {_how_to_resume(reason)}",
            now,
        )  # fmt: skip
        notify.budget_exhausted(conn, job, now, f"{reason}. {_how_to_resume(reason)}")


def resume(conn: Connection, job_id: int, budget: Decimal | None, now: float) -> bool:
    """A budget_exhausted job whose spec was submitted again is active again (the next
    dispatch checks the new budget). True if it was exhausted."""
    state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()
    if state != JobState.BUDGET_EXHAUSTED.value:
        return False
    move_job(conn, job_id, JobState.ACTIVE, updated_at=now)
    limit = "no budget" if budget is None else f"a budget of {usd(budget)}"
    add_event(conn, job_id, "budget_resumed", f"spec submitted again with {limit}: sending again", now)
    return True


def _how_to_resume(reason: str) -> str:
    """Raising the budget helps only when the budget is what stopped the job."""
    if "cannot be estimated" in reason or "is unknown" in reason:
        return "Add the missing prices to a price file (docs/costs.md) and run `lowtide submit` to resume"
    return "Raise budget_usd in the spec and run `lowtide submit` with it to resume"
