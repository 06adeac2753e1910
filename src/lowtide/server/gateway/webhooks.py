"""Delivering results by webhook: signed, retried with backoff, dead-lettered, recorded.

Each finished deferred request that has a callback URL is POSTed there as JSON (the same
document `GET /v1/deferred/{id}` answers, without the delivery part), with

    X-Lowtide-Delivery:  the deferred request's id (the same on every attempt: dedupe on it)
    X-Lowtide-Event:     deferred.succeeded | deferred.failed
    X-Lowtide-Attempt:   1, 2, …
    X-Lowtide-Timestamp: Unix seconds when this attempt was signed
    X-Lowtide-Signature: sha256=HEX( HMAC-SHA256(secret, timestamp + "." + raw body) )

Any 2xx status is a delivery, if it arrives within `timeout` of the attempt's start: one
deadline over the callback URL's check, connecting, sending and the answer's status line
and headers. At most ANSWER_BYTES of the answer's body are read (so a short answer leaves
the connection reusable), none of it matters, and the rest is never read: a receiver that
drips or floods costs only its own attempt. Anything else (another status, the deadline, a
refused connection) is retried after `backoff × 2^(attempt−1)` seconds (±20 % jitter, at
most `max_backoff`); after `max_attempts` failures the delivery is `dead`, visible in the
status document and in `lowtide gateway-status`. The callback URL is checked again before
each attempt (safety.py); a refused URL is dead at once. Redirects are not followed.

Each attempt is its own task: at most `concurrency` at once, and at most `per_tenant` of
one tenant's, so one tenant's slow receivers never hold back another tenant's results.

Guarantee: **at least once**. The outcome of each attempt is committed right after it; a
gateway that dies between the receiver's 2xx and that commit (a few milliseconds) delivers
that result again after a restart, with the same `X-Lowtide-Delivery` — receivers dedupe
on it. An attempt is claimed in the store before it is sent; one whose claim lapsed before
its outcome was committed is recorded only if no other gateway took the delivery over
meanwhile (a takeover writes its own claim first). Nothing is lost across restarts: what is
pending is in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import Counter
from collections.abc import Callable

import httpx
from sqlalchemy import Row

from lowtide.core.callbacks import CallbackRefused, sign, verify
from lowtide.core.clock import Clock
from lowtide.engine.webhook import ANSWER_BYTES, post_once, webhook_client
from lowtide.server.gateway import records
from lowtide.server.gateway.config import GatewayConfig
from lowtide.server.gateway.records import Delivery
from lowtide.server.gateway.views import deferred_view
from lowtide.store.db import Store

log = logging.getLogger("lowtide.gateway")

CLAIM_SLACK = 60.0  # seconds beyond an attempt's deadline (a slow commit)
__all__ = ["ANSWER_BYTES", "CLAIM_SLACK", "Deliverer", "sign", "verify"]  # sign, verify: core/callbacks.py


class Deliverer:
    """Starts each due delivery as its own task (`start_due`), within the bounds."""

    def __init__(self, store: Store, config: GatewayConfig, clock: Clock, secret: bytes | None,
                 count: Callable[[str], None] = lambda outcome: None, public_url: Callable[[], str | None] = lambda: None,
                 finished: Callable[[], None] = lambda: None):  # fmt: skip
        self.store = store
        self.hooks = config.webhooks
        self.callbacks = config.callbacks
        self.clock = clock
        self.secret = secret
        self.count = count
        self.public_url = public_url
        self.finished = finished  # called as each attempt ends: a slot is free
        self.per_tenant = min(self.hooks.per_tenant, self.hooks.concurrency)
        self.rng = random.Random()
        self._client: httpx.AsyncClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # deferred id → its attempt in flight
        self._busy: Counter[str] = Counter()  # tenant → its attempts in flight

    async def aclose(self) -> None:
        """Stop: attempts in flight are cancelled and handed back (due again at once)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def backoff(self, attempt: int) -> float:
        base = min(self.hooks.max_backoff, self.hooks.backoff * 2 ** (attempt - 1))
        return base * self.rng.uniform(0.8, 1.2)

    def start_due(self) -> list[asyncio.Task[None]]:
        """Claim what is due, within the free slots and each tenant's share, and start each
        attempt as a task of its own; returns them at once (never waits for a receiver)."""
        free = self.hooks.concurrency - len(self._tasks)
        if self.secret is None or free <= 0:
            return []
        now = self.clock.now()
        full = [tenant for tenant, n in self._busy.items() if n >= self.per_tenant]
        # Claimed before any POST, so two gateways on one store (a rolling restart) never send
        # the same attempt; the claim outlasts the attempt's deadline.
        until = now + self.hooks.timeout + CLAIM_SLACK
        claimed: list[Row] = []
        busy = Counter(self._busy)
        with self.store.begin() as conn:
            for row in records.due_deliveries(conn, now, free + len(self._tasks), self.per_tenant, full, list(self._tasks)):
                if len(claimed) < free and busy[row.tenant] < self.per_tenant and \
                        records.claim_delivery(conn, row.id, row.next_delivery_at, until):  # fmt: skip
                    busy[row.tenant] += 1
                    claimed.append(row)
        for row in claimed:  # once the claims are committed
            self._busy[row.tenant] += 1
            task = self._tasks[row.id] = asyncio.create_task(self._attempt(row, until), name=f"webhook {row.id}")
            task.add_done_callback(lambda _, row=row: self._ended(row))
        return [self._tasks[row.id] for row in claimed]

    def _ended(self, row: Row) -> None:
        self._tasks.pop(row.id, None)
        self._busy[row.tenant] -= 1
        if self._busy[row.tenant] <= 0:
            del self._busy[row.tenant]
        self.finished()

    async def run_due(self) -> int:
        """Start what is due and wait for those attempts to end; returns how many there were."""
        started = self.start_due()
        if started:
            await asyncio.gather(*started)
        return len(started)

    def next_due(self) -> float | None:
        """When a delivery this gateway could start now is next due (None: nothing pending,
        or every slot taken: a slot freed calls `finished`)."""
        if self.secret is None or len(self._tasks) >= self.hooks.concurrency:
            return None
        full = [tenant for tenant, n in self._busy.items() if n >= self.per_tenant]
        with self.store.begin() as conn:
            return records.next_delivery_time(conn, full, list(self._tasks))

    async def _attempt(self, row: Row, until: float) -> None:
        try:
            await self.deliver(row, until)
        except asyncio.CancelledError:  # a gateway stopping: what it did not finish is due again at once
            with self.store.begin() as conn:
                records.claim_delivery(conn, row.id, until, row.next_delivery_at)
            raise
        except Exception:  # the store failed: the claim lapses and the attempt is made again
            log.exception("gateway: recording the webhook attempt for %s failed", row.id)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = webhook_client(self.hooks.concurrency, self.hooks.timeout)
        return self._client

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """One attempt: None for a 2xx within the deadline, else why not (CallbackRefused
        for a URL that may not be used); the bounds are engine/webhook.py's."""
        return await post_once(self._http(), url, body, headers, self.hooks.timeout, self.callbacks)

    async def deliver(self, row: Row, until: float) -> None:
        """Attempt `row` (claimed until `until`) and record the outcome, if the claim still holds."""
        assert self.secret is not None
        attempt = row.delivery_attempts + 1
        body = json.dumps(deferred_view(row, self.public_url(), delivery=False), separators=(",", ":")).encode()
        timestamp = str(int(self.clock.now()))
        headers = {
            "content-type": "application/json",
            "user-agent": "lowtide-gateway",
            "x-lowtide-delivery": row.id,
            "x-lowtide-event": f"deferred.{row.state}",
            "x-lowtide-attempt": str(attempt),
            "x-lowtide-timestamp": timestamp,
            "x-lowtide-signature": sign(self.secret, timestamp, body),
        }
        final = False
        try:
            error = await self.post(row.callback_url, body, headers)
        except CallbackRefused as err:
            error, final = str(err), True
        # Recorded only while our claim holds (`until` still in the row), however late: once it
        # lapsed, another gateway that takes the delivery over writes its own claim first, and this
        # outcome is not recorded. A 2xx after a stall with no takeover was received: delivered.
        now = self.clock.now()
        with self.store.begin() as conn:
            if error is None:
                moved = records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.DELIVERED, claim=until,
                                              delivery_attempts=attempt, delivered_at=now, delivery_error=None)  # fmt: skip
                outcome = "delivered"
            elif final or attempt >= self.hooks.max_attempts:
                moved = records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.DEAD, claim=until,
                                              delivery_attempts=attempt, delivery_error=error, next_delivery_at=None)  # fmt: skip
                outcome = "dead"
            else:
                moved = records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.PENDING, claim=until, delivery_attempts=attempt,
                                              delivery_error=error, next_delivery_at=now + self.backoff(attempt))  # fmt: skip
                outcome = "failed"
        if not moved:  # the claim lapsed and another attempt took it: that one's outcome counts
            log.warning("gateway: webhook attempt %d for %s ended after its claim was taken over; not recorded", attempt, row.id)
            return
        self.count(outcome)
        if outcome == "dead":
            log.warning("gateway: webhook for %s is dead after %d attempt(s): %s", row.id, attempt, error)
