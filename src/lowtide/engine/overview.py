"""A job at a glance, for the dashboard: where its requests stand, how they failed, the
provider batches they went in, when it may end and what it may cost. Every figure that a
page shows in two places is computed here once.

Two counts of failure, never mixed up:

- failed requests: requests whose terminal state is `failed` (each with one reason, its
  error code). This is *the* failure count: progress bars, the jobs table and "failures by
  reason" all show it, and the reasons add up to it.
- failed attempts: tries that did not succeed (`attempts.ok` false), from the ledger, as
  `lowtide report` counts them. A request retried twice and then answered has two failed
  attempts and is not a failed request; one failed before it was sent (its deadline passed)
  is a failed request with no attempt. Shown apart, labelled as tries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI, conversation_key
from lowtide.core.states import RequestState
from lowtide.core.tokens import _text_of  # a message's text: its string, or its text parts'
from lowtide.core.types import Request
from lowtide.engine.budget import Estimate, estimate_requests
from lowtide.engine.context import JobContext
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatch_phases, dispatches, jobs, requests

MAX_PAGE = 200  # failed rows (or answers) per page, at most
MAX_ANSWER = 2000  # characters of an answer (or of its request) shown; the rest is cut, its length told
MAX_BATCHES = 100  # the newest batches in a timeline


@dataclass(slots=True)
class Progress:
    """A job's requests by where they stand; `waiting` and `in_flight` are the pending part."""

    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    waiting: int = 0  # stored, not sent yet (or waiting for a retry)
    in_flight: int = 0  # in a provider batch, or running on a direct route

    @classmethod
    def of(cls, counts: dict[str, int]) -> Progress:
        return cls(
            succeeded=counts.get(RequestState.SUCCEEDED.value, 0),
            failed=counts.get(RequestState.FAILED.value, 0),
            cancelled=counts.get(RequestState.CANCELLED.value, 0),
            waiting=counts.get(RequestState.PENDING.value, 0),
            in_flight=counts.get(RequestState.DISPATCHED.value, 0),
        )

    @property
    def total(self) -> int:
        return self.succeeded + self.failed + self.cancelled + self.waiting + self.in_flight

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def pending(self) -> int:
        return self.waiting + self.in_flight

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"pending": self.pending, "done": self.done, "total": self.total}


@dataclass(slots=True)
class Failures:
    requests: int = 0  # failed requests: THE failure count
    by_reason: dict[str, int] = field(default_factory=dict)  # adds up to `requests`
    attempts: int = 0  # failed tries (the ledger's `failures`)
    billed_attempts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def failures(conn: Connection, job_id: int) -> Failures:
    """A job's failed requests by reason, and its failed attempts (the jobs list sums each
    job's: engine/job_figures.py)."""
    r, a = requests.c, attempts.c
    where_r = [r.state == RequestState.FAILED.value, r.job_id == job_id]
    where_a = [a.job_id == job_id]
    reasons: dict[str, int] = {}
    for code, n in conn.execute(select(r.error_code, func.count()).where(*where_r).group_by(r.error_code)):
        reasons[code or "unknown"] = reasons.get(code or "unknown", 0) + n
    tries, billed = conn.execute(
        select(func.count(), func.coalesce(func.sum(case((a.billed.is_(True), 1), else_=0)), 0)).where(
            a.ok.is_(False), *where_a
        )
    ).one()
    ordered = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return Failures(sum(ordered.values()), ordered, int(tries), int(billed))


# Failed rows ---------------------------------------------------------------------------
@dataclass(slots=True)
class RowPage:
    """One page of a job's rows: its failed requests (`failed_rows`) or its answers (`answer_rows`)."""

    total: int  # requests matching the filter
    offset: int
    limit: int
    rows: list[dict[str, Any]]


def failed_rows(
    conn: Connection, job_id: int, *, reason: str | None = None, search: str | None = None, offset: int = 0, limit: int = 50
) -> RowPage:  # fmt: skip
    """One page of a job's failed requests, in source order: custom_id, reason (error code),
    the provider's (or lowtide's) message, attempts, the route it last ran on. `reason`
    keeps one error code ("unknown": none); `search` keeps rows whose custom_id or message
    contains it (case-insensitive)."""
    r = requests.c
    where = [r.job_id == job_id, r.state == RequestState.FAILED.value]
    if reason is not None:
        where.append(r.error_code.is_(None) if reason == "unknown" else r.error_code == reason)
    if search:
        pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where.append(or_(func.lower(r.custom_id).like(pattern, escape="\\"), func.lower(r.error_message).like(pattern, escape="\\")))
    limit = max(1, min(limit, MAX_PAGE))
    offset = max(0, offset)
    total = conn.execute(select(func.count()).select_from(requests).where(*where)).scalar_one()
    rows = conn.execute(
        select(r.custom_id, r.source_row, r.error_code, r.error_message, r.attempts, r.route, r.updated_at)
        .where(*where).order_by(r.source_row, r.id).offset(offset).limit(limit)
    ).all()  # fmt: skip
    return RowPage(total, offset, limit, [
        {"custom_id": x.custom_id, "source_row": x.source_row, "reason": x.error_code or "unknown",
         "message": x.error_message, "attempts": x.attempts, "route": x.route, "at": x.updated_at}
        for x in rows
    ])  # fmt: skip


