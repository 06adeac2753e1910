"""The one place that writes a state column. Every change is checked against the transition
tables in `lowtide.core.states` and runs inside the caller's transaction, together with the
rows and counters that go with it (rq passes a pipeline to every write; we pass `conn`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, select, update

from lowtide.core.errors import JobGone
from lowtide.core.states import (
    DISPATCH_TRANSITIONS,
    JOB_TRANSITIONS,
    REQUEST_TRANSITIONS,
    DispatchState,
    JobState,
    RequestState,
    check_transition,
)
from lowtide.store.bulk import executemany, fixed, guard
from lowtide.store.schema import dispatches, jobs, requests


def request_sources(target: RequestState, only: Iterable[RequestState] | None = None) -> list[str]:
    """The states a request may move to `target` from (optionally narrowed to `only`)."""
    sources = {s for s, targets in REQUEST_TRANSITIONS.items() if target in targets}
    if only is not None:
        only = set(only)
        illegal = only - sources
        if illegal:
            check_transition(REQUEST_TRANSITIONS, next(iter(illegal)), target)
        sources &= only
    return sorted(sources)


def move_requests(
    conn: Connection,
    target: RequestState,
    where: ColumnElement[bool],
    *,
    only: Iterable[RequestState] | None = None,
    values: dict[str, Any] | None = None,
) -> int:
    """Move every request matching `where` (and in a legal source state) to `target`."""
    stmt = (
        update(requests)
        .where(where, requests.c.state.in_(request_sources(target, only)))
        .values(state=target.value, **(values or {}))
    )
    return conn.execute(stmt).rowcount


def settle_dispatched(
    conn: Connection,
    target: RequestState,
    dispatch_id: int,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    shared: dict[str, Any] | None = None,
) -> None:
    """Apply per-request results to requests still in dispatch `dispatch_id`.

    Each row has `_id` and a value for every name in `columns`; `shared` gives the values
    every row gets. The guard `state = dispatched AND dispatch_id = …` makes a stale result
    a no-op even if the caller's read was out of date (DESIGN invariant 2).
    """
    if not rows:
        return
    check_transition(REQUEST_TRANSITIONS, RequestState.DISPATCHED, target)
    # What all rows share is written into the SQL, not bound: less to bind for 100,000 rows.
    # Each row is found by its id; the rest is a guard (store/bulk.py: one statement on PostgreSQL).
    stmt = (
        update(requests)
        .where(
            requests.c.id == bindparam("_id"),
            guard(conn, requests.c.dispatch_id, dispatch_id),
            guard(conn, requests.c.state, RequestState.DISPATCHED.value),
        )
        .values(
            state=fixed(conn, target.value),
            **{c: fixed(conn, v) for c, v in (shared or {}).items()},
            **{c: bindparam(c) for c in columns},
        )
    )
    executemany(conn, stmt, rows, by_key=True)


def move_dispatch(
    conn: Connection, dispatch_id: int, current: DispatchState, target: DispatchState, **values: Any
) -> bool:
    """Move one dispatch from `current` to `target`; False if it was no longer in `current`."""
    check_transition(DISPATCH_TRANSITIONS, current, target)
    stmt = (
        update(dispatches)
        .where(dispatches.c.id == dispatch_id, dispatches.c.state == current.value)
        .values(state=target.value, **values)
    )
    return conn.execute(stmt).rowcount == 1


def lock_job(conn: Connection, job_id: int) -> str:
    """The job's state, its row held until the caller's transaction ends: whoever changes a
    job's requests or state takes it first, so that "no live request, so finished" and "new
    requests, so active" never interleave. PostgreSQL: `SELECT … FOR NO KEY UPDATE`, which
    two takers (and any UPDATE of the row) wait on each other for, but a row that only
    names the job does not: inserting a dispatch, an attempt or an event takes the job's
    key share, which FOR UPDATE would make wait until the holder commits (one worker's
    claim behind another's whole write of answers). SQLite: every writing transaction
    already holds the whole store (BEGIN IMMEDIATE, store/db.py)."""
    stmt = select(jobs.c.state).where(jobs.c.id == job_id)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(key_share=True)
    state = conn.execute(stmt).scalar_one_or_none()
    if state is None:
        raise JobGone(f"job {job_id} is no longer in the store (deleted)")
    return state


def move_job(conn: Connection, job_id: int, target: JobState, **values: Any) -> bool:
    """Move a job to `target` if that is legal from where it is; False if it already was there.
    Either way the job's row is locked (`lock_job`) until the caller's transaction ends."""
    current = lock_job(conn, job_id)
    if current == target.value:
        return False
    check_transition(JOB_TRANSITIONS, JobState(current), target)
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=target.value, moves=jobs.c.moves + 1, **values))
    return True


def start_new_version(conn: Connection, rows: Sequence[dict[str, Any]], values: dict[str, Any]) -> None:
    """Succeeded requests (`rows`: {"_id", …}) start again as their next version, pending.

    Not a transition of the table: a succeeded request stays final. A new version is a new
    request under the same custom_id, made only by `--requeue-changed` after the old one's
    payload and answer were copied to `request_versions` (engine/changes.py); its attempts
    stay in the ledger. Only rows still succeeded are touched."""
    stmt = (
        update(requests)
        .where(requests.c.id == bindparam("_id"), guard(conn, requests.c.state, RequestState.SUCCEEDED.value))
        .values(state=RequestState.PENDING.value, version=requests.c.version + 1, **values)
    )
    executemany(conn, stmt, rows, by_key=True)
