"""How many requests a direct route keeps in flight: an adaptive concurrency controller.

Pure logic: it reads time only from the `clock` it is given (monotonic seconds), so tests
drive it with a fake clock and simulated completions, without sleeping.

The route calls `sent()` before each request goes out and `done(latency, ...)` when its
answer (or error) is back, reads `limit` to size its worker pool, and waits `delay()`
seconds before sending while a Retry-After pause is on.

Why throughput: a continuous-batching server (vLLM, SGLang, llama.cpp) does the most work
per second with its batch full but not overfull. Below that point, one more request in
flight adds throughput; past it, requests only queue (or the server starts preempting) and
latency rises faster than concurrency, so completed requests per second stop growing or
fall. By Little's law throughput = in-flight / latency, so "throughput grew" and "latency
rose less than concurrency did" are the same test.

The algorithm (AIMD-style hill climbing on completed requests per second):

- Measure in windows. A window closes once it holds at least `max(8, turns × limit)`
  successful completions (about `turns` rounds of the whole pool) and `min_window` seconds
  have passed. Its throughput is completions / elapsed; its latency the mean latency.
- A window counts only if the pool was saturated: the mean number in flight at each send was
  at least 80 % of the limit. A pool held back by rate limits, a Retry-After pause or the
  end of the work says nothing about the server, so such a window changes nothing.
- After each saturated window the limit moves one step, multiplicatively (`× (1 + step)`
  up, `÷ (1 + step)` down), in a direction chosen by comparing with the reference window
  (the best one since the last move that did not lose throughput):
  throughput higher by more than `tolerance` (2 %): it becomes the reference; keep the
  direction and lengthen the step (× 1.5, at most 1.0: doubling); lower by more than
  `tolerance`: go back to the reference's limit, reverse and halve the step (at least 0.1),
  so that noise or a bad move cannot walk the limit away from the best point found (the
  reference counts 2 % less each time it is returned to, so a server that changed is
  followed); within `tolerance`: it becomes the reference and the limit goes down, because
  the extra requests only added latency (this is the "latency rose without a throughput
  gain" back-off, and it is what holds the limit at the knee of a server whose throughput
  is flat past its slot count). The first window has nothing to compare with and probes
  upwards.
- Overload (HTTP 429, 503, 529): the limit is cut to 70 % at once (multiplicative decrease,
  down to `minimum`, not to a planned floor), the step resets to 0.1 and the window
  restarts; overloads of requests sent before that cut count as the same event. Growing
  back towards the limit that overloaded, steps stay at 0.1; once past it without trouble
  (the provider's capacity grew) it is forgotten. A
  Retry-After the provider sends pauses every new send of the route until it has passed
  (`delay()`); the pause only ever extends.
- `plan(count, seconds, ...)` raises the floor under the limit so that `count` requests can
  finish in `seconds`: by Little's law it needs `count × latency / seconds` in flight (times
  1.25 for headroom), with the observed mean latency, or `expected_latency` before any is
  observed; capped at `maximum`. Throughput moves never go below the floor; overload cuts do.

With `adaptive=False` the limit stays where it is put (a fixed concurrency); pauses and
plans still apply.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

MIN_STEP = 0.1
MAX_STEP = 1.0
FIRST_STEP = 0.25
STEP_GROWTH = 1.5
OVERLOAD_FACTOR = 0.7
SATURATED = 0.8
HEADROOM = 1.25
DECAY = 0.98  # a best throughput that is returned to counts a little less each time (the server may change)


@dataclass(slots=True)
class Window:
    """What the controller saw in the window that closed last (for tests and progress)."""

    limit: int
    throughput: float
    latency: float
    saturated: bool


class Controller:
    def __init__(
        self,
        initial: int,
        minimum: int = 1,
        maximum: int | None = None,
        *,
        adaptive: bool = True,
        clock: Callable[[], float] = time.monotonic,
        turns: float = 2.0,
        min_window: float = 0.05,
        tolerance: float = 0.02,
    ):
        self.minimum = max(1, minimum)
        self.maximum = max(self.minimum, maximum if maximum is not None else max(initial, 1))
        self.adaptive = adaptive
        self.clock = clock
        self.turns = turns
        self.min_window = min_window
        self.tolerance = tolerance
        self._limit = float(min(max(initial, self.minimum), self.maximum))
        self._floor = self.minimum
        self.in_flight = 0
        self.direction = 1
        self.step = FIRST_STEP
        self.previous: Window | None = None  # the reference window (see the module doc)
        self.last: Window | None = None
        self.latency_ewma: float | None = None
        self.pause_until = 0.0
        self._last_cut = -math.inf
        self._trouble = math.inf  # the limit at the last overload: approached gently
        self._open_window(clock())

    # -- what the route reads -------------------------------------------------------------

    @property
    def limit(self) -> int:
        """How many requests may be in flight now."""
        return max(self._floor, min(self.maximum, round(self._limit)))

    @property
    def floor(self) -> int:
        """The least the limit may fall to by throughput moves (raised by `plan`)."""
        return self._floor

    def delay(self) -> float:
        """Seconds to wait before the next send (a Retry-After pause), 0 when none."""
        return max(0.0, self.pause_until - self.clock())

    # -- what the route reports -----------------------------------------------------------

    def sent(self) -> None:
        self.in_flight += 1
        self._sends += 1
        self._in_flight_sum += self.in_flight

    def done(self, latency: float, *, ok: bool = True, overload: bool = False, retry_after: float | None = None) -> None:
        """A request came back after `latency` seconds. `ok`: it succeeded; `overload`: the
        server said it is overloaded or rate-limited (429/503/529); `retry_after`: it asked for
        a pause of that many seconds."""
        self.in_flight = max(0, self.in_flight - 1)
        now = self.clock()
        if retry_after is not None and retry_after > 0:
            self.pause_until = max(self.pause_until, now + retry_after)
        if overload:
            self._overloaded(now, sent_at=now - latency)
            return
        if not ok:
            return
        self._completions += 1
        self._latency_sum += latency
        self.latency_ewma = latency if self.latency_ewma is None else 0.9 * self.latency_ewma + 0.1 * latency
        if self._completions >= max(8, self.turns * self.limit) and now - self._started >= self.min_window:
            self._close_window(now)

    def plan(self, count: int, seconds: float, expected_latency: float) -> int:
        """Raise the floor so `count` requests can finish within `seconds`; return the floor."""
        latency = self.latency_ewma if self.latency_ewma is not None else expected_latency
        need = math.ceil(count * latency / max(seconds, 1e-9) * HEADROOM)
        self._floor = max(self.minimum, min(self.maximum, need))
        self._limit = max(self._limit, float(self._floor))
        return self._floor

    def clear_plan(self) -> None:
        self._floor = self.minimum

    def set_limit(self, value: int) -> None:
        self._limit = float(min(max(value, self.minimum), self.maximum))

    # -- inside ---------------------------------------------------------------------------

    def _open_window(self, now: float) -> None:
        self._started = now
        self._completions = 0
        self._latency_sum = 0.0
        self._sends = 0
        self._in_flight_sum = 0

    def _overloaded(self, now: float, sent_at: float) -> None:
        if not self.adaptive or sent_at < self._last_cut:
            return  # sent before the last cut, answered after it: the same event
        self._last_cut = now
        self._trouble = self._limit
        self._limit = max(float(self.minimum), self._limit * OVERLOAD_FACTOR)
        self.step = MIN_STEP
        self.direction = 1
        self.previous = None
        self._open_window(now)

    def _close_window(self, now: float) -> None:
        limit = self.limit
        sends = max(self._sends, 1)
        window = Window(
            limit=limit,
            throughput=self._completions / max(now - self._started, 1e-9),
            latency=self._latency_sum / self._completions,
            saturated=self._in_flight_sum / sends >= SATURATED * limit,
        )
        self.last = window
        self._open_window(now)
        if not (self.adaptive and window.saturated):
            return
        best = self.previous
        if best is not None and best.limit != window.limit:
            change = window.throughput / best.throughput - 1 if best.throughput > 0 else 1.0
            if change > self.tolerance:  # a new best: keep going, faster
                self.previous = window
                self.step = min(self.step * STEP_GROWTH, MAX_STEP)
            elif change < -self.tolerance:  # worse than the best: back to it, then the other way
                self._limit = float(best.limit)
                self.previous = Window(best.limit, best.throughput * DECAY, best.latency, True)
                self.direction = -self.direction
                self.step = max(self.step / 2, MIN_STEP)
            else:  # no better: fewer in flight do as well
                self.previous = window
                self.direction = -1
                self.step = max(self.step / 2, MIN_STEP)
        else:
            self.previous = window
        self._move()

    def _move(self) -> None:
        before = self.limit
        if self.direction > 0 and self._limit * (1 + self.step) > self._trouble:
            if self._limit > self._trouble:  # past it without trouble: forget it
                self._trouble = math.inf
            else:
                self.step = MIN_STEP
        factor = 1 + self.step
        self._limit = self._limit * factor if self.direction > 0 else self._limit / factor
        self._limit = min(max(self._limit, float(self._floor)), float(self.maximum))
        if self.limit == before:  # rounding or a bound held it: move by one, if possible
            nudged = before + self.direction
            if self._floor <= nudged <= self.maximum:
                self._limit = float(nudged)
            else:  # at a bound: look the other way next time
                self.direction = -self.direction
