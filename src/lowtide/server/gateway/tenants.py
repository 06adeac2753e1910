"""Tenants: who is calling (an API key, known only by its SHA-256), and their quotas.

A key arrives as OpenAI's SDK sends it (`Authorization: Bearer KEY`) or as Anthropic's does
(`x-api-key: KEY`). Its SHA-256 is looked up among the configured tenants' hashes; the key
itself is never stored nor logged. With no tenants configured, any key is accepted as the
one tenant `default` (the gateway warns at start-up).

Quotas: `rpm` (requests per minute, real time and deferred, sliding 60 s window) and
`max_pending` (deferred requests not finished yet). Counters live in memory; pending counts
are read from the store at start-up and released by the collector (another thread: locked).
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Mapping

from lowtide.core.clock import Clock
from lowtide.server.gateway.config import GatewayConfig, Quotas

OPEN_TENANT = "default"
CLIENT_HEADERS = frozenset({"authorization", "x-api-key"})  # where a key may travel


def key_of(headers: Mapping[str, str]) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    bearer = headers.get("authorization", "")
    if bearer[:7].lower() == "bearer ":
        return bearer[7:].strip() or None
    return None


def sha256_hex(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class QuotaExceeded(Exception):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class Tenants:
    def __init__(self, config: GatewayConfig, clock: Clock):
        self.open = not config.tenants
        self.by_hash = {t.key_sha256.lower(): t.name for t in config.tenants}
        self.quotas: dict[str, Quotas] = {t.name: t.quotas for t in config.tenants}
        self.clock = clock
        self._lock = threading.Lock()
        self.pending: dict[str, int] = {}
        self._recent: dict[str, deque[float]] = {}

    def identify(self, headers: Mapping[str, str]) -> str | None:
        """The tenant's name, or None for a missing or unknown key."""
        key = key_of(headers)
        if key is None:
            return None
        if self.open:
            return OPEN_TENANT
        return self.by_hash.get(sha256_hex(key))

    def admit(self, tenant: str) -> None:
        """Count one request against the tenant's rpm; QuotaExceeded if it is over."""
        quota = self.quotas.get(tenant)
        if quota is None or quota.rpm is None:
            return
        now = self.clock.now()
        recent = self._recent.setdefault(tenant, deque())
        while recent and recent[0] <= now - 60.0:
            recent.popleft()
        if len(recent) >= quota.rpm:
            raise QuotaExceeded(f"tenant {tenant}: over its quota of {quota.rpm} requests per minute", recent[0] + 60.0 - now)
        recent.append(now)

    def reserve_pending(self, tenant: str) -> None:
        """Count one more deferred request; QuotaExceeded if the tenant has too many waiting."""
        quota = self.quotas.get(tenant)
        with self._lock:
            n = self.pending.get(tenant, 0)
            if quota is not None and quota.max_pending is not None and n >= quota.max_pending:
                raise QuotaExceeded(
                    f"tenant {tenant}: {n} deferred requests are still waiting, its quota is {quota.max_pending}", 60.0
                )
            self.pending[tenant] = n + 1

    def release_pending(self, tenant: str, n: int = 1) -> None:
        with self._lock:
            self.pending[tenant] = max(0, self.pending.get(tenant, 0) - n)

    def set_pending(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self.pending = dict(counts)
