"""Small statistics: percentiles and paired/unpaired bootstrap confidence intervals. Pure Python + random."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


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


def bootstrap_ratio_ci(candidate: Sequence[float], baseline: Sequence[float],
                       statistic: Callable[[Sequence[float]], float],
                       confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(point, low, high) of statistic(candidate) / statistic(baseline), resampling each sample independently."""
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
