"""Delivering results by webhook: signed, retried with backoff, dead-lettered, recorded.

Each finished deferred request that has a callback URL is POSTed there as JSON (the same
document `GET /v1/deferred/{id}` answers, without the delivery part), with

    X-Lowtide-Delivery:  the deferred request's id (the same on every attempt: dedupe on it)
    X-Lowtide-Event:     deferred.succeeded | deferred.failed
    X-Lowtide-Attempt:   1, 2, …
    X-Lowtide-Timestamp: Unix seconds when this attempt was signed
    X-Lowtide-Signature: sha256=HEX( HMAC-SHA256(secret, timestamp + "." + raw body) )

Any 2xx answer is a delivery. Anything else (another status, a timeout, a refused
connection) is retried after `backoff × 2^(attempt−1)` seconds (±20 % jitter, at most
`max_backoff`); after `max_attempts` failures the delivery is `dead`, visible in the status
document and in `lowtide gateway-status`. The callback URL is checked again before each
attempt (safety.py); a refused URL is dead at once. Redirects are not followed.

Guarantee: **at least once**. The outcome of each attempt is committed right after it; a
gateway that dies between the receiver's 2xx and that commit (a few milliseconds) delivers
that result again after a restart, with the same `X-Lowtide-Delivery` — receivers dedupe
on it. Nothing else is ever delivered twice, and nothing is lost across restarts: what is
pending is in the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import random
import time
from collections.abc import Callable

import httpx
from sqlalchemy import Row

from lowtide.core.clock import Clock
from lowtide.server.gateway import records
from lowtide.server.gateway.config import GatewayConfig
from lowtide.server.gateway.records import Delivery
from lowtide.server.gateway.safety import CallbackRefused, check_callback
from lowtide.server.gateway.views import deferred_view
from lowtide.store.db import Store

log = logging.getLogger("lowtide.gateway")

CLAIM_SLACK = 60.0  # seconds beyond the attempts' timeouts (the callback URL's DNS check, a slow commit)


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, signature: str | bytes, now: float | None = None,
           tolerance: float = 300.0) -> bool:  # fmt: skip
    """For receivers: the signature matches and the timestamp is within `tolerance` seconds
    of `now` (default: this machine's clock) — a replayed old delivery is refused. Any
    header that is malformed (not ASCII, not a number) is simply False, never an error."""
    now = time.time() if now is None else now
    try:
        stamp = timestamp.encode("ascii") if isinstance(timestamp, str) else bytes(timestamp)
        sent = float(stamp)
        given = signature.encode("utf-8", "surrogateescape") if isinstance(signature, str) else bytes(signature)
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        return False
    if not math.isfinite(sent) or abs(now - sent) > tolerance:
        return False
    expected = ("sha256=" + hmac.new(secret, stamp + b"." + body, hashlib.sha256).hexdigest()).encode("ascii")
    return hmac.compare_digest(expected, given)


class Deliverer:
    def __init__(self, store: Store, config: GatewayConfig, clock: Clock, secret: bytes | None,
                 count: Callable[[str], None] = lambda outcome: None, public_url: Callable[[], str | None] = lambda: None):  # fmt: skip
        self.store = store
        self.hooks = config.webhooks
        self.callbacks = config.callbacks
        self.clock = clock
        self.secret = secret
        self.count = count
        self.public_url = public_url
        self.rng = random.Random()
        self._client: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def backoff(self, attempt: int) -> float:
        base = min(self.hooks.max_backoff, self.hooks.backoff * 2 ** (attempt - 1))
        return base * self.rng.uniform(0.8, 1.2)

    async def run_due(self) -> int:
        """Attempt every delivery that is due; returns how many were attempted."""
        if self.secret is None:
            return 0
        now = self.clock.now()
        limit = self.hooks.concurrency * 4
        # Claimed before any POST, so two gateways on one store (a rolling restart) never send
        # the same attempt; the claim outlasts the pass: every attempt waits for the gate at
        # most limit / concurrency timeouts.
        until = now + (limit / self.hooks.concurrency + 1) * self.hooks.timeout + CLAIM_SLACK
        with self.store.begin() as conn:
            due = [
                row for row in records.due_deliveries(conn, now, limit)
                if records.claim_delivery(conn, row.id, row.next_delivery_at, until)
            ]  # fmt: skip
        if not due:
            return 0
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.hooks.timeout, follow_redirects=False,
                limits=httpx.Limits(max_connections=self.hooks.concurrency, max_keepalive_connections=self.hooks.concurrency),
            )  # fmt: skip
        gate = asyncio.Semaphore(self.hooks.concurrency)

        async def one(row: Row) -> None:
            try:
                async with gate:
                    await self.deliver(row)
            except asyncio.CancelledError:  # a gateway stopping: what it did not finish is due again at once
                with self.store.begin() as conn:
                    records.claim_delivery(conn, row.id, until, row.next_delivery_at)
                raise

        await asyncio.gather(*(one(r) for r in due))
        return len(due)

    def next_due(self) -> float | None:
        with self.store.begin() as conn:
            return records.next_delivery_time(conn)

    async def deliver(self, row: Row) -> None:
        assert self.secret is not None and self._client is not None
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
        error: str | None
        final = False
        try:
            await check_callback(row.callback_url, self.callbacks)
            answer = await self._client.post(row.callback_url, content=body, headers=headers)
            error = None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
        except CallbackRefused as err:
            error, final = str(err), True
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}"
        now = self.clock.now()
        with self.store.begin() as conn:
            if error is None:
                records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.DELIVERED,
                                      delivery_attempts=attempt, delivered_at=now, delivery_error=None)  # fmt: skip
                self.count("delivered")
            elif final or attempt >= self.hooks.max_attempts:
                records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.DEAD,
                                      delivery_attempts=attempt, delivery_error=error, next_delivery_at=None)  # fmt: skip
                self.count("dead")
                log.warning("gateway: webhook for %s is dead after %d attempt(s): %s", row.id, attempt, error)
            else:
                records.move_delivery(conn, row.id, Delivery.PENDING, Delivery.PENDING, delivery_attempts=attempt,
                                      delivery_error=error, next_delivery_at=now + self.backoff(attempt))  # fmt: skip
                self.count("failed")
