"""Job notifications, enqueued: an outbox row per receiver, written in the transaction of the
state change it reports (docs/notifications.md).

    event              written where                      when
    -----------------  ---------------------------------  -----------------------------------------
    finished | failed  tick.py `finish`                   every request is terminal: `failed` if
                                                          any request failed (the failure count of
                                                          `lowtide status` and the dashboard),
                                                          else `finished`
    budget_exhausted   budget.py `exhaust`                the job stopped sending on its budget
    deadline_cutover   fallback.py `cut_over`,            the deadline's cut-over time came: what
                       tiers.py `_hand_over`              the route cannot finish goes elsewhere

Nothing here moves a request or a job: it only records that one moved. The outbox row and
the change commit together or not at all, so a crash never loses a notification nor sends
one for a change that did not happen. The `dedupe_key` (unique per job) makes an event
enqueued once per occurrence: a job's Nth ending (`ended:N`, counted by its `finished`
events), its Nth budget stop, the cut-over of one deadline. Delivery is engine/notifier.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection, and_, case, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.core.callbacks import CallbackRefused, check_callback_now, shown_url
from lowtide.core.errors import SpecError
from lowtide.core.spec import JobSpec
from lowtide.core.states import RequestState
from lowtide.engine.context import JobContext
from lowtide.store.money import from_pico
from lowtide.store.schema import attempts, events, jobs, notifications, requests

PENDING = "pending"
DELIVERED = "delivered"
DEAD = "dead"


def check_notify(spec: JobSpec, where: str) -> None:
    """At load, before anything is stored: each URL's host resolves only where the rules
    allow (a literal address was judged by the spec already), and the signing secret is set
    here (a worker elsewhere needs it too)."""
    notify = spec.notify
    if notify is None:
        return
    for i, url in enumerate(notify.urls):
        try:
            check_callback_now(url, notify.rules)
        except CallbackRefused as err:
            raise SpecError(f"{where}: notify.urls: URL {i + 1} ({shown_url(url)}): {str(err).removeprefix('callback URL: ')}; "
                            "point it at a receiver that may be reached, or allow its range (notify.allow_private, "
                            "allow_loopback, allow_link_local) if it is yours") from None  # fmt: skip
    if not os.environ.get(notify.secret_env):
        raise SpecError(f"{where}: notify.secret_env: the environment variable {notify.secret_env} is not set; set it to "
                        "the signing secret your receivers verify with, here and where the worker runs")  # fmt: skip


def job_ended(conn: Connection, job: JobContext, now: float) -> int:
    """The job just finished (its `finished` event is written): `failed` if any request
    failed, else `finished`. Returns the rows enqueued."""
    if not (wants(job.spec, "finished") or wants(job.spec, "failed")):
        return 0
    failed = conn.execute(
        select(func.count()).where(requests.c.job_id == job.id, requests.c.state == RequestState.FAILED.value)
    ).scalar_one()
    event = "failed" if failed else "finished"
    reason = f"{failed} request(s) failed" if failed else "every request reached a terminal state"
    return enqueue(conn, job, event, now, reason, f"ended:{_times(conn, job.id, 'finished')}")


def budget_exhausted(conn: Connection, job: JobContext, now: float, reason: str) -> int:
    """The job just stopped on its budget (its `budget_exhausted` event is written)."""
    if not wants(job.spec, "budget_exhausted"):
        return 0
    return enqueue(conn, job, "budget_exhausted", now, reason, f"budget_exhausted:{_times(conn, job.id, 'budget_exhausted')}")


def deadline_cutover(conn: Connection, job: JobContext, now: float, reason: str) -> int:
    """The job's deadline cut-over time came; once per deadline, however many ticks see it."""
    if job.spec.deadline is None:
        return 0
    key = f"deadline_cutover:{job.spec.deadline.timestamp():.0f}"
    if not wants(job.spec, "deadline_cutover") or _enqueued(conn, job.id, key):
        return 0
    return enqueue(conn, job, "deadline_cutover", now, reason, key)


