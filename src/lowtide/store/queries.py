"""Reads and small writes that several engine steps share."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Integer

from lowtide.core.errors import JobNotFoundError, SpecError
from lowtide.core.states import JobState
from lowtide.store.schema import PENDING, dispatches, events, jobs, requests


class stored_bytes(FunctionElement):  # noqa: N801 (a SQL function, named as one)
    """The bytes a text column's value takes in UTF-8 (NULL for NULL): what a provider's byte
    limit and a memory bound count, where `length` counts characters (a Japanese prompt is
    three bytes a character, an emoji four). SQLite reads it off the record, without
    decoding the text as `length` must (a quarter of the time)."""

    type = Integer()
    inherit_cache = True


@compiles(stored_bytes, "sqlite")
def _stored_bytes_sqlite(element, compiler, **kw) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


@compiles(stored_bytes, "postgresql")
def _stored_bytes_postgresql(element, compiler, **kw) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


def get_job(conn: Connection, name: str) -> Row:
    row = conn.execute(select(jobs).where(jobs.c.name == name)).first()
    if row is None:
        known = list(conn.scalars(select(jobs.c.name).order_by(jobs.c.name).limit(20)))
        hint = f"; jobs in this store: {', '.join(known)}" if known else "; this store has no jobs yet"
        raise JobNotFoundError(f'no job named "{name}"{hint}')
    return row


def list_jobs(conn: Connection, states: list[JobState] | None = None) -> list[Row]:
    stmt = select(jobs).order_by(jobs.c.id)
    if states:
        stmt = stmt.where(jobs.c.state.in_([s.value for s in states]))
    return list(conn.execute(stmt))


def save_job(conn: Connection, name: str, spec_json: str, route: str, now: float) -> tuple[int, bool]:
    """Insert the job, or update the spec of an existing one; return (id, created)."""
    existing = conn.execute(select(jobs.c.id).where(jobs.c.name == name)).scalar()
    if existing is not None:
        conn.execute(
            update(jobs).where(jobs.c.id == existing).values(spec=spec_json, route=route, updated_at=now)
        )
        return existing, False
    # ON CONFLICT: the same new job loaded twice at once (two `lowtide run`s) on PostgreSQL,
    # where this one waits for the other's insert and then finds its job rather than failing.
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    job_id = conn.execute(
        dialect.insert(jobs)
        .values(name=name, spec=spec_json, route=route, state=JobState.ACTIVE.value, created_at=now, updated_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(jobs.c.id)
    ).scalar()
    if job_id is not None:
        return job_id, True
    # The other load's job: the same spec is this load's too; another one was never checked
    # against it (the caller found no job), so it is refused rather than written over it.
    existing, stored = conn.execute(select(jobs.c.id, jobs.c.spec).where(jobs.c.name == name)).one()
    if stored != spec_json:
        raise SpecError(f'job "{name}" was created by another load at the same moment, with another spec; run again to compare the two')
    return existing, False


def request_counts(conn: Connection, job_id: int) -> dict[str, int]:
    rows = conn.execute(
        select(requests.c.state, func.count()).where(requests.c.job_id == job_id).group_by(requests.c.state)
    )
    return {state: count for state, count in rows}


LIVE_DISPATCH_STATES = ("planned", "submitting", "submitted", "running")


def watched() -> ColumnElement[bool]:
    """A batch given up as lost whose watch is open (engine/batches.py `_watch`): failed, and
    still polled for what the provider bills for it until `watch_until`."""
    return (dispatches.c.state == "failed") & dispatches.c.watch_until.is_not(None)


def batches_out(conn: Connection, job_id: int) -> bool:
    """Has the job a batch still to bring in by ticking it: being sent, sent, or given up as
    lost and watched for its bill? A finished or cancelled job can: a batch cut over at its
    deadline or asked to cancel is polled to its end (what it ran is paid for). Two reads,
    each on the (job, state) index, as engine/tick.py `_jobs` makes them."""
    sent = dispatches.c.state.in_(["submitting", "submitted"])
    for where in (sent, watched()):
        if conn.execute(select(dispatches.c.id).where(dispatches.c.job_id == job_id, where).limit(1)).first() is not None:
            return True
    return False


def dispatch_phases(conn: Connection, job_id: int) -> dict[str, int]:
    """Live dispatches by phase (the provider's word), for progress displays."""
    rows = conn.execute(
        select(func.coalesce(dispatches.c.phase, dispatches.c.state), func.count())
        .where(
            dispatches.c.job_id == job_id,
            dispatches.c.state.in_(LIVE_DISPATCH_STATES),
            dispatches.c.cut_at.is_(None),  # left behind at a deadline cut-over: not waited for
        )
        .group_by(func.coalesce(dispatches.c.phase, dispatches.c.state))
    )
    return {phase: count for phase, count in rows}


def note_phase(conn: Connection, dispatch_id: int, phase: str | None, now: float) -> None:
    """Record a batch dispatch's provider phase if it is not the one it was last seen in
    (called before the poll writes the new phase over `dispatches.phase`)."""
    from lowtide.store.schema import dispatch_phases

    if phase is None:
        return
    last = conn.execute(select(dispatches.c.phase).where(dispatches.c.id == dispatch_id)).scalar()
    if phase != last:
        conn.execute(insert(dispatch_phases).values(dispatch_id=dispatch_id, phase=phase, at=now))


def add_event(conn: Connection, job_id: int | None, kind: str, message: str, now: float) -> None:
    conn.execute(insert(events).values(job_id=job_id, at=now, kind=kind, message=message))


def recent_events(conn: Connection, job_id: int, limit: int = 10) -> list[Row]:
    stmt = select(events).where(events.c.job_id == job_id).order_by(events.c.id.desc()).limit(limit)
    return list(conn.execute(stmt))


def token_totals(conn: Connection, job_id: int) -> dict[str, Any]:
    """Attempts, tokens and cost of a job: `cost_picousd` sums the known costs,
    `unknown_cost` counts the attempts whose cost is unknown (billed, or from before m004)."""
    from lowtide.store.schema import attempts

    unknown = and_(attempts.c.cost_picousd.is_(None), or_(attempts.c.billed.is_(None), attempts.c.billed.is_(True)))
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(attempts.c.input_tokens), 0),
            func.coalesce(func.sum(attempts.c.output_tokens), 0),
            func.coalesce(func.sum(attempts.c.cost_picousd), 0),
            func.coalesce(func.sum(case((unknown, 1), else_=0)), 0),
        ).where(attempts.c.job_id == job_id)
    ).one()
    return {
        "attempts": row[0], "input_tokens": row[1], "output_tokens": row[2],
        "cost_picousd": int(row[3]), "unknown_cost": int(row[4]),
    }  # fmt: skip


