"""Loading a job that is already stored: which rows it knows, which of them changed, and
re-queuing those on `--requeue-changed` (docs/jobs.md "Changing a job").

A stored request is matched to a source row by custom_id (also by the id it had before
integral floats were normalised, `lowtide.core.ids`), and is *changed* when the row renders
with another fingerprint (`RowRenderer.fingerprint`): the row's text, the template or the
spec changed. A request stored before fingerprints (m008) is compared by its payload.
A changed request is kept as it was unless asked; asked, it is re-rendered and queued again:

- pending: its payload is replaced;
- in a batch planned but not sent: the batch is taken apart first (nothing was sent);
- in a batch or call already sent: refused; that batch's answer is for the old payload. The
  states are read again with the rows locked (PostgreSQL) just before: a worker claiming one
  meanwhile is seen, not raced;
- failed or cancelled: queued again with a fresh attempt budget;
- succeeded: its answer is kept in `request_versions`, and the request starts again as a
  new version (`engine.fate.rerender`).

A spec that moves where a route's batches live (`core.spec_changes.CONNECTION_OPTIONS`) is
refused while one of the job's batches was sent there (`move_connections`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqlalchemy import Connection, bindparam, case, select, update

from lowtide.core.errors import SpecError
from lowtide.core.ids import key_of, legacy_custom_ids
from lowtide.core.spec_changes import Move
from lowtide.core.states import DispatchState, RequestState
from lowtide.engine import fate
from lowtide.engine.batches import end_watches
from lowtide.engine.context import JobContext
from lowtide.store.bulk import among, executemany
from lowtide.store.payloads import whole
from lowtide.store.schema import dispatches, jobs, request_versions, requests
from lowtide.store.transitions import lock_job

SENT = (DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value, DispatchState.RUNNING.value)
SENT_BATCH_STATES = (DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value)  # a create on its way, or made
IDS_NAMED = 5  # provider ids a refusal names


@dataclass(slots=True)
class Stored:
    id: int
    state: str
    fingerprint: str | None
    dispatch_id: int | None
    dispatch_state: str | None
    payload: str | None  # only for a request stored before fingerprints
    key: str  # its source_key

    def differs(self, item: dict, head: str | None) -> bool:
        """Does `item` (rendered now; `head`: the text its own part goes in, where it has a
        `head_id`) differ from what this request was rendered from?"""
        if self.fingerprint is None:
            return self.payload != whole(head if item["head_id"] is not None else None, item["payload"])
        return self.fingerprint != item["fingerprint"]


@dataclass(slots=True)
class Changes:
    """Changed requests seen while loading: (stored, new item) pairs, when they are to be
    re-queued; otherwise only counted."""

    count: int = 0
    pairs: list[tuple[Stored, dict]] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)  # a few "file row N (id X)" for the message


def split_known(
    conn: Connection, job_id: int, items: list[dict], variant: str | None = None
) -> tuple[list[dict], list[dict], dict[str, Stored]]:
    """The items with no stored request (to insert), the others, and their stored requests
    by custom_id. An item stored under its legacy custom_id takes that id, where the request
    stored there is its key's: two keys could share an 8-digit legacy id."""
    stored = _stored(conn, job_id, [i["custom_id"] for i in items])
    missing = [i for i in items if i["custom_id"] not in stored]
    legacy: dict[str, list[dict]] = {}
    for item in missing:
        for old in legacy_custom_ids(item["source_key"], variant):
            legacy.setdefault(old, []).append(item)
    if legacy:
        for cid, row in _stored(conn, job_id, list(legacy)).items():
            item = next((i for i in legacy[cid] if key_of(i["source_key"]) == key_of(row.key)), None)
            if item is not None and item["custom_id"] not in stored:
                item["custom_id"] = cid
                stored[cid] = row
    return [i for i in items if i["custom_id"] not in stored], [i for i in items if i["custom_id"] in stored], stored


