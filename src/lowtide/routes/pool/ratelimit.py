"""Requests-per-minute and tokens-per-minute limits for direct routes: token buckets.

Each bucket refills at `per_minute / 60` per second up to `burst` (one second's worth, at
least 1). A send takes its cost once the level covers it; one larger than the whole burst
goes once the bucket is full, and the level goes into debt that later sends wait off: the
rate holds on average and nothing waits forever. A request's token cost is estimated before
it is sent (characters / 4 + max_tokens) and settled with the provider's usage afterwards:
an overestimate is given back, an underestimate becomes debt.

Pure logic on an injectable monotonic clock: `wait(cost)` says how long to wait, `take(cost)`
takes. `Pacer` runs the buckets for a route, one waiter at a time (so waiting is fair and
the sleeps of waiters never overlap), with an injectable `sleep`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic):
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate = per_minute / 60.0
        self.burst = max(1.0, self.rate)
        self.clock = clock
        self.level = self.burst
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self._at) * self.rate)
        self._at = now

    def wait(self, cost: float) -> float:
        """Seconds until a send of `cost` may take from this bucket (0: now)."""
        self._refill()
        return max(0.0, (min(cost, self.burst) - self.level) / self.rate)

    def take(self, cost: float) -> None:
        self._refill()
        self.level -= cost

    def give_back(self, amount: float) -> None:
        """Settle an estimate: positive gives tokens back, negative takes more."""
        self._refill()
        self.level = min(self.burst, self.level + amount)


class Pacer:
    """A route's rate limits: `await acquire(tokens)` before each send."""

    def __init__(
        self,
        rpm: float | None,
        tpm: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.requests = TokenBucket(rpm, clock) if rpm else None
        self.tokens = TokenBucket(tpm, clock) if tpm else None
        self.sleep = sleep
        self._lock = asyncio.Lock()

    def renew(self) -> None:
        """A fresh lock, for a new event loop (one per `execute` call)."""
        self._lock = asyncio.Lock()

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    async def acquire(self, tokens: int) -> None:
        async with self._lock:
            while True:
                delay = max(
                    self.requests.wait(1) if self.requests is not None else 0.0,
                    self.tokens.wait(tokens) if self.tokens is not None else 0.0,
                )
                if delay <= 1e-9:
                    break
                await self.sleep(delay)
            if self.requests is not None:
                self.requests.take(1)
            if self.tokens is not None:
                self.tokens.take(tokens)

    def settle(self, estimated: int, actual: int) -> None:
        if self.tokens is not None:
            self.tokens.give_back(estimated - actual)
