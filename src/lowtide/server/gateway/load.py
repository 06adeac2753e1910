"""Real-time load on one upstream, against its configured limits.

    load = max( in_flight / max_in_flight,
                requests in the last 60 s / rpm,
                tokens in the last 60 s / tpm,
                1.0 while a 429 from the upstream is younger than cooldown_after_429 )

A limit left out does not count. Only requests forwarded in real time add to the load.
Tokens are estimated the way providers' rate limiters do before answering: the body's
characters / 4, plus the `max_tokens` it asks for. Everything reads one injectable clock
(`lowtide.core.clock`), so tests move time instead of sleeping.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from lowtide.core.clock import Clock
from lowtide.server.gateway.config import LoadLimits

WINDOW = 60.0


def estimate_tokens(body_bytes: int, body: dict[str, Any]) -> int:
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    return body_bytes // 4 + (asked if isinstance(asked, int) and not isinstance(asked, bool) else 0)


class LoadTracker:
    """Used from the gateway's event loop only (no locks)."""

    def __init__(self, limits: LoadLimits, clock: Clock):
        self.limits = limits
        self.clock = clock
        self.in_flight = 0
        self._window: deque[tuple[float, int]] = deque()  # (when, tokens) of forwarded requests
        self._requests = 0
        self._tokens = 0
        self.last_429: float | None = None
        self.rate_limited = 0  # 429s seen, for the metrics

    def started(self, tokens: int) -> None:
        self.in_flight += 1
        self._window.append((self.clock.now(), tokens))
        self._requests += 1
        self._tokens += tokens

    def finished(self, status: int | None) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if status == 429:
            self.last_429 = self.clock.now()
            self.rate_limited += 1

    def _expire(self, now: float) -> None:
        window = self._window
        while window and window[0][0] <= now - WINDOW:
            _, tokens = window.popleft()
            self._requests -= 1
            self._tokens -= tokens

    def ratio(self) -> float:
        return max((value for value, _ in self._parts()), default=0.0)

    def overloaded(self) -> bool:
        return self.ratio() >= self.limits.threshold

    def why(self) -> str:
        """The part of the load that is highest, said for a shaved request's X-Lowtide-Reason."""
        value, what = max(self._parts(), default=(0.0, "no limit set"))
        return f"upstream load {value:.2f} >= threshold {self.limits.threshold:g} ({what})"

    def _parts(self) -> list[tuple[float, str]]:
        now = self.clock.now()
        self._expire(now)
        lim = self.limits
        parts = []
        if lim.max_in_flight:
            parts.append((self.in_flight / lim.max_in_flight, f"in flight {self.in_flight}/{lim.max_in_flight}"))
        if lim.rpm:
            parts.append((self._requests / lim.rpm, f"requests in the last 60 s {self._requests}/{lim.rpm}"))
        if lim.tpm:
            parts.append((self._tokens / lim.tpm, f"tokens in the last 60 s {self._tokens}/{lim.tpm}"))
        if self.last_429 is not None and now - self.last_429 < lim.cooldown_after_429:
            parts.append((1.0, f"the upstream answered 429 {now - self.last_429:.0f} s ago; cooldown_after_429 {lim.cooldown_after_429:g} s"))
        return parts

    def per_minute(self) -> tuple[int, int]:
        self._expire(self.clock.now())
        return self._requests, self._tokens