def _stored(conn: Connection, job_id: int, ids: list[str]) -> dict[str, Stored]:
    r = requests.c
    # Rows stored before m008 have no fingerprint: it is taken from their payload.
    payload_if_needed = case((r.fingerprint.is_(None), r.payload), else_=None)
    stmt = (
        select(r.custom_id, r.id, r.state, r.fingerprint, payload_if_needed, r.dispatch_id, dispatches.c.state, r.source_key)
        .select_from(requests.outerjoin(dispatches, dispatches.c.id == r.dispatch_id))
        .where(r.job_id == job_id, among(conn, r.custom_id, ids))
    )
    return {
        cid: Stored(rid, state, fp, did, dstate, payload, key) for cid, rid, state, fp, payload, did, dstate, key in conn.execute(stmt)
    }


def note_changed(changes: Changes, stored: dict[str, Stored], items: list[dict], keep_pairs: bool, where, head: str | None = None) -> None:
    for item in items:
        s = stored.get(item["custom_id"])
        if s is None or not s.differs(item, head):
            continue
        changes.count += 1
        if len(changes.examples) < 3:
            changes.examples.append(f"{where(item['source_row'])} (id {item['source_key']})")
        if keep_pairs:
            changes.pairs.append((s, item))


def requeue(conn: Connection, job_id: int, pairs: list[tuple[Stored, dict]], now: float, where: str) -> int:
    """Re-render and queue again every changed request (see the module doc); refuses, and
    changes nothing, if one of them is in a batch or call already sent."""
    pairs = _locked(conn, pairs)
    sent = [item for s, item in pairs if s.state == RequestState.DISPATCHED and s.dispatch_state in SENT]
    if sent:
        raise SpecError(
            f"{where}: {len(sent)} changed request(s) are in batches or calls already sent (e.g. id "
            f"{sent[0]['source_key']}); their answers are for what was stored. Wait until those end "
            "(`lowtide status`), or cancel the job, then submit again with --requeue-changed"
        )
    for dispatch_id in {s.dispatch_id for s, _ in pairs if s.state == RequestState.DISPATCHED}:
        _unplan(conn, dispatch_id, now, where)
    rendered = {"payload", "head_id", "model", "fingerprint"}
    by_state: dict[str, list[dict]] = {}
    for s, item in pairs:
        state = RequestState.PENDING.value if s.state == RequestState.DISPATCHED else s.state
        by_state.setdefault(state, []).append({"_id": s.id, **{k: item[k] for k in rendered}})
    fresh = {
        "attempts": 0, "not_before": 0.0, "dispatch_id": None, "repair": None, "output": None, "parsed": None, "response": None, "plain_answer": None,
        "error_code": None, "error_message": None, "lane": "main", "lane_reason": None, "lane_base_attempts": 0,
        "updated_at": now,
    }  # fmt: skip
    r = requests.c
    new_payload = {k: bindparam(k) for k in rendered}
    for state, rows in by_state.items():
        if state == RequestState.PENDING:
            stmt = update(requests).where(r.id == bindparam("_id"), r.state == state).values(**new_payload, repair=None, updated_at=now)
            executemany(conn, stmt, rows)
        elif state == RequestState.SUCCEEDED:
            _keep_versions(conn, job_id, [row["_id"] for row in rows], now)
            fate.rerender(conn, [], RequestState.SUCCEEDED, {**fresh, **new_payload}, rows)
        else:  # failed, cancelled: the new payload, then the retry transition
            stmt = update(requests).where(r.id == bindparam("_id"), r.state == state).values(**new_payload)
            executemany(conn, stmt, rows)
            fate.rerender(conn, [row["_id"] for row in rows], RequestState(state), fresh)
    return len(pairs)


def _locked(conn: Connection, pairs: list[tuple[Stored, dict]]) -> list[tuple[Stored, dict]]:
    """The pairs with their requests' states read again, their rows locked until the load
    commits. On PostgreSQL a worker may have claimed one since it was read (a claim skips
    locked rows, so none can after this); it would run with the stored payload while the
    load counted it re-queued. The dispatches are read by a statement of their own: one
    that waited for a row sees the claim's dispatch only from a fresh snapshot."""
    r = requests.c
    ids = [s.id for s, _ in pairs]
    stmt = select(r.id, r.state, r.dispatch_id).where(among(conn, r.id, ids))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    current = {rid: (state, did) for rid, state, did in conn.execute(stmt)}
    dids = sorted({did for _, did in current.values() if did is not None})
    d = dispatches.c
    dstates = dict(conn.execute(select(d.id, d.state).where(among(conn, d.id, dids))).all()) if dids else {}
    fresh = []
    for s, item in pairs:
        state, did = current[s.id]
        fresh.append((replace(s, state=state, dispatch_id=did, dispatch_state=dstates.get(did)), item))
    return fresh


