"""Claiming pending requests into a dispatch, and building what a route is handed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from sqlalchemy import ColumnElement, Connection, Row, Select, func, insert, select, update

from lowtide.core import fastjson
from lowtide.core.states import DispatchState, RequestState
from lowtide.core.types import Request
from lowtide.engine import fate
from lowtide.store.bulk import among
from lowtide.store.payloads import head_texts, payload_bytes, whole
from lowtide.store.schema import PENDING, dispatches, requests


def pending_ids(conn: Connection, job_id: int, now: float, limit: int, lane: str | None = None) -> list[int]:
    """Up to `limit` pending requests that are due, oldest first (of one lane, when the job
    has a fallback route). On PostgreSQL rows another worker is claiming are skipped rather
    than waited for."""
    return list(conn.scalars(_due(conn, job_id, now, limit, lane)))


def claim_due(
    conn: Connection,
    dispatch_id: int,
    job_id: int,
    now: float,
    limit: int,
    route: str,
    lane: str | None = None,
    max_bytes: int | None = None,
) -> int:
    """Move up to `limit` due pending requests into a dispatch, and with `max_bytes` only as
    many as fit in that much stored payload (always at least one): on SQLite in one statement
    (the ids never travel to Python and back). On PostgreSQL the ids are read first: inside
    an UPDATE the planner may run a `LIMIT … FOR UPDATE SKIP LOCKED` subquery once per row
    (a semi-join), which claims every due request instead of `limit`."""
    if conn.dialect.name == "postgresql":  # the ids as one array parameter, not one each
        if max_bytes is None:
            ids = list(conn.scalars(_due(conn, job_id, now, limit, lane)))
        else:
            sized = _due(conn, job_id, now, limit, lane, payload_bytes())
            ids = [rid for rid, _ in _fitting(conn, sized, max_bytes)]
        which = among(conn, requests.c.id, ids)
    else:
        if max_bytes is not None:  # the write lock is held: the same rows come first again below
            limit = _fitting_count(conn, job_id, now, limit, lane, max_bytes)
        which = requests.c.id.in_(_due(conn, job_id, now, limit, lane))
    moved = _move_into(conn, dispatch_id, which, route, now)
    conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(size=moved))
    return moved


def _fitting(conn: Connection, sized, max_bytes: int) -> list[Row]:
    """The leading (id, size) rows of `sized` whose sizes add up to at most `max_bytes`, and
    at least one. Stops reading at the first that does not fit, so a claim of big payloads
    reads the sizes of only what it takes."""
    out: list[Row] = []
    total = 0
    with conn.execute(sized) as rows:
        for row in rows:
            total += row[1] or 0
            if out and total > max_bytes:
                break
            out.append(row)
    return out


PROBE = 16  # rows whose sizes are read first, to tell small payloads from big ones


def _fitting_count(conn: Connection, job_id: int, now: float, limit: int, lane: str | None, max_bytes: int) -> int:
    """How many of the first `limit` due requests fit in `max_bytes` of payload (at least
    one; on SQLite, where the sizes are read row by row). Small payloads, the usual case, are
    summed by one SQL aggregate, with no Python per row; where the first few say that the
    claim may not fit, the sizes are read one by one up to the first that does not, so big
    payloads are read no further than the claim goes."""
    sized = _due(conn, job_id, now, limit, lane, payload_bytes())
    head = [size or 0 for _, size in conn.execute(sized.limit(min(limit, PROBE)))]
    fit = _prefix(head, max_bytes)
    if fit < len(head) or len(head) < PROBE or len(head) == limit:
        return fit  # the claim ends among the first few, or they are all there is
    small = sum(head) * limit * 2 <= max_bytes * len(head)  # all `limit` like them: half the bound
    if small and (conn.scalar(select(func.sum(sized.subquery().c[1]))) or 0) <= max_bytes:
        return limit
    return len(_fitting(conn, sized, max_bytes))


def _prefix(sizes: list[int], max_bytes: int) -> int:
    """How many of the leading sizes add up to at most `max_bytes` (at least one)."""
    total = 0
    for taken, size in enumerate(sizes):
        total += size
        if taken and total > max_bytes:
            return taken
    return len(sizes)


def _due(conn: Connection, job_id: int, now: float, limit: int, lane: str | None = None, *also: ColumnElement):
    stmt = (
        select(requests.c.id, *also)
        .where(
            requests.c.job_id == job_id,
            requests.c.state == PENDING,  # with a lane: off the partial index of pending requests by lane
            requests.c.not_before <= now,
        )
        .order_by(requests.c.not_before, requests.c.id)  # the index's order: no sort
        .limit(limit)
    )
    if lane is not None:
        stmt = stmt.where(requests.c.lane == lane)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return stmt


def new_dispatch(
    conn: Connection, job_id: int, route: str, kind: str, state: DispatchState, now: float, **values
) -> int:
    key = f"lt-{job_id}-{uuid.uuid4().hex}"
    result = conn.execute(
        insert(dispatches).values(
            job_id=job_id, route=route, kind=kind, key=key, state=state.value, size=0, created_at=now, **values
        )
    )
    return result.inserted_primary_key[0]


def assign(conn: Connection, dispatch_id: int, ids: list[int], route: str, now: float) -> int:
    """Move pending requests into a dispatch; each move counts as an attempt."""
    moved = _move_into(conn, dispatch_id, among(conn, requests.c.id, ids), route, now)
    conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(size=moved))
    return moved


def _move_into(conn: Connection, dispatch_id: int, which: ColumnElement[bool], route: str, now: float) -> int:
    """The pending requests `which` selects join the dispatch: one attempt each."""
    return fate.send(conn, dispatch_id, which, route, now)


def dispatched_requests(conn: Connection, dispatch_id: int, after: int = 0, limit: int | None = None) -> list[Request]:
    """The requests still in a dispatch (with ids above `after`), as the route should see them."""
    out = []
    rows = conn.execute(dispatched_page(dispatch_id, after, limit)).all()
    payloads = PayloadReader() if len(rows) > 2 else None  # (learning the head costs two reads more)
    heads = head_texts(conn, {row[3] for row in rows})
    for rid, cid, payload, head_id, repair, attempt in rows:
        if payloads is not None:
            read = payloads.read(payload) if head_id is None else payloads.read_own(heads[head_id], payload)
        else:
            read = fastjson.loads(whole(heads.get(head_id), payload))
        request = Request.from_payload(cid, read, attempt)
        if repair:
            request.add_turns(fastjson.loads(repair))
        request.row_id = rid
        out.append(request)
    return out


# A row's own part (its conversation) read apart holds fewer brackets than this: it and the
# whole payload nest far less deep than either JSON reader stops at, so both read it alike.
OWN_BRACKETS = 200


class PayloadReader:
    """Reads a page of one dispatch's stored payloads, each to what `fastjson.loads` makes of
    it. A job's payloads are one text around each row's own part (engine/loader.py writes
    `prefix + messages + "}}"`): the text before that part, the head, is read once, and of
    each payload that starts with it only its own part. The head is learnt from the first
    payload and proven before it is used: read with `0` and with `1` in the part's place, the
    two differ at one place alone, the body's last key (so the part is a whole JSON value
    there, and nothing around it changes). A payload that does not fit (another head, a part
    that is not one value, too many brackets) is read whole, as before.

    The rows share the head's values (the endpoint, lowtide's asks, the body's fixed keys
    such as its JSON ask): no route changes a body's values in place (a body is copied before
    it is changed: `Request.model`, `add_turns`). Each row's payload and body are its own dicts."""

    def __init__(self) -> None:
        self.head: str | None = None  # the text before a row's own part
        self.skeleton: dict = {}  # the head read with `0` in the part's place
        self.keys: tuple = ()  # where the part is: skeleton[keys[0]][keys[1]]
        self.learnt = False

    def read(self, text: str | bytes) -> object:
        head = self.head
        if head is not None and text.__class__ is str and text.startswith(head) and text.endswith("}}"):
            own = text[len(head) : -2]
            if own.count("[") + own.count("{") < OWN_BRACKETS:
                try:
                    value = fastjson.loads(own)
                except ValueError:  # not one JSON value: the whole text says what it is
                    pass
                else:
                    return self._with(value)
        payload = fastjson.loads(text)
        if not self.learnt:
            self.learnt = True
            self._learn(text, payload)
        return payload

    def read_own(self, head: str, own: str) -> object:
        """`read` of the whole payload `head + own + "}}"` (one stored as its job's head and its
        own part: store/payloads.py), without building it once the head is learnt."""
        if head == self.head and own.count("[") + own.count("{") < OWN_BRACKETS:
            try:
                return self._with(fastjson.loads(own))
            except ValueError:  # not one JSON value: the whole text says what it is
                pass
        return self.read(whole(head, own))

    def _with(self, value: object) -> dict:
        outer, inner = self.keys
        body = dict(self.skeleton[outer])
        body[inner] = value
        payload = dict(self.skeleton)
        payload[outer] = body
        return payload

    def _learn(self, text: str | bytes, payload: object) -> None:
        """The head of `text` (read as `payload`), where it can be proven (see the class doc)."""
        if text.__class__ is not str or payload.__class__ is not dict or not payload:
            return
        outer = next(reversed(payload))
        body = payload[outer]
        if body.__class__ is not dict or not body:
            return
        inner = next(reversed(body))
        tail = fastjson.dumps(body[inner]) + "}}"
        if not text.endswith(tail):
            return
        head = text[: -len(tail)]
        if not head.rstrip().endswith(":"):  # the part must start a value, not end a number or a string
            return
        try:
            zero, one = fastjson.loads(head + "0}}"), fastjson.loads(head + "1}}")
        except ValueError:
            return
        if not all(read.__class__ is dict and read.get(outer).__class__ is dict for read in (zero, one)):
            return
        # The two texts differ in that token alone, so where their values differ is where it is.
        if zero[outer].get(inner).__class__ is int and one[outer].get(inner).__class__ is int and (zero[outer][inner], one[outer][inner]) == (0, 1):
            self.head, self.skeleton, self.keys = head, zero, (outer, inner)


