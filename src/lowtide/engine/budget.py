"""Budgets: a job with `budget_usd` never sends work that its estimate says could take it
over. The estimate is an upper bound of what the provider can bill the dispatch:

    before a batch is submitted or a direct dispatch runs:
        estimate = the dispatch's requests priced at the route's tier
                   input:  the stored request's characters / 4, and half a token for each
                           UTF-8 byte past a character's first (core/tokens.py), plus each
                           image at the most one image is billed on the model, whatever its
                           size (core/input_bounds.py: OpenAI 1,097-48,169 tokens by model,
                           Claude 1,600 or 5,000, Gemini 2,240-6,192); priced at the input
                           rate, or, for a request that asks to write a prompt cache
                           (cache_control, or the route's cache_prefix), at the write rate of
                           the longest TTL it asks for (1.25x input for 5 minutes, 2x for an
                           hour), its whole input taken as written
                   output: each request's max_tokens times the answers it asks for (n),
                           none for an embedding or a moderation
        a request holding what has no bound (a PDF, billed by its pages; audio or video, by
        their length; an image on a model no provider documents a most for) ─► do not send;
        the job → budget_exhausted, saying so (a template adding one is refused at load)
        spent + reserved + estimate > budget ─► do not send; job → budget_exhausted
        else reserve the estimate on the dispatch
    as results come in: the dispatch's reservation shrinks by what its attempts cost, and
    ends with the dispatch (settled to the actual cost, which the ledger holds)

What a request holds is read from the spec where the spec decides it (a template's images
and files, its params' cache_control): one aggregate over the stored text, no body read.
Rows that bring their own conversation, body or parameters are read, each, as they must be
for their own output limits. `spent` is the sum of the job's attempts (stale ones included:
they are paid for). A price the catalog does not know refuses the dispatch rather than
guessing, as does a job whose billed attempts have an unknown cost. Batches already in
flight are still collected while the job is budget_exhausted; `lowtide submit` of the spec
(with a bigger budget) resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import ColumnElement, Connection, and_, case, func, select, update

from lowtide.core import fastjson
from lowtide.core.endpoints import NO_TEXT
from lowtide.core.errors import InputError
from lowtide.core.input_bounds import image_bound, longer_ttl, may_hold, scan
from lowtide.core.params import OUTPUT_LIMITS
from lowtide.core.pricing import MILLION, attempt_cost, billing_of, load_catalog
from lowtide.core.spec import JobSpec
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
    input_tokens: int  # every input token: the text's approximation, images, cache writes
    output_tokens: int
    usd: Decimal | None
    note: str = ""  # what the bound assumes beyond text (images, cache writes), or why there is none
    cache_write_tokens: int = 0  # of input_tokens, those priced at the cache-write rate
    image_tokens: int = 0  # of input_tokens, the images' (each at the most one image costs)


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
    """What the requests waiting in a dispatch may cost on `route` (see the module doc)."""
    waiting = and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value)
    return estimate_requests(conn, job, waiting, route)


# Parameters a row may give through param_columns that never hold content (a part, a
# cache_control): with only these, what each body holds is the template's.
SCALAR_PARAMS = frozenset({
    *OUTPUT_LIMITS, "n", "temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty",
    "reasoning_effort", "service_tier", "user", "logprobs", "top_logprobs",
})  # fmt: skip
TTL_WORDS = {"5m": "5-minute", "1h": "1-hour"}
_TTLS = (None, "5m", "1h")  # what a request's input is priced at: input, or the 5-minute or 1-hour write


@dataclass
class _Tally:
    """The requests an estimate covers, by the cache-write TTL they ask for (None: no write)."""

    n: int = 0
    output: int = 0
    no_limit: bool = False
    unbounded: int = 0  # requests holding a part with no bound
    unbounded_what: str | None = None
    chars: dict[str | None, int] = field(default_factory=lambda: dict.fromkeys(_TTLS, 0))
    nbytes: dict[str | None, int] = field(default_factory=lambda: dict.fromkeys(_TTLS, 0))
    images: dict[str | None, int] = field(default_factory=lambda: dict.fromkeys(_TTLS, 0))
    writers: dict[str | None, int] = field(default_factory=lambda: dict.fromkeys(_TTLS, 0))


def estimate_requests(conn: Connection, job: JobContext, waiting: ColumnElement[bool], route: str) -> Estimate:
    """`estimate` of the job's requests that `waiting` selects (the dashboard: all of them)."""
    spec = job.spec
    model, options = job.priced_as(route)
    billing = billing_of(route, options)
    # `cache_prefix` marks each request's system prompt for the cache at the route's TTL.
    route_ttl = billing.cache_write_ttl if billing is not None and options.get("cache_prefix") else None
    if spec.request_endpoint not in NO_TEXT and (spec.output_bound is None or _rows_decide(spec)):
        tally = _read_rows(conn, waiting, route_ttl)
    else:  # what each body holds is the spec's: no body need be read
        tally = _from_spec(conn, waiting, spec, route_ttl)
    n = tally.n
    if tally.no_limit:
        return Estimate(n, 0, 0, None, "a request sets no output limit, so its cost has no bound; give every row max_tokens")
    try:
        catalog = load_catalog()
    except InputError as err:
        return Estimate(n, 0, tally.output, None, f"the price file did not load: {err}")
    images = sum(tally.images.values())
    bound = image_bound(model, billing.provider if billing else None) if images else None
    if tally.unbounded or (images and bound is None):
        per_million = attempt_cost(Usage(input_tokens=MILLION), model, route, options, catalog=catalog).usd
        if per_million != 0:  # a route that bills nothing for input (echo, a free local model) is bounded at 0
            if tally.unbounded:
                why = f"{tally.unbounded} request(s) hold {tally.unbounded_what}, which lowtide cannot measure before sending"
            else:
                why = f"{images} image(s) on {model}, whose provider documents no most an image is billed"
            return Estimate(n, 0, tally.output, None, f"{why}, so their cost has no bound")
    per_image = bound.tokens if bound else 0
    tokens = {t: approx_from(tally.chars[t], tally.nbytes[t]) + tally.images[t] * per_image for t in _TTLS}
    if billing is None or billing.provider is None:  # self-hosted or free: no price list, no write rate
        tokens = {None: sum(tokens.values()), "5m": 0, "1h": 0}
    writes, ttl = (tokens["5m"], "5m") if tokens["5m"] else (tokens["1h"], "1h")
    usage = Usage(input_tokens=tokens[None], cache_write_tokens=writes, output_tokens=tally.output)
    cost = attempt_cost(usage, model, route, options, catalog=catalog, cache_write_ttl=ttl if writes else None)
    total = cost.usd
    if total is not None and tokens["5m"] and tokens["1h"]:  # some requests write for 5 minutes, some for an hour
        longer = attempt_cost(Usage(cache_write_tokens=tokens["1h"]), model, route, options, catalog=catalog, cache_write_ttl="1h")
        total = None if longer.usd is None else total + longer.usd
    said = []
    if images:
        said.append(f"{images:,} image(s) at {per_image:,} tokens each, the most one is billed on {model} ({bound.source})" if bound
                    else f"{images:,} image(s) at no cost on {route}")  # fmt: skip
    for t in ("5m", "1h"):
        if tokens[t] and billing is not None and billing.provider is not None:
            said.append(f"the input of {tally.writers[t]:,} request(s) that write a prompt cache at the {TTL_WORDS[t]} cache-write rate")
    note = "; ".join(said + ([cost.note] if cost.note else []))
    input_tokens = sum(tokens.values())
    return Estimate(n, input_tokens, tally.output, total, note, tokens["5m"] + tokens["1h"], images * per_image)


