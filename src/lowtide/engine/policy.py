"""Retry and poll timing. Pure functions of the attempt count and a random source."""

from __future__ import annotations

import random

from lowtide.core.spec import RetrySpec


def retry_delay(policy: RetrySpec, attempt: int, rng: random.Random) -> float:
    """Exponential backoff with jitter: half to all of base × 2^(attempt-1), capped."""
    base = min(policy.max_backoff_seconds, policy.backoff_seconds * 2 ** max(0, attempt - 1))
    return base * rng.uniform(0.5, 1.0)


def poll_delay(interval: tuple[float, float], polls: int, rng: random.Random) -> float:
    """Wait before the next poll: grows 1.5× per poll from the route's first to its longest
    interval, with ±20 % jitter so many batches do not poll in step."""
    first, longest = interval
    return min(longest, first * 1.5**polls) * rng.uniform(0.8, 1.2)
