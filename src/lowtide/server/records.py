"""The server's rows: API batches and files. One place writes a batch's status, and checks
each move against `TRANSITIONS` (as `lowtide.store.transitions` does for jobs).

Both APIs share one lifecycle, in OpenAI's words (Anthropic's view is derived from it):

    validating → in_progress → finalizing → completed
    validating → failed                       (the input file is refused)
    in_progress → expired                     (the 24 h window passed)
    validating | in_progress → cancelling → cancelled
"""

from __future__ import annotations

import json
import secrets
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from lowtide.core.states import check_transition
from lowtide.store.schema import serve_batches, serve_files


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


S = BatchStatus
TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    S.VALIDATING: frozenset({S.IN_PROGRESS, S.FAILED, S.CANCELLING}),
    S.IN_PROGRESS: frozenset({S.FINALIZING, S.EXPIRED, S.CANCELLING}),
    S.FINALIZING: frozenset({S.COMPLETED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.EXPIRED: frozenset(),
    S.CANCELLED: frozenset(),
}
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.EXPIRED, S.CANCELLED})
LIVE = tuple(s.value for s in S if s not in TERMINAL)
# The column stamped when a batch enters each status.
STAMP = {s: f"{s.value}_at" for s in S if s is not S.VALIDATING}


def new_id(prefix: str, length: int = 24) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return prefix + "".join(secrets.choice(alphabet) for _ in range(length))


def move_batch(conn: Connection, batch_id: str, current: BatchStatus, target: BatchStatus, now: float, **values: Any) -> bool:
    """Move a batch from `current` to `target`, stamping `<target>_at`; False if it had
    already left `current` (a cancel came in between, say)."""
    check_transition(TRANSITIONS, current, target)
    stmt = (
        update(serve_batches)
        .where(serve_batches.c.id == batch_id, serve_batches.c.status == current.value)
        .values(status=target.value, **{STAMP[target]: now}, **values)
    )
    return conn.execute(stmt).rowcount == 1


def insert_batch(conn: Connection, **values: Any) -> None:
    for key in ("metadata", "jobs", "faults"):
        if key in values and not isinstance(values[key], str):
            values[key] = json.dumps(values[key])
    conn.execute(insert(serve_batches).values(status=BatchStatus.VALIDATING.value, **values))


def set_batch(conn: Connection, batch_id: str, **values: Any) -> None:
    """Write columns other than the status (jobs, totals) whatever the status is."""
    assert "status" not in values, "use move_batch"
    conn.execute(update(serve_batches).where(serve_batches.c.id == batch_id).values(**values))


def get_batch(conn: Connection, batch_id: str, api: str | None = None) -> Row | None:
    stmt = select(serve_batches).where(serve_batches.c.id == batch_id)
    if api is not None:
        stmt = stmt.where(serve_batches.c.api == api)
    return conn.execute(stmt).first()


def live_batches(conn: Connection) -> list[Row]:
    return list(conn.execute(select(serve_batches).where(serve_batches.c.status.in_(LIVE)).order_by(serve_batches.c.seq)))


def list_batches(
    conn: Connection, api: str, limit: int, *, after: str | None = None, before: str | None = None
) -> tuple[list[Row], bool] | None:
    """A page of batches, newest first: older than `after`, or the `limit` just newer than
    `before`. None if a cursor names no batch. Returns (rows, has_more)."""
    stmt = select(serve_batches).where(serve_batches.c.api == api)
    for cursor in (after, before):
        if cursor is not None and get_batch(conn, cursor, api) is None:
            return None
    if before is not None:
        seq = select(serve_batches.c.seq).where(serve_batches.c.id == before).scalar_subquery()
        rows = list(conn.execute(stmt.where(serve_batches.c.seq > seq).order_by(serve_batches.c.seq).limit(limit + 1)))
        more = len(rows) > limit
        return list(reversed(rows[:limit])), more
    if after is not None:
        seq = select(serve_batches.c.seq).where(serve_batches.c.id == after).scalar_subquery()
        stmt = stmt.where(serve_batches.c.seq < seq)
    rows = list(conn.execute(stmt.order_by(serve_batches.c.seq.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_batch(conn: Connection, batch_id: str) -> None:
    conn.execute(delete(serve_batches).where(serve_batches.c.id == batch_id))


# Each API has its own files, told apart by purpose: Gemini's are these two, every other
# purpose is OpenAI's (Anthropic's API here has no files). One API's list, get and delete
# never see another's: an OpenAI client that cleans up its files must not remove the
# responses a Gemini batch still points at, nor fail on a purpose its SDK does not know.
GEMINI_PURPOSES = ("gemini_input", "gemini_output")


def _of_api(stmt, api: str | None):
    if api is None:
        return stmt
    gemini = serve_files.c.purpose.in_(GEMINI_PURPOSES)
    return stmt.where(gemini if api == "gemini" else ~gemini)


def insert_file(conn: Connection, **values: Any) -> None:
    conn.execute(insert(serve_files).values(**values))


def get_file(conn: Connection, file_id: str, api: str | None = None) -> Row | None:
    """The file `file_id`; with `api` ("openai" or "gemini"), only if it is that API's."""
    return conn.execute(_of_api(select(serve_files).where(serve_files.c.id == file_id), api)).first()


def list_files(
    conn: Connection, limit: int, order: str, now: float, *, api: str, after: str | None = None, purpose: str | None = None
) -> tuple[list[Row], bool] | None:
    """A page of `api`'s files not expired at `now`, by created_at (`order` asc or desc; the
    id breaks ties), after the file `after`. None if `after` names no file of `api`. (rows, has_more)."""
    f = serve_files.c
    stmt = _of_api(select(serve_files).where((f.expires_at.is_(None)) | (f.expires_at > now)), api)
    if purpose is not None:
        stmt = stmt.where(f.purpose == purpose)
    if after is not None:
        cursor = get_file(conn, after, api)
        if cursor is None:
            return None
        at, ident = cursor.created_at, cursor.id
        later = (f.created_at > at) | ((f.created_at == at) & (f.id > ident))
        earlier = (f.created_at < at) | ((f.created_at == at) & (f.id < ident))
        stmt = stmt.where(later if order == "asc" else earlier)
    keys = (f.created_at, f.id) if order == "asc" else (f.created_at.desc(), f.id.desc())
    rows = list(conn.execute(stmt.order_by(*keys).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_file(conn: Connection, file_id: str) -> None:
    conn.execute(delete(serve_files).where(serve_files.c.id == file_id))


def jobs_of(row: Row) -> list[dict[str, str]]:
    """The lowtide jobs a batch runs as: [{"name", "model"}]."""
    return json.loads(row.jobs)


def faults_of(row: Row) -> dict[str, Any]:
    return json.loads(row.faults)


def begin_cancel(server: Any, batch_id: str, current: Any) -> BatchStatus:
    """Move a validating or in-progress batch to cancelling (both APIs' cancel). The worker
    may move it meanwhile: then look again. Returns the status the batch had."""
    while (status := current()) in (S.VALIDATING, S.IN_PROGRESS):
        with server.store.begin() as conn:
            moved = move_batch(conn, batch_id, status, S.CANCELLING, server.clock.now())
        if moved:
            server.notify()
            break
    return status