def _rows_decide(spec: JobSpec) -> bool:
    """Whether rows may hold content of their own (parts, cache_control): a conversation or
    a body column, or a param column that is not a plain setting."""
    t = spec.template
    return t.messages_column is not None or t.body_column is not None or not SCALAR_PARAMS.issuperset(spec.param_columns)


def _text_lengths() -> tuple[ColumnElement[int], ColumnElement[int]]:
    """Characters and UTF-8 bytes of each selected request as stored: its body and its repair turns."""
    chars = payload_chars() + func.coalesce(func.length(requests.c.repair), 0)
    nbytes = payload_bytes() + func.coalesce(stored_bytes(requests.c.repair), 0)
    return chars, nbytes


def _totals(conn: Connection, waiting: ColumnElement[bool]) -> _Tally:
    """One aggregate over the stored text of the selected requests, all at the input rate."""
    chars, nbytes = _text_lengths()
    n, total_chars, total_bytes = conn.execute(
        select(func.count(), func.coalesce(func.sum(chars), 0), func.coalesce(func.sum(nbytes), 0)).where(waiting)
    ).one()
    tally = _Tally(n=int(n))
    tally.chars[None], tally.nbytes[None] = int(total_chars), int(total_bytes)
    return tally


def _from_spec(conn: Connection, waiting: ColumnElement[bool], spec: JobSpec, route_ttl: str | None) -> _Tally:
    """One aggregate over the stored text: each body holds the spec's parts (one per
    template image or file) and its params' cache_control, if any."""
    tally = _totals(conn, waiting)
    ttl = longer_ttl(scan(spec.params).cache_ttl, route_ttl) if spec.request_endpoint not in NO_TEXT else None
    tally.output = 0 if spec.request_endpoint in NO_TEXT else tally.n * (spec.output_bound or 0)
    tally.chars[ttl], tally.nbytes[ttl] = tally.chars.pop(None), tally.nbytes.pop(None)
    tally.chars.setdefault(None, 0)
    tally.nbytes.setdefault(None, 0)
    tally.images[ttl] = tally.n * len(spec.template.images)
    tally.writers[ttl] = tally.n if ttl else 0
    if spec.template.files and tally.n:
        tally.unbounded, tally.unbounded_what = tally.n, "a PDF from template.files, billed by its pages"
    return tally


