"""Small statistics: percentiles, the order-statistic interval of a median, paired/unpaired bootstrap confidence
intervals. Pure Python + random."""

from __future__ import annotations

import functools
import math
import operator
import random
from collections.abc import Callable, Sequence

from pytest_infergate.status import Status


def interval_status(low: float, high: float, threshold: float) -> Status:
    """A ratio's interval against its threshold: fail when it lies wholly above, pass when wholly at or below,
    inconclusive when it straddles it (more samples would decide)."""
    return Status.FAIL if low > threshold else Status.PASS if high <= threshold else Status.INCONCLUSIVE


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def bootstrap_ratio_ci(candidate: Sequence, baseline: Sequence, statistic: Callable[[Sequence], float],
                       confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(point, low, high) of statistic(candidate) / statistic(baseline), resampling each sample independently. The
    items may be values or whole repetitions (e.g. a repetition's cost with its probe times), which `statistic`
    then summarizes."""
    if not candidate or not baseline:
        raise ValueError("bootstrap needs two non-empty samples")
    rng = random.Random(seed)
    point = statistic(candidate) / statistic(baseline)
    ratios = []
    for _ in range(resamples):
        c = [candidate[rng.randrange(len(candidate))] for _ in candidate]
        b = [baseline[rng.randrange(len(baseline))] for _ in baseline]
        denominator = statistic(b)
        if denominator:
            ratios.append(statistic(c) / denominator)
    tail = (1 - confidence) / 2 * 100
    return point, percentile(ratios, tail), percentile(ratios, 100 - tail)


def paired_bootstrap_ci(values: Sequence[float], statistic: Callable[[Sequence[float]], float] = mean,
                        confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(point, low, high) of statistic over per-item values (e.g. per-sample metric deltas), items resampled."""
    if not values:
        raise ValueError("bootstrap of an empty sample")
    rng = random.Random(seed)
    stats = [statistic([values[rng.randrange(len(values))] for _ in values]) for _ in range(resamples)]
    tail = (1 - confidence) / 2 * 100
    return statistic(values), percentile(stats, tail), percentile(stats, 100 - tail)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the distribution-free interval of the median from order statistics. The k-th smallest
    and k-th largest of n values bound the median with probability 1 - 2 P(Binomial(n, 1/2) < k), whatever the
    distribution, so k is the largest that keeps that at `confidence`. A bootstrap of the median of a handful of
    values under-covers (with a few A/B rounds it claims 95% and is right less often: docs/measurements.md).
    Below `min_rounds(confidence)` values no interval reaches the confidence: (median, 0, inf), which decides
    nothing."""
    if not values:
        raise ValueError("median interval of an empty sample")
    ordered, n = sorted(values), len(values)
    k = _order_rank(n, confidence)
    if k == 0:
        return percentile(ordered, 50), 0.0, math.inf
    return percentile(ordered, 50), ordered[k - 1], ordered[n - k]


def min_rounds(confidence: float = 0.95) -> int:
    """The fewest values whose extremes bound the median at `confidence` (6 at 95%: 1 - 2/64 = 0.969)."""
    n = 1
    while _order_rank(n, confidence) == 0:
        n += 1
    return n


@functools.cache
def _order_rank(n: int, confidence: float) -> int:
    """The largest k with 1 - 2 P(Binomial(n, 1/2) < k) >= confidence; 0 when even k = 1 falls short."""
    below, best = 0.0, 0
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n  # P(Binomial(n, 1/2) <= k - 1)
        if 1 - 2 * below < confidence:
            break
        best = k
    return best


def harrell_davis(values: Sequence[float], q: float) -> float:
    """The Harrell-Davis estimate of the q-quantile (q in (0, 1)): a weighted mean of all order statistics, with
    Beta((n+1)q, (n+1)(1-q)) weights. Smoother than one or two order statistics (a bootstrap of it is not stuck on
    the sample's extremes) and more efficient at the tails with a dozen values; BenchmarkDotNet (perfolizer) uses
    it for timing distributions for the same reasons."""
    if not values:
        raise ValueError("quantile of an empty sample")
    ordered = sorted(values)
    # map, not a generator: a bootstrap takes thousands of these, and the same products summed in the same order
    return sum(map(operator.mul, _harrell_davis_weights(len(ordered), q), ordered))


# A timing sample is summarized by its least-disturbed tenth, smoothed over all of it: interference only slows, so
# the fast repetitions are the machine's own speed and the slow ones its neighbours' doing.
FAST_QUANTILE = 0.10


def least_disturbed(values: Sequence[float]) -> float:
    return harrell_davis(values, FAST_QUANTILE)


def resolution(low: float, high: float) -> float:
    """The smallest change an interval [low, high] of a ratio tells from none: its half-width as a factor, √(high/low)
    (inf where it is unbounded or not positive)."""
    if low <= 0 or high <= 0 or not math.isfinite(high):
        return math.inf
    return math.sqrt(high / low)


@functools.cache
def _harrell_davis_weights(n: int, q: float) -> tuple[float, ...]:
    a, b = (n + 1) * q, (n + 1) * (1 - q)
    cdf = [regularized_incomplete_beta(a, b, i / n) for i in range(n + 1)]
    return tuple(cdf[i + 1] - cdf[i] for i in range(n))


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the Beta(a, b) distribution function at x: the continued fraction of Numerical Recipes (6.4),
    evaluated by the modified Lentz method, on the side of x where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def _beta_continued_fraction(a: float, b: float, x: float, tiny: float = 1e-300, eps: float = 1e-14) -> float:
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return fraction