def move_connections(conn: Connection, job: str, moves: list[Move], now: float, where: str) -> None:
    """Refuse moving a route's connection while batches of the job were sent over it: they
    would be polled at the new place, which does not know them (nor could `find` adopt one
    whose create was on its way). Planned batches have sent nothing: taken apart here, they
    go to the new place. A batch given up as lost is not waited for: its watch ends, said."""
    d = dispatches.c
    job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == job)).scalar_one()
    # Held to the load's commit: a worker about to send a planned batch holds it too, and
    # either sends before (this load then sees the batch sent and refuses) or reads the new
    # spec after (and sends nothing to the old place: engine/batches.py `_begin_submit`).
    lock_job(conn, job_id)
    sent = conn.execute(
        select(d.route, d.provider_id).where(
            d.job_id == job_id, d.kind == "batch", d.route.in_({m.route for m in moves}), d.state.in_(SENT_BATCH_STATES)
        ).order_by(d.id)
    ).all()
    ids: dict[str, list[str]] = {}
    for route, provider_id in sent:
        ids.setdefault(route, []).append(provider_id or "(being created)")
    if not ids:
        unplan_batches(conn, job_id, {m.route for m in moves}, now, where)
        for m in moves:  # a batch given up as lost lives at the old place too
            end_watches(conn, job_id, dispatches.c.route == m.route, f"the load moved its route ({m.line})", now)
        return
    said = []
    for route, these in ids.items():
        named = ", ".join(these[:IDS_NAMED]) + (f" and {len(these) - IDS_NAMED} more" if len(these) > IDS_NAMED else "")
        moved = "; ".join(m.line for m in moves if m.route == route)
        said.append(f"{len(these)} batch(es) in flight on {route} ({named}), and this spec moves that route: {moved}")
    raise SpecError(
        f'{where}: job "{job}" has {" and ".join(said)}. Those batches live where they were sent; the '
        "new place does not know them. Wait until they are collected (`lowtide status`), or `lowtide cancel` "
        f"them first (`lowtide cancel {job}`, then a tick collects them), then load again"
    )


def unplan_batches(conn: Connection, job_id: int, routes: set[str], now: float, where: str) -> int:
    """Take apart the job's batches planned on `routes`, whose connection the load moves: a
    worker that read the spec before the load would otherwise send them to the old place
    after it. Taken here (a compare-and-set, like the worker's), they are planned again,
    under the new spec, at the next tick; one being sent already makes the load refused."""
    d = dispatches.c
    planned = conn.execute(
        select(d.id).where(d.job_id == job_id, d.kind == "batch", d.route.in_(routes), d.state == DispatchState.PLANNED.value)
    ).scalars().all()
    for dispatch_id in planned:
        _unplan(conn, dispatch_id, now, where)
    return len(planned)


def _unplan(conn: Connection, dispatch_id: int, now: float, where: str) -> None:
    """A planned batch is taken apart: its requests go back to pending unsent (the claim did
    not count as an attempt). Another worker that started sending it meanwhile wins, and the
    load is refused."""
    job_id = conn.execute(select(dispatches.c.job_id).where(dispatches.c.id == dispatch_id)).scalar_one()
    if fate.undo_planned(conn, JobContext.load(conn, job_id), dispatch_id, now, {"not_before": now}) is None:
        raise SpecError(f"{where}: a planned batch of this job is being sent right now; submit again once it is")


def _keep_versions(conn: Connection, job_id: int, ids: list[int], now: float) -> None:
    r = requests.c
    old = select(
        r.id, r.job_id, r.version, r.payload, r.head_id, r.fingerprint, r.state, r.output, r.parsed, r.route, r.response
    ).where(among(conn, r.id, ids))
    rows = [
        {"request_id": rid, "job_id": jid, "version": v, "payload": p, "head_id": head, "fingerprint": fp,
         "state": st, "output": out, "parsed": parsed, "route": route, "response": response, "replaced_at": now}
        for rid, jid, v, p, head, fp, st, out, parsed, route, response in conn.execute(old)
    ]  # fmt: skip
    executemany(conn, request_versions.insert(), rows)
