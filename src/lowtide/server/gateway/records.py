"""The gateway's rows: the only code that writes a deferred request's `state` or `delivery`,
or a flush's `state`, each move checked against its table (as `store/transitions.py` does
for jobs), inside the caller's transaction.

    DeferredState:  accepted → queued → succeeded | failed
    Delivery:       none | pending → delivered | dead        (pending → pending: retry)
    FlushState:     loading → running → done      (loading → done: the job could not be loaded)
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, bindparam, func, insert, select, update

from lowtide.core.states import check_transition
from lowtide.store.bulk import executemany
from lowtide.store.gateway_schema import gateway_flushes, gateway_requests

G = gateway_requests.c
F = gateway_flushes.c


class DeferredState(StrEnum):
    ACCEPTED = "accepted"  # stored, answered 202, waiting for a flush
    QUEUED = "queued"  # in a flush's lowtide job
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Delivery(StrEnum):
    NONE = "none"  # no callback URL
    PENDING = "pending"  # a result to deliver (or to try again at next_delivery_at)
    DELIVERED = "delivered"
    DEAD = "dead"  # every attempt failed: a dead letter


class FlushState(StrEnum):
    LOADING = "loading"  # requests assigned; the job may not be loaded yet
    RUNNING = "running"  # the job is loaded; results are collected as they land
    DONE = "done"


D, V = DeferredState, Delivery
STATE_TRANSITIONS = {
    D.ACCEPTED: frozenset({D.QUEUED}),
    D.QUEUED: frozenset({D.SUCCEEDED, D.FAILED}),
    D.SUCCEEDED: frozenset(),
    D.FAILED: frozenset(),
}
DELIVERY_TRANSITIONS = {
    V.NONE: frozenset(),
    V.PENDING: frozenset({V.PENDING, V.DELIVERED, V.DEAD}),
    V.DELIVERED: frozenset(),
    V.DEAD: frozenset({V.PENDING}),  # `lowtide gateway-status --redeliver`
}
FLUSH_TRANSITIONS = {
    FlushState.LOADING: frozenset({FlushState.RUNNING, FlushState.DONE}),  # done: its job could not be loaded
    FlushState.RUNNING: frozenset({FlushState.DONE}),
    FlushState.DONE: frozenset(),
}
LIVE_STATES = (D.ACCEPTED.value, D.QUEUED.value)


def new_deferred_id() -> str:
    """`dfr_` + 24 URL-safe characters (144 random bits): a valid custom_id for every route."""
    return "dfr_" + secrets.token_urlsafe(18)


# Accepting ----------------------------------------------------------------------------
_INSERT = insert(gateway_requests)


def insert_accepted(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """New deferred requests, all in state `accepted` (the group-commit writer's one write)."""
    executemany(conn, _INSERT, rows)


def accepted_row(**values: Any) -> dict[str, Any]:
    """A full row for `insert_accepted`: every column named, so one compiled INSERT fits all."""
    row = dict.fromkeys(c.name for c in gateway_requests.columns)
    row.update(state=D.ACCEPTED.value, delivery_attempts=0, **values)
    row["delivery"] = V.PENDING.value if values.get("callback_url") else V.NONE.value
    return row


# Moving states ------------------------------------------------------------------------
def move(conn: Connection, ids: Sequence[str], current: DeferredState, target: DeferredState, **values: Any) -> int:
    """Move requests still in `current` to `target`; returns how many moved."""
    check_transition(STATE_TRANSITIONS, current, target)
    if not ids:
        return 0
    stmt = update(gateway_requests).where(G.id.in_(list(ids)), G.state == current.value).values(state=target.value, **values)
    return conn.execute(stmt).rowcount


def finish(conn: Connection, results: Sequence[dict[str, Any]]) -> int:
    """Record results of queued requests: each dict has `gid`, `target` (succeeded|failed),
    and the result columns. The caller read them as queued in this transaction; the WHERE
    still leaves any request already finished as it is."""
    n = 0
    for target in (D.SUCCEEDED, D.FAILED):
        rows = [r for r in results if r["target"] == target.value]
        if not rows:
            continue
        check_transition(STATE_TRANSITIONS, D.QUEUED, target)
        stmt = (
            update(gateway_requests)
            .where(G.id == bindparam("gid"), G.state == D.QUEUED.value)
            .values(
                state=target.value, route=bindparam("route"), result=bindparam("result"),
                result_status=bindparam("result_status"), input_tokens=bindparam("input_tokens"),
                output_tokens=bindparam("output_tokens"), saved_picousd=bindparam("saved_picousd"),
                finished_at=bindparam("finished_at"), next_delivery_at=bindparam("finished_at"),
            )
        )  # fmt: skip
        keys = ("gid", "route", "result", "result_status", "input_tokens", "output_tokens", "saved_picousd", "finished_at")
        executemany(conn, stmt, [{k: r[k] for k in keys} for r in rows])
        n += len(rows)
    return n


def move_delivery(conn: Connection, gid: str, current: Delivery, target: Delivery, claim: float | None = None,
                  **values: Any) -> bool:  # fmt: skip
    """Move a delivery; with `claim`, only while the attempt's claim (claim_delivery's
    `until`) still holds it — once lapsed and taken by another attempt, nothing moves."""
    check_transition(DELIVERY_TRANSITIONS, current, target)
    stmt = update(gateway_requests).where(G.id == gid, G.delivery == current.value)
    if claim is not None:
        stmt = stmt.where(G.next_delivery_at == claim)
    return conn.execute(stmt.values(delivery=target.value, **values)).rowcount == 1


def move_flush(conn: Connection, flush_id: int, current: FlushState, target: FlushState, **values: Any) -> bool:
    check_transition(FLUSH_TRANSITIONS, current, target)
    stmt = update(gateway_flushes).where(F.id == flush_id, F.state == current.value).values(state=target.value, **values)
    return conn.execute(stmt).rowcount == 1


# Flushing -----------------------------------------------------------------------------
def waiting_groups(conn: Connection) -> list[Row]:
    """Accepted requests by (api, model): how many, the oldest, the earliest deadline."""
    return list(
        conn.execute(
            select(G.api, G.model, func.count().label("n"), func.min(G.accepted_at).label("oldest"),
                   func.min(G.deadline_at).label("deadline"))  # fmt: skip
            .where(G.state == D.ACCEPTED.value)
            .group_by(G.api, G.model)
        )
    )


def create_flush(conn: Connection, api: str, model: str, limit: int, now: float, due_by: float | None = None) -> Row | None:
    """Take up to `limit` accepted requests of (api, model), oldest first, into a new flush;
    with `due_by`, only those whose deadline is at or before it."""
    stmt = select(G.id).where(G.state == D.ACCEPTED.value, G.api == api, G.model == model)
    if due_by is not None:
        stmt = stmt.where(G.deadline_at <= due_by)
    ids = list(conn.scalars(stmt.order_by(G.accepted_at, G.id).limit(limit)))
    if not ids:
        return None
    deadline = conn.execute(select(func.min(G.deadline_at)).where(G.id.in_(ids))).scalar_one()
    flush_id = conn.execute(
        insert(gateway_flushes).values(api=api, model=model, state=FlushState.LOADING.value, size=len(ids),
                                       deadline_at=deadline, created_at=now)  # fmt: skip
    ).inserted_primary_key[0]
    name = f"gateway-{flush_id}"
    conn.execute(update(gateway_flushes).where(F.id == flush_id).values(job_name=name))
    for start in range(0, len(ids), 500):
        move(conn, ids[start : start + 500], D.ACCEPTED, D.QUEUED, flush_id=flush_id)
    return get_flush(conn, flush_id)


def get_flush(conn: Connection, flush_id: int) -> Row:
    return conn.execute(select(gateway_flushes).where(F.id == flush_id)).one()


def flushes_in(conn: Connection, state: FlushState) -> list[Row]:
    return list(conn.execute(select(gateway_flushes).where(F.state == state.value).order_by(F.id)))


def flush_rows(conn: Connection, flush_id: int) -> list[Row]:
    return list(conn.execute(select(G.id, G.payload).where(G.flush_id == flush_id).order_by(G.accepted_at, G.id)))


def queued_left(conn: Connection, flush_id: int) -> int:
    return conn.execute(select(func.count()).where(G.flush_id == flush_id, G.state == D.QUEUED.value)).scalar_one()


# Reading ------------------------------------------------------------------------------
def get_deferred(conn: Connection, gid: str) -> Row | None:
    return conn.execute(select(gateway_requests).where(G.id == gid)).first()


def list_deferred(conn: Connection, tenant: str, limit: int, after: str | None = None) -> list[Row]:
    stmt = select(gateway_requests).where(G.tenant == tenant)
    if after is not None:
        anchor = conn.execute(select(G.accepted_at).where(G.id == after, G.tenant == tenant)).scalar()
        if anchor is not None:
            stmt = stmt.where((G.accepted_at < anchor) | ((G.accepted_at == anchor) & (G.id < after)))
    return list(conn.execute(stmt.order_by(G.accepted_at.desc(), G.id.desc()).limit(limit)))


def pending_by_tenant(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(G.tenant, func.count()).where(G.state.in_(LIVE_STATES)).group_by(G.tenant))
    return {tenant: n for tenant, n in rows}


def _deliverable(skip_tenants: Sequence[str], skip_ids: Sequence[str]) -> list[ColumnElement[bool]]:
    where = [G.delivery == V.PENDING.value, G.state.in_([D.SUCCEEDED.value, D.FAILED.value])]
    if skip_tenants:
        where.append(G.tenant.not_in(list(skip_tenants)))
    if skip_ids:
        where.append(G.id.not_in(list(skip_ids)))
    return where


def due_deliveries(conn: Connection, now: float, limit: int, per_tenant: int, skip_tenants: Sequence[str] = (),
                   skip_ids: Sequence[str] = ()) -> list[Row]:  # fmt: skip
    """Up to `limit` deliveries due by `now`, oldest due first, at most `per_tenant` of any
    one tenant (a tenant with thousands due does not hide another's), none of `skip_tenants`
    or `skip_ids` (attempts this gateway has in flight)."""
    rank = func.row_number().over(partition_by=G.tenant, order_by=(G.next_delivery_at, G.id)).label("rank")
    due = select(G.id, rank).where(*_deliverable(skip_tenants, skip_ids), G.next_delivery_at <= now).subquery()
    stmt = (
        select(gateway_requests)
        .join(due, due.c.id == G.id)
        .where(due.c.rank <= per_tenant)
        .order_by(G.next_delivery_at, G.id)
        .limit(limit)
    )
    return list(conn.execute(stmt))


def claim_delivery(conn: Connection, gid: str, seen_due: float, until: float) -> bool:
    """Take a due delivery for one attempt: its due time moves to `until`, if it still is the
    one read (`seen_due`). Another gateway on the store, or a later pass, finds it not due
    while the attempt runs; one that died mid-attempt leaves it due again at `until`."""
    stmt = (
        update(gateway_requests)
        .where(G.id == gid, G.delivery == V.PENDING.value, G.next_delivery_at == seen_due)
        .values(next_delivery_at=until)
    )
    return conn.execute(stmt).rowcount == 1


def next_delivery_time(conn: Connection, skip_tenants: Sequence[str] = (), skip_ids: Sequence[str] = ()) -> float | None:
    return conn.execute(select(func.min(G.next_delivery_at)).where(*_deliverable(skip_tenants, skip_ids))).scalar()


def summary(conn: Connection) -> dict[str, Any]:
    """Counts for `/metrics` and `lowtide gateway-status`."""
    by_state = dict(conn.execute(select(G.state, func.count()).group_by(G.state)).all())
    by_decision = dict(conn.execute(select(G.decision, func.count()).group_by(G.decision)).all())
    by_delivery = dict(conn.execute(select(G.delivery, func.count()).group_by(G.delivery)).all())
    saved = conn.execute(select(func.coalesce(func.sum(G.saved_picousd), 0))).scalar_one()
    return {"state": by_state, "decision": by_decision, "delivery": by_delivery, "saved_picousd": int(saved)}


def redeliver_dead(conn: Connection, now: float) -> int:
    """Every dead delivery back to pending, with a fresh set of attempts."""
    check_transition(DELIVERY_TRANSITIONS, V.DEAD, V.PENDING)
    stmt = update(gateway_requests).where(G.delivery == V.DEAD.value)
    return conn.execute(stmt.values(delivery=V.PENDING.value, delivery_attempts=0, next_delivery_at=now)).rowcount


def dead_letters(conn: Connection, limit: int = 50) -> list[Row]:
    return list(
        conn.execute(
            select(G.id, G.tenant, G.delivery_attempts, G.delivery_error, G.finished_at)
            .where(G.delivery == V.DEAD.value)
            .order_by(G.finished_at.desc())
            .limit(limit)
        )
    )