def dispatched_page(dispatch_id: int, after: int = 0, limit: int | None = None) -> Select:
    """The stored rows of `dispatched_requests`: one range of ix_requests_dispatch (dispatch,
    id), in id order."""
    stmt = (
        select(requests.c.id, requests.c.custom_id, requests.c.payload, requests.c.head_id, requests.c.repair, requests.c.attempts)
        .where(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value)
        .order_by(requests.c.id)
        .limit(limit)
    )
    if after:  # only when paging: a bare `id > 0` lets SQLite walk the whole table by id
        stmt = stmt.where(requests.c.id > after)
    return stmt


def iter_dispatched(store, dispatch_id: int, page: int = 1000) -> Iterator[Request]:
    """The same, a page at a time, each page in its own short transaction: a 50,000-request
    batch is written out without holding it in memory or the store's write lock."""
    after = 0
    while True:
        with store.begin() as conn:
            chunk = dispatched_requests(conn, dispatch_id, after, page)
        yield from chunk
        if len(chunk) < page:
            return
        after = chunk[-1].row_id


def left_in_dispatch(conn: Connection, dispatch_id: int) -> list[str]:
    """custom_ids still waiting on this dispatch (no outcome was applied for them)."""
    return list(
        conn.scalars(
            select(requests.c.custom_id).where(
                requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value
            )
        )
    )