# Succeeded answers ---------------------------------------------------------------------
def answer_rows(
    conn: Connection, job_id: int, *, search: str | None = None, offset: int = 0, limit: int = 20
) -> RowPage:  # fmt: skip
    """One page of a job's succeeded requests, in source order: custom_id, its answer text
    (`answer`, the first MAX_ANSWER characters; `length` is the whole answer's), what it was
    asked (`prompt`, cut alike, `prompt_length`, and the request's `endpoint`: `request_text`),
    attempts, route, output tokens. A request answered with no text (tool calls alone, an
    embedding) has `answer` None. `search` keeps rows whose custom_id or answer contains it
    (any case; `%` and `_` are characters, not wildcards). Read page by page: the payloads
    read are the page's, never the whole job's."""
    r = requests.c
    where = [r.job_id == job_id, r.state == RequestState.SUCCEEDED.value]
    if search:
        where.append(or_(r.custom_id.icontains(search, autoescape=True), r.output.icontains(search, autoescape=True)))
    limit = max(1, min(limit, MAX_PAGE))
    offset = max(0, offset)
    total = conn.execute(select(func.count()).select_from(requests).where(*where)).scalar_one()
    rows = conn.execute(
        select(r.custom_id, r.source_row, func.substr(r.output, 1, MAX_ANSWER).label("answer"), func.length(r.output).label("length"),
               payload_text().label("payload"), r.attempts, r.route, r.output_tokens, r.updated_at)
        .where(*where).order_by(r.source_row, r.id).offset(offset).limit(limit)
    ).all()  # fmt: skip
    page = []
    for x in rows:
        prompt, endpoint = request_text(x.payload)
        page.append({
            "custom_id": x.custom_id, "source_row": x.source_row, "answer": x.answer, "length": x.length,
            "prompt": None if prompt is None else prompt[:MAX_ANSWER], "prompt_length": len(prompt or ""), "endpoint": endpoint,
            "attempts": x.attempts, "route": x.route, "output_tokens": x.output_tokens, "at": x.updated_at,
        })  # fmt: skip
    return RowPage(total, offset, limit, page)