def _read_rows(conn: Connection, waiting: ColumnElement[bool], route_ttl: str | None) -> _Tally:
    """Each body read: rows that bring their own output limit, n, parts or cache_control.
    The text is the aggregate's; a request that writes a cache moves its own to its TTL."""
    tally = _totals(conn, waiting)
    for payload, repair in conn.execute(select(payload_text(), requests.c.repair).where(waiting)):
        request = Request.from_payload("", fastjson.loads(payload))
        bound = request.output_bound
        if bound is None:
            tally.no_limit = True
            continue
        tally.output += bound
        if not may_hold(payload) and route_ttl is None:
            continue  # plain text, at the input rate: the aggregate has it
        found = scan(request.body)
        ttl = longer_ttl(found.cache_ttl, route_ttl)
        tally.images[ttl] += found.images
        if found.unbounded:
            tally.unbounded += 1
            tally.unbounded_what = tally.unbounded_what or found.unbounded
        if ttl is not None:
            text = payload + (repair or "")
            c, b = len(text), len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            tally.chars[None] -= c
            tally.nbytes[None] -= b
            tally.chars[ttl] += c
            tally.nbytes[ttl] += b
            tally.writers[ttl] += 1
    return tally


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
    if "no output limit" in reason:
        return "Give every row an output limit (max_tokens) and run `lowtide submit` to resume"
    if "has no bound" in reason:
        return "Send such requests in a job without budget_usd (docs/costs.md#budgets); a larger budget does not resume this one"
    if "cannot be estimated" in reason or "is unknown" in reason:
        return "Add the missing prices to a price file (docs/costs.md) and run `lowtide submit` to resume"
    return "Raise budget_usd in the spec and run `lowtide submit` with it to resume"
