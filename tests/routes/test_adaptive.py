"""The adaptive concurrency controller and the rate-limit buckets, on a fake clock: a small
discrete-event simulation of a closed pool against a model server stands in for time."""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable

import pytest

from lowtide.routes.pool.adaptive import Controller
from lowtide.routes.pool.ratelimit import Pacer, TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(
    ctl: Controller,
    clock: FakeClock,
    latency: Callable[[int], float],
    seconds: float,
    *,
    noise: float = 0.0,
    overload_above: int | None = None,
    seed: int = 5,
) -> list[tuple[float, int]]:
    """Run a pool that keeps `ctl.limit` requests in flight against a server whose latency
    is `latency(in flight)` (429 at once above `overload_above`). Returns (time, limit) at
    each successful completion."""
    rng = random.Random(seed)
    pending: list[tuple[float, int, float, bool]] = []
    seq, trace = 0, []
    while clock.now < seconds:
        while ctl.in_flight < ctl.limit:
            ctl.sent()
            refused = overload_above is not None and ctl.in_flight > overload_above
            took = 0.01 if refused else latency(ctl.in_flight) * (1 + noise * rng.uniform(-1, 1))
            heapq.heappush(pending, (clock.now + took, seq, clock.now, refused))
            seq += 1
        clock.now, _, started, refused = heapq.heappop(pending)
        if refused:
            ctl.done(clock.now - started, ok=False, overload=True)
        else:
            ctl.done(clock.now - started)
            trace.append((clock.now, ctl.limit))
    return trace


def throughput(trace: list[tuple[float, int]], since: float) -> float:
    late = [t for t, _ in trace if t >= since]
    return len(late) / (late[-1] - since)


def superlinear(base: float, best: int) -> Callable[[int], float]:
    """Latency grows with the square of the batch: throughput n / latency peaks at `best`."""
    return lambda n: base * (1 + (n / best) ** 2)


def slots(base: float, count: int) -> Callable[[int], float]:
    """`count` slots whose step time grows with the batch; past them requests queue."""
    return lambda n: base * (1 + min(n, count) / 32) * (1 + max(0, n - count) / count)


def best_fixed(latency: Callable[[int], float]) -> float:
    return max(n / latency(n) for n in range(1, 1025))


@pytest.mark.parametrize("start", [4, 48, 160])
@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_it_finds_the_peak_of_a_server_whose_throughput_falls_past_it(start, noise):
    clock = FakeClock()
    ctl = Controller(start, 1, 512, clock=clock)
    model = superlinear(0.04, 48)
    trace = simulate(ctl, clock, model, 60.0, noise=noise)
    assert throughput(trace, 30.0) >= 0.9 * best_fixed(model)
    assert 20 <= ctl.limit <= 100


@pytest.mark.parametrize("seed", range(1, 6))
def test_noise_does_not_walk_the_limit_away_from_the_peak(seed):
    # Each move is judged against the best window found, not the last one: a noisy window
    # sends the limit back to the best point instead of drifting on from wherever it is.
    clock = FakeClock()
    ctl = Controller(8, 1, 512, clock=clock)
    model = superlinear(0.04, 48)
    trace = simulate(ctl, clock, model, 60.0, noise=0.3, seed=seed)
    assert throughput(trace, 30.0) >= 0.95 * best_fixed(model)


@pytest.mark.parametrize("start", [4, 256])
def test_it_fills_the_slots_of_a_server_that_queues_past_them(start):
    clock = FakeClock()
    ctl = Controller(start, 1, 512, clock=clock)
    model = slots(0.04, 64)
    trace = simulate(ctl, clock, model, 60.0)
    assert throughput(trace, 30.0) >= 0.95 * best_fixed(model)
    assert max(limit for t, limit in trace if t >= 30) < 200  # it does not pile up a queue


def test_overload_cuts_once_per_event_and_it_climbs_back():
    clock = FakeClock()
    ctl = Controller(64, 2, 512, clock=clock)
    for _ in range(64):
        ctl.sent()
    clock.now = 1.0
    ctl.done(1.0, ok=False, overload=True)
    assert ctl.limit == round(64 * 0.7)
    for _ in range(10):  # the rest of that flight, all sent before the cut
        ctl.done(1.0, ok=False, overload=True)
    assert ctl.limit == round(64 * 0.7)
    ctl.sent()
    clock.now = 1.5
    ctl.done(0.2, ok=False, overload=True)  # sent after the cut: a new event
    assert ctl.limit == round(64 * 0.7 * 0.7)
    # A server that refuses above 100 in flight: the limit saws below it, never far.
    clock = FakeClock()
    ctl = Controller(8, 1, 512, clock=clock)
    trace = simulate(ctl, clock, lambda n: 1.0, 300.0, overload_above=100)
    late = [limit for t, limit in trace if t > 100]
    assert max(late) <= 110 and sum(late) / len(late) >= 60