def request_text(payload: str) -> tuple[str | None, str]:
    """What a stored request asked, as a person reads it beside the answer, and its
    endpoint: the text of its last user turn that has text (a completions prompt, a
    responses input given as text, an embedding's input text), else its system prompt;
    None when it holds no text (token ids, images alone)."""
    try:
        request = Request.from_payload("", fastjson.loads(payload))
        body = request.body if isinstance(request.body, dict) else {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, "unknown"
    endpoint = request.endpoint
    asked = body.get(conversation_key(endpoint))
    if isinstance(asked, str):
        return asked, endpoint
    turns = [m for m in asked if isinstance(m, dict)] if isinstance(asked, list) else []
    if isinstance(asked, list) and asked and all(isinstance(t, str) for t in asked):  # texts to embed or moderate
        return "\n".join(asked), endpoint
    contents = "parts" if endpoint == GEMINI else "content"
    said = [_text_of(m.get(contents)) for m in reversed(turns) if m.get("role", "user") == "user"]
    system = body.get("system") or body.get("instructions")
    if isinstance(body.get("systemInstruction"), dict):
        system = body["systemInstruction"].get("parts")
    said += [_text_of(system)] + [_text_of(m.get("content")) for m in reversed(turns) if m.get("role") in ("system", "developer")]
    return next((t for t in said if t), None), endpoint


# Batch timeline ------------------------------------------------------------------------
def batch_timeline(conn: Connection, job_id: int, limit: int = MAX_BATCHES) -> tuple[int, list[dict[str, Any]]]:
    """The job's provider batches (newest first, `limit` of them) and how many it has: each
    with when it was created, sent and ended, the provider phases it was seen in (with the
    time first seen), and its requests: succeeded, failed (attempts from this batch) and
    still in it; and, for a batch given up as lost, until when it is still polled for its
    bill (`watch_until`, engine/batches.py `_watch`; None otherwise)."""
    d = dispatches.c
    is_batch = and_(d.job_id == job_id, d.kind == "batch")
    count = conn.execute(select(func.count()).select_from(dispatches).where(is_batch)).scalar_one()
    rows = conn.execute(
        select(d.id, d.route, d.provider_id, d.state, d.phase, d.size, d.created_at, d.submitted_at, d.ended_at, d.error, d.watch_until)
        .where(is_batch).order_by(d.id.desc()).limit(limit)
    ).all()  # fmt: skip
    ids = [row.id for row in rows]
    phases: dict[int, list[dict[str, Any]]] = {}
    outcomes: dict[int, dict[str, int]] = {}
    waiting: dict[int, int] = {}
    if ids:
        for dispatch_id, phase, at in conn.execute(
            select(dispatch_phases.c.dispatch_id, dispatch_phases.c.phase, dispatch_phases.c.at)
            .where(dispatch_phases.c.dispatch_id.in_(ids)).order_by(dispatch_phases.c.id)
        ):  # fmt: skip
            phases.setdefault(dispatch_id, []).append({"phase": phase, "at": at})
        for dispatch_id, ok, n in conn.execute(
            select(attempts.c.dispatch_id, attempts.c.ok, func.count())
            .where(attempts.c.dispatch_id.in_(ids)).group_by(attempts.c.dispatch_id, attempts.c.ok)
        ):  # fmt: skip
            outcomes.setdefault(dispatch_id, {})["succeeded" if ok else "failed"] = n
        waiting = dict(
            conn.execute(
                select(requests.c.dispatch_id, func.count())
                .where(requests.c.dispatch_id.in_(ids), requests.c.state == RequestState.DISPATCHED.value)
                .group_by(requests.c.dispatch_id)
            ).all()
        )
    batches = [
        {
            "id": row.id, "route": row.route, "provider_id": row.provider_id, "state": row.state, "phase": row.phase,
            "size": row.size, "created_at": row.created_at, "submitted_at": row.submitted_at, "ended_at": row.ended_at,
            "error": row.error, "watch_until": row.watch_until, "phases": phases.get(row.id, []),
            "counts": {"succeeded": outcomes.get(row.id, {}).get("succeeded", 0),
                       "failed": outcomes.get(row.id, {}).get("failed", 0), "in_batch": waiting.get(row.id, 0)},
        }  # fmt: skip
        for row in rows
    ]
    return count, batches


# ETA and estimate ----------------------------------------------------------------------
@dataclass(slots=True)
class Eta:
    """When the job may end, at the rate measured so far: requests finished between its
    first send and its latest finished request. In the job's own clock (the store's times)."""

    rate_per_s: float
    remaining_s: float
    at: float  # last progress + remaining
    last_progress_at: float


def eta(conn: Connection, job_id: int, progress: Progress) -> Eta | None:
    """None while nothing is left, nothing has finished yet, or no time has passed."""
    if not progress.pending or not progress.done:
        return None
    started = conn.execute(
        select(func.min(func.coalesce(dispatches.c.submitted_at, dispatches.c.created_at))).where(dispatches.c.job_id == job_id)
    ).scalar()
    last = conn.execute(
        select(func.max(requests.c.updated_at)).where(
            requests.c.job_id == job_id,
            requests.c.state.in_([RequestState.SUCCEEDED.value, RequestState.FAILED.value, RequestState.CANCELLED.value]),
        )
    ).scalar()
    if started is None or last is None or last <= started:
        return None
    rate = progress.done / (last - started)
    remaining = progress.pending / rate
    return Eta(rate, remaining, last + remaining, last)


_estimates: dict[tuple, Estimate] = {}  # the whole job's estimate changes only with its requests


def job_estimate(conn: Connection, job_id: int) -> Estimate:
    """What every request of the job may cost on its route, as a budget estimates a batch
    (`budget.estimate_requests`: input approximated as core/tokens.py does, each image at the
    most one is billed, cache writes at the write rate; output = each request's limit): an
    upper bound, to set the cost so far against."""
    job_row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    n, last_id, versions = conn.execute(
        select(func.count(), func.max(requests.c.id), func.coalesce(func.sum(requests.c.version), 0)).where(requests.c.job_id == job_id)
    ).one()
    key = (job_id, job_row.spec, n, last_id, int(versions))
    cached = _estimates.get(key)
    if cached is None:
        job = JobContext.from_row(job_row)
        cached = estimate_requests(conn, job, requests.c.job_id == job_id, job.spec.route)
        if len(_estimates) > 256:
            _estimates.clear()
        _estimates[key] = cached
    return cached


def estimate_dict(est: Estimate) -> dict[str, Any]:
    return {
        "usd": None if est.usd is None else str(est.usd), "requests": est.requests,
        "input_tokens": est.input_tokens, "output_tokens": est.output_tokens, "image_tokens": est.image_tokens,
        "cache_write_tokens": est.cache_write_tokens, "note": est.note or None,
    }  # fmt: skip
