"""A request's payload as stored: whole, or its job's shared head and the row's own part.

The loader writes most of a job's payloads as one text around each row's own part (its
messages): `head + own + "}}"` (engine/loader.py `RowRenderer`). The head (the endpoint,
lowtide's asks, the body's fixed keys: a JSON schema or tools can be kilobytes) is the same
in every row, so it is stored once per job (`payload_heads`) and a request keeps its own part
and `head_id`. SQLite rewrites a whole row at the claim and at the answer, and a 100,000-row
job wrote the head 300,000 times (bench/pipeline.py, docs/scale.md). A payload of any other
form (a row's own body, one stored before m026, a pruned one) is stored whole, `head_id` NULL.

Readers take the whole text from `payload_text` (SQL, one lookup of the head's primary key per
row) and its size from `payload_chars` / `payload_bytes`, as the provider is sent it.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import ColumnElement, Connection, Table, case, func, literal, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.store.queries import stored_bytes
from lowtide.store.schema import payload_heads, requests

CLOSE = "}}"  # what a whole payload has after its own part: the body's and the payload's ends


def head_id(conn: Connection, job_id: int, text: str) -> int:
    """The id of the job's head `text`, stored now if it is new."""
    data = text.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    h = payload_heads.c
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(payload_heads)
    # Two loads of one job at once (PostgreSQL): the second waits for the first's row, then
    # takes it.
    conn.execute(
        insert.values(job_id=job_id, digest=digest, text=text, chars=len(text) + len(CLOSE), bytes=len(data) + len(CLOSE))
        .on_conflict_do_nothing(index_elements=["job_id", "digest"])
    )
    found, stored = conn.execute(select(h.id, h.text).where(h.job_id == job_id, h.digest == digest)).one()
    if stored != text:  # two heads of one digest: not in this universe, but never mixed up
        raise ValueError(f"payload head digest {digest} of job {job_id} holds another text")
    return found


def _head(table: Table, column: ColumnElement) -> ColumnElement:
    return select(column).where(payload_heads.c.id == table.c.head_id).scalar_subquery()


def payload_text(table: Table = requests) -> ColumnElement[str]:
    """The whole payload of a row of `table` (requests or request_versions), in SQL."""
    c = table.c
    whole = _head(table, payload_heads.c.text).op("||")(c.payload).op("||")(literal(CLOSE))
    return case((c.head_id.is_(None), c.payload), else_=whole)


def payload_chars(table: Table = requests) -> ColumnElement[int]:
    """The whole payload's length in characters, in SQL."""
    return func.length(table.c.payload) + func.coalesce(_head(table, payload_heads.c.chars), 0)


def payload_bytes(table: Table = requests) -> ColumnElement[int]:
    """The whole payload's length in bytes (UTF-8), in SQL."""
    return stored_bytes(table.c.payload) + func.coalesce(_head(table, payload_heads.c.bytes), 0)


def head_texts(conn: Connection, ids: set[int | None]) -> dict[int, str]:
    """The texts of the heads `ids` names (None among them is none)."""
    wanted = [i for i in ids if i is not None]
    if not wanted:
        return {}
    return dict(conn.execute(select(payload_heads.c.id, payload_heads.c.text).where(payload_heads.c.id.in_(wanted))).all())


def whole(head: str | None, payload: str) -> str:
    """The whole payload of a stored own part and its head's text (None: stored whole)."""
    return payload if head is None else head + payload + CLOSE