def test_retry_after_pauses_and_only_ever_extends():
    clock = FakeClock()
    ctl = Controller(4, clock=clock)
    ctl.sent()
    ctl.done(0.1, ok=False, overload=True, retry_after=2.0)
    assert ctl.delay() == 2.0
    clock.now = 0.5
    ctl.sent()
    ctl.done(0.1, ok=False, overload=True, retry_after=0.5)  # ends sooner: no change
    assert ctl.delay() == 1.5
    clock.now = 2.0
    assert ctl.delay() == 0.0


def test_a_pool_that_is_not_full_teaches_nothing():
    clock = FakeClock()
    ctl = Controller(32, 1, 512, clock=clock)
    for _ in range(200):  # one request at a time: rate-limited, or the work is running out
        ctl.sent()
        clock.now += 0.01
        ctl.done(0.01)
    assert ctl.limit == 32
    assert ctl.last is not None and not ctl.last.saturated


def test_a_fixed_concurrency_stays_fixed():
    clock = FakeClock()
    ctl = Controller(16, 1, 512, adaptive=False, clock=clock)
    simulate(ctl, clock, superlinear(0.04, 48), 20.0)
    assert ctl.limit == 16
    ctl.sent()
    ctl.done(0.1, ok=False, overload=True, retry_after=1.0)
    assert ctl.limit == 16 and ctl.delay() == 1.0


def test_plan_raises_the_floor_from_expected_then_observed_latency():
    clock = FakeClock()
    ctl = Controller(2, 1, 100, clock=clock)
    assert ctl.plan(600, 60.0, expected_latency=2.0) == 25  # 600 × 2 s / 60 s × 1.25
    assert ctl.limit == 25
    ctl.sent()
    ctl.done(4.0)  # now it has seen a latency: 4 s
    assert ctl.plan(600, 60.0, expected_latency=2.0) == 50
    assert ctl.plan(10_000, 1.0, expected_latency=2.0) == 100  # capped at the maximum
    ctl.clear_plan()
    ctl.set_limit(3)
    assert ctl.limit == 3


def test_throughput_moves_never_go_below_the_planned_floor():
    clock = FakeClock()
    ctl = Controller(40, 1, 512, clock=clock)
    ctl.plan(1000, 10.0, expected_latency=0.5)  # floor 63
    trace = simulate(ctl, clock, superlinear(0.04, 16), 20.0)  # the peak is far below
    assert min(limit for _, limit in trace) >= 63


# -- rate limits ------------------------------------------------------------------------------


def test_a_request_bucket_allows_its_rate_and_a_burst_of_one_second():
    clock = FakeClock()
    bucket = TokenBucket(120, clock)  # 2 a second
    assert bucket.wait(1) == 0
    bucket.take(1)
    bucket.take(1)
    assert bucket.wait(1) == pytest.approx(0.5)
    clock.now = 0.5
    assert bucket.wait(1) == pytest.approx(0.0)


def test_a_token_bucket_lets_a_big_request_through_into_debt_and_settles():
    clock = FakeClock()
    bucket = TokenBucket(600, clock)  # 10 tokens a second, burst 10
    assert bucket.wait(50) == 0  # bigger than the burst: goes when the bucket is full
    bucket.take(50)
    assert bucket.wait(5) == pytest.approx(4.5)  # (5 - (-40)) / 10
    bucket.give_back(30)  # it used 20, not 50
    assert bucket.wait(5) == pytest.approx(1.5)


def test_the_pacer_spaces_sends_on_an_injected_clock():
    clock = FakeClock()
    times: list[float] = []

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)

    pacer = Pacer(rpm=60, tpm=None, clock=clock, sleep=sleep)

    async def one() -> None:
        await pacer.acquire(0)
        times.append(clock.now)

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(5)))

    asyncio.run(main())
    assert times == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])