def wants(spec: JobSpec, event: str) -> bool:
    return spec.notify is not None and event in spec.notify.events


def enqueue(conn: Connection, job: JobContext, event: str, now: float, reason: str, key: str) -> int:
    """One outbox row per URL of the job's `notify` for `event`, unless this occurrence (`key`)
    is enqueued already; in the caller's transaction. Returns the rows written."""
    if not wants(job.spec, event):
        return 0
    facts = _facts(conn, job, event, now, reason)
    into = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(notifications)
    written = 0
    for url in job.spec.notify.urls:
        delivery = str(uuid.uuid4())
        body = json.dumps({"delivery_id": delivery, **facts}, separators=(",", ":"), ensure_ascii=False)
        row = {
            "id": delivery, "job_id": job.id, "event": event, "dedupe_key": f"{key}|{_url_key(url)}", "url": url,
            "receiver": receiver_of(url), "body": body, "state": PENDING, "attempts": 0, "next_at": now, "created_at": now,
        }  # fmt: skip
        written += conn.execute(into.values(**row).on_conflict_do_nothing(index_elements=["job_id", "dedupe_key"])).rowcount
    return written


def receiver_of(url: str) -> str:
    """host:port, what the per-receiver bound counts by."""
    parts = urlsplit(url)
    return f"{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"[:300]


def _url_key(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]


def _times(conn: Connection, job_id: int, kind: str) -> int:
    """How many `kind` events the job has had: which occurrence this one is."""
    return conn.execute(select(func.count()).where(events.c.job_id == job_id, events.c.kind == kind)).scalar_one()


def _enqueued(conn: Connection, job_id: int, key: str) -> bool:
    mine = notifications.c
    return conn.execute(
        select(exists().where(mine.job_id == job_id, mine.dedupe_key.startswith(key + "|", autoescape=True)))
    ).scalar_one()


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _facts(conn: Connection, job: JobContext, event: str, now: float, reason: str) -> dict[str, Any]:
    """The document sent (less its delivery id): the job's counts, cost and savings now."""
    counts = dict(
        conn.execute(
            select(requests.c.state, func.count()).where(requests.c.job_id == job.id).group_by(requests.c.state)
        ).all()
    )
    known = attempts.c.cost_picousd.is_not(None)
    unknown = and_(attempts.c.cost_picousd.is_(None), or_(attempts.c.billed.is_(None), attempts.c.billed.is_(True)))
    cost, realtime, unknown = conn.execute(
        select(
            func.coalesce(func.sum(attempts.c.cost_picousd), 0),
            func.coalesce(func.sum(case((known, attempts.c.realtime_picousd), else_=0)), 0),
            func.coalesce(func.sum(case((unknown, 1), else_=0)), 0),
        ).where(attempts.c.job_id == job.id)
    ).one()
    state, created, finished = conn.execute(
        select(jobs.c.state, jobs.c.created_at, jobs.c.finished_at).where(jobs.c.id == job.id)
    ).one()
    spec = job.spec
    return {
        "event": f"job.{event}",
        "job": job.name,
        "state": state,
        "reason": reason,
        "at": _iso(now),
        "counts": {s.value: int(counts.get(s.value, 0)) for s in RequestState},
        "total": int(sum(counts.values())),
        "cost_usd": str(from_pico(int(cost))),
        "realtime_usd": str(from_pico(int(realtime))),
        "savings_usd": str(from_pico(int(realtime) - int(cost))),
        "unknown_cost_attempts": int(unknown),
        "budget_usd": None if spec.budget_usd is None else str(spec.budget_usd),
        "deadline": None if spec.deadline is None else _iso(spec.deadline.timestamp()),
        "created_at": _iso(created),
        "finished_at": _iso(finished),
    }
