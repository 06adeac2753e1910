"""Who owns which upstream object (`gateway_objects`): the only code that reads or writes it.

The upstream knows one key, the gateway's, so it cannot tell tenants apart; the gateway
records each file and batch a tenant creates (and each output file it is shown) and lets
only that tenant reach it. An object nobody recorded is nobody's: 404 for every tenant.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, and_, delete, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.store.db import Store
from lowtide.store.gateway_schema import gateway_objects

OBJ = gateway_objects.c


def record(store: Store, tenant: str, api: str, kind: str, object_ids: Sequence[str], now: float) -> None:
    """`tenant` owns these objects; one already recorded keeps its first owner."""
    ids = [i for i in dict.fromkeys(object_ids) if i]
    if not ids:
        return
    insert = (sqlite.insert if store.is_sqlite else postgresql.insert)(gateway_objects)
    stmt = insert.on_conflict_do_nothing(index_elements=["api", "kind", "object_id"])
    with store.begin() as conn:
        conn.execute(stmt, [{"api": api, "kind": kind, "object_id": i, "tenant": tenant, "created_at": now} for i in ids])


def _this(api: str, kind: str, object_id: str) -> ColumnElement[bool]:
    return and_(OBJ.api == api, OBJ.kind == kind, OBJ.object_id == object_id)


def owner(store: Store, api: str, kind: str, object_id: str) -> str | None:
    with store.read() as conn:
        return conn.execute(select(OBJ.tenant).where(_this(api, kind, object_id))).scalar()


def forget(store: Store, api: str, kind: str, object_id: str) -> None:
    with store.begin() as conn:
        conn.execute(delete(gateway_objects).where(_this(api, kind, object_id)))


def page(store: Store, tenant: str, api: str, kind: str, limit: int, after: str | None = None,
         before: str | None = None) -> list[str]:  # fmt: skip
    """The tenant's object ids, newest first: up to `limit` older than `after`, or (with
    `before`) the `limit` just newer than it. An unknown cursor reads as no cursor."""
    mine = and_(OBJ.tenant == tenant, OBJ.api == api, OBJ.kind == kind)
    newest_first = (OBJ.created_at.desc(), OBJ.object_id.desc())
    with store.read() as conn:
        cursor = after if after is not None else before
        anchor = conn.execute(select(OBJ.created_at).where(mine, OBJ.object_id == cursor)).scalar() if cursor else None
        stmt = select(OBJ.object_id).where(mine)
        if anchor is None:
            return list(conn.scalars(stmt.order_by(*newest_first).limit(limit)))
        if after is not None:
            older = or_(OBJ.created_at < anchor, and_(OBJ.created_at == anchor, OBJ.object_id < cursor))
            return list(conn.scalars(stmt.where(older).order_by(*newest_first).limit(limit)))
        newer = or_(OBJ.created_at > anchor, and_(OBJ.created_at == anchor, OBJ.object_id > cursor))
        return list(reversed(conn.scalars(stmt.where(newer).order_by(OBJ.created_at, OBJ.object_id).limit(limit)).all()))


class Owners:
    """`owner` through a cache, for the passthrough's hot checks (a batch being polled). An
    owner never changes once recorded — the first claim wins and nothing updates it — so a
    known owner is remembered; an unknown object is asked again every time (it may be
    recorded later), and `forget` drops it here too."""

    def __init__(self, store: Store, size: int = 100_000):
        self.store = store
        self.size = size
        self._known: dict[tuple[str, str, str], str] = {}

    def cached(self, api: str, kind: str, object_id: str) -> str | None:
        return self._known.get((api, kind, object_id))

    def owner(self, api: str, kind: str, object_id: str) -> str | None:
        key = (api, kind, object_id)
        found = self._known.get(key)
        if found is None:
            found = owner(self.store, api, kind, object_id)
            if found is not None:
                if len(self._known) >= self.size:
                    self._known.clear()  # rare and harmless: the store still knows
                self._known[key] = found
        return found

    def forget(self, api: str, kind: str, object_id: str) -> None:
        self._known.pop((api, kind, object_id), None)
        forget(self.store, api, kind, object_id)