# A job's pending requests by lane, read off the partial lane index (ix_requests_pending_lane:
# job_id, state, lane, ...) by seeks on both databases. PostgreSQL leaves `state = 'pending'`
# out of a plain read's index condition (the partial index implies it), and with no condition
# on `state` it cannot seek on `lane`: it reads every pending entry of the job (50 ms at
# 1,000,000 pending). A bound on the row value (state, lane), which the index implies nothing
# about, keeps its seek; SQLite seeks on the plain `lane` condition beside it and only checks
# the row value. (A FOR UPDATE read keeps every condition: the claims need none of this.)
def pending_on_lane(job_id: int, lane: str) -> ColumnElement[bool]:
    """The condition for a job's pending requests on `lane`, as an index range."""
    at, bound = tuple_(requests.c.state, requests.c.lane), tuple_(PENDING, literal(lane))
    return and_(requests.c.job_id == job_id, requests.c.state == PENDING, requests.c.lane == lane, at >= bound, at <= bound)


def pending_lanes(conn: Connection, job_id: int) -> set[str]:
    """Each lane with pending requests of the job, found as the least lane after the last one
    found: one index seek per lane (a skip scan), instead of a GROUP BY over every row."""
    first = (
        select(requests.c.lane)
        .where(requests.c.job_id == job_id, requests.c.state == PENDING)
        .order_by(requests.c.lane)
        .limit(1)
    )
    found: set[str] = set()
    lane = conn.execute(first).scalar()
    while lane is not None:
        found.add(lane)
        after = tuple_(requests.c.state, requests.c.lane) > tuple_(PENDING, literal(lane))
        lane = conn.execute(first.where(requests.c.lane > lane, after)).scalar()
    return found
