"""The statistics of an eval report: bootstrap intervals, McNemar's exact test, quantiles.

The bootstrap resamples rows with replacement (seeded: the same store gives the same report).
For a 0/1 score the number of correct rows in a resample of n rows is Binomial(n, k/n), and
for paired 0/1 scores the counts of (A only, B only, both or neither) are a multinomial: those
are drawn directly, which is the same distribution as resampling the rows and costs B draws,
not B × n.
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000
SEED = 17


def accuracy_ci(correct: int, n: int, level: float = 0.95, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float] | None:
    """The percentile bootstrap interval of correct / n, or None for no rows."""
    if n == 0:
        return None
    draws = np.random.default_rng(seed).binomial(n, correct / n, size=resamples) / n
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_difference_ci(
    a_only: int, b_only: int, n: int, level: float = 0.95, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float] | None:
    """The bootstrap interval of accuracy(A) - accuracy(B) over n paired rows, where A alone
    was right on `a_only` rows and B alone on `b_only`."""
    if n == 0:
        return None
    p = np.array([a_only, b_only, n - a_only - b_only], dtype=float) / n
    draws = np.random.default_rng(seed).multinomial(n, p, size=resamples)
    diffs = (draws[:, 0] - draws[:, 1]) / n
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def mcnemar_p(a_only: int, b_only: int) -> float:
    """McNemar's exact test (two-sided binomial on the discordant pairs, p = 1/2)."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    # log C(n, i) - n log 2, summed in log space: n may be tens of thousands.
    base = math.lgamma(n + 1) - n * math.log(2)
    logs = [base - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, 2 * tail)


def quantiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.95)) -> list[float | None]:
    if not values:
        return [None for _ in qs]
    return [float(x) for x in np.quantile(np.asarray(values, dtype=float), qs)]
