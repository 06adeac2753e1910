"""Delivering job notifications from the outbox (engine/notify.py writes it): signed POSTs,
retried with backoff, given up with an event naming why.

Each attempt is signed as the gateway's webhooks are (core/callbacks.py `sign`):

    X-Lowtide-Delivery:  the delivery id (the same on every attempt: dedupe on it)
    X-Lowtide-Event:     job.finished | job.failed | job.budget_exhausted | job.deadline_cutover
    X-Lowtide-Attempt:   1, 2, …
    X-Lowtide-Timestamp: Unix seconds when this attempt was signed
    X-Lowtide-Signature: sha256=HEX( HMAC-SHA256(secret, timestamp + "." + raw body) )

with the secret read, at each attempt, from the environment variable `notify.secret_env`
names (never stored, never logged). The bounds are the gateway's (engine/webhook.py): one
deadline per attempt (`notify.timeout_seconds`) over the URL's check, connecting, sending
and the answer's status; at most 4 KiB of the answer read; no redirects; the URL judged
again before each attempt. Each attempt is its own task: at most `concurrency` at once, and
at most `per_receiver` to one host:port, so a slow or dead receiver holds up neither the
tick (which only starts attempts: `start_due` returns at once) nor other receivers.

A 2xx is delivered (event `notified`). Anything else is retried after
`backoff_seconds × 2^(attempt−1)` (±20 %, at most `max_backoff_seconds`; event
`notify_retry`); after `max_attempts` attempts, or at once for a URL the rules refuse now,
the delivery is given up (event `notify_failed`, naming why).

Guarantee: **at least once**. An attempt is claimed in the store before it is sent, and its
outcome committed after; a worker that dies between the receiver's 2xx and that commit
leaves the claim to lapse, and the next tick after it sends the same body again with the
same delivery id. An outcome that comes after its claim lapsed is recorded only if no other
worker took the delivery over meanwhile (a takeover writes its own claim first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Row, func, or_, select, update

from lowtide.core.callbacks import CallbackRefused, shown_url, sign
from lowtide.core.clock import Clock
from lowtide.core.spec import JobSpec, stored_spec
from lowtide.engine.notify import DEAD, DELIVERED, PENDING
from lowtide.engine.webhook import post_once, webhook_client
from lowtide.store.db import Store
from lowtide.store.queries import add_event
from lowtide.store.schema import jobs, notifications

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("lowtide.notify")

CLAIM_SLACK = 60.0  # seconds a claim outlasts its attempt's deadline (a slow commit)
MAX_TIMEOUT = 300.0  # the longest per-attempt deadline a spec may give
N = notifications.c


class Notifier:
    """Starts each due notification as its own task (`start_due`), within the bounds."""

    def __init__(self, store: Store, clock: Clock, *, concurrency: int = 16, per_receiver: int = 4,
                 rng: random.Random | None = None):  # fmt: skip
        self.store = store
        self.clock = clock
        self.concurrency = concurrency
        self.per_receiver = min(per_receiver, concurrency)
        self.rng = rng or random.Random()
        self._client: httpx.AsyncClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # delivery id → its attempt in flight
        self._busy: Counter[str] = Counter()  # receiver → its attempts in flight
        self._timeouts: dict[str, float] = {}

    @property
    def holding(self) -> int:
        """Attempts this engine started and has not let go of (an ended one leaves a loop turn
        later): while any is held, `next_due` cannot see its delivery nor its receiver's slot."""
        return len(self._tasks)

    @property
    def in_flight(self) -> int:
        # Not len(_tasks): a task leaves it by a done-callback one loop turn after it ended,
        # and an attempt that has recorded its outcome is no longer in flight.
        return sum(not task.done() for task in self._tasks.values())

    async def aclose(self) -> None:
        """Stop: attempts in flight may end within their deadline (a job's last notification
        goes out as `lowtide run` ends); any still running then is cancelled and handed back."""
        tasks = list(self._tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=max(self._timeouts.values(), default=0.0) + 5.0)
            for task in late:
                task.cancel()
            for task in late:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def start_due(self, job_name: str | None = None) -> list[asyncio.Task[None]]:
        """Claim what is due (of one job, or all), within the free slots and each receiver's
        share, and start each attempt as a task; returns them at once."""
        free = self.concurrency - len(self._tasks)
        if free <= 0:
            return []
        now = self.clock.now()
        # Most ticks have nothing due: ask in a read transaction first, so they do not take
        # the store's write lock (SQLite: BEGIN IMMEDIATE) only to find nothing.
        with self.store.read() as conn:
            if conn.execute(self._due(select(N.id), now, job_name).limit(1)).first() is None:
                return []
        busy = Counter(self._busy)
        claimed: list[tuple[Row, JobSpec, float]] = []
        with self.store.begin() as conn:
            for row in conn.execute(self._due(select(N.id, N.job_id, N.event, N.url, N.receiver, N.body, N.attempts,
                                                     jobs.c.spec), now, job_name).order_by(N.next_at, N.id).limit(free * 4)):  # fmt: skip
                if len(claimed) >= free:
                    break
                if busy[row.receiver] >= self.per_receiver:
                    continue
                spec = stored_spec(row.spec)
                until = now + (spec.notify.timeout_seconds if spec.notify else 0.0) + CLAIM_SLACK
                if _claim(conn, row.id, now, until):
                    busy[row.receiver] += 1
                    claimed.append((row, spec, until))
        started = []
        for row, spec, until in claimed:  # once the claims are committed
            self._busy[row.receiver] += 1
            self._timeouts[row.id] = spec.notify.timeout_seconds if spec.notify else 0.0
            task = self._tasks[row.id] = asyncio.create_task(self._attempt(row, spec, until), name=f"notify {row.id}")
            task.add_done_callback(lambda _, row=row: self._ended(row))
            started.append(task)
        return started

    async def run_due(self, job_name: str | None = None) -> int:
        """Start what is due and wait for those attempts to end; how many there were."""
        started = self.start_due(job_name)
        if started:
            await asyncio.gather(*started)
        return len(started)

    async def settle(self) -> None:
        """Wait for the attempts in flight to end (each within its deadline)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def next_due(self, job_name: str | None = None) -> float | None:
        """When a notification this engine could start is next due (None: none pending, or
        every slot taken)."""
        if len(self._tasks) >= self.concurrency:
            return None
        with self.store.read() as conn:
            return conn.execute(self._due(select(func.min(func.coalesce(N.claimed_until, N.next_at))), None, job_name)).scalar()

    def _due(self, stmt, now: float | None, job_name: str | None):
        """Pending rows not in flight here nor to a receiver at its share (due by `now`)."""
        stmt = stmt.select_from(notifications.join(jobs, jobs.c.id == N.job_id)).where(N.state == PENDING)
        if now is not None:
            stmt = stmt.where(N.next_at <= now, or_(N.claimed_until.is_(None), N.claimed_until <= now))
        full = [receiver for receiver, n in self._busy.items() if n >= self.per_receiver]
        if full:
            stmt = stmt.where(N.receiver.not_in(full))
        if self._tasks:
            stmt = stmt.where(N.id.not_in(list(self._tasks)))
        if job_name is not None:
            stmt = stmt.where(jobs.c.name == job_name)
        return stmt

    def _ended(self, row: Row) -> None:
        self._tasks.pop(row.id, None)
        self._timeouts.pop(row.id, None)
        self._busy[row.receiver] -= 1
        if self._busy[row.receiver] <= 0:
            del self._busy[row.receiver]

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = webhook_client(self.concurrency, MAX_TIMEOUT)
        return self._client

    async def _attempt(self, row: Row, spec: JobSpec, until: float) -> None:
        try:
            await self.deliver(row, spec, until)
        except asyncio.CancelledError:  # stopping: what did not finish is due again at once
            with self.store.begin() as conn:
                conn.execute(update(notifications).where(N.id == row.id, N.claimed_until == until).values(claimed_until=None))
            raise
        except Exception:  # the store failed: the claim lapses and the same delivery is sent again
            log.exception("lowtide: recording the notification attempt %s failed", row.id)

    def backoff(self, spec: JobSpec, attempt: int) -> float:
        notify = spec.notify
        assert notify is not None
        base = min(notify.max_backoff_seconds, notify.backoff_seconds * 2 ** (attempt - 1))
        return base * self.rng.uniform(0.8, 1.2)

    async def deliver(self, row: Row, spec: JobSpec, until: float) -> None:
        """Attempt `row` (claimed until `until`) and record the outcome, if the claim still holds."""
        attempt = row.attempts + 1
        notify = spec.notify
        error: str | None
        final = False
        if notify is None:
            error, final = "the job's spec has no `notify` any more", True
        elif not (secret := os.environ.get(notify.secret_env)):
            error = f"the environment variable {notify.secret_env} (notify.secret_env) is not set where this worker runs"
        else:
            body = row.body.encode("utf-8")
            timestamp = str(int(self.clock.now()))
            headers = {
                "content-type": "application/json",
                "user-agent": "lowtide-notify",
                "x-lowtide-delivery": row.id,
                "x-lowtide-event": f"job.{row.event}",
                "x-lowtide-attempt": str(attempt),
                "x-lowtide-timestamp": timestamp,
                "x-lowtide-signature": sign(secret.encode("utf-8"), timestamp, body),
            }
            try:
                error = await post_once(self._http(), row.url, body, headers, notify.timeout_seconds, notify.rules)
            except CallbackRefused as err:
                error, final = str(err), True
        # Recorded only while our claim holds (`until` still in the row), however late: once it
        # lapsed, another worker that takes the delivery over writes its own claim first, and this
        # outcome is not recorded. A 2xx after a stall with no takeover was received: delivered.
        now = self.clock.now()
        what = f"job.{row.event} to {shown_url(row.url)} (delivery {row.id}, attempt {attempt})"
        with self.store.begin() as conn:
            if error is None:
                if _record(conn, row.id, until, state=DELIVERED, attempts=attempt, ended_at=now, last_error=None):
                    add_event(conn, row.job_id, "notified", f"{what}: delivered", now)
            elif final or attempt >= (notify.max_attempts if notify else 1):
                if _record(conn, row.id, until, state=DEAD, attempts=attempt, ended_at=now, last_error=error):
                    add_event(conn, row.job_id, "notify_failed", f"{what}: gave up after {attempt} attempt(s): {error}", now)
                    log.warning("lowtide: notification %s given up: %s", row.id, error)
            else:
                wait = self.backoff(spec, attempt)
                if _record(conn, row.id, until, attempts=attempt, next_at=now + wait, last_error=error):
                    add_event(conn, row.job_id, "notify_retry", f"{what}: {error}; again in {wait:.0f} s", now)


def _claim(conn: Connection, delivery: str, now: float, until: float) -> bool:
    """Hold a due delivery until `until`: nobody else sends it meanwhile."""
    return bool(
        conn.execute(
            update(notifications)
            .where(N.id == delivery, N.state == PENDING, or_(N.claimed_until.is_(None), N.claimed_until <= now))
            .values(claimed_until=until)
        ).rowcount
    )


def _record(conn: Connection, delivery: str, until: float, **values) -> bool:
    """An attempt's outcome, only while its claim (`until`) still holds."""
    return bool(
        conn.execute(
            update(notifications)
            .where(N.id == delivery, N.state == PENDING, N.claimed_until == until)
            .values(claimed_until=None, **values)
        ).rowcount
    )
