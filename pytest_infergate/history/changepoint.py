"""Where a metric's level changed across runs, and whether it is creeping. Pure Python, like stats.py.

Each run counts once (the statistic its gate decides on, on a log scale), so run-to-run noise stays noise. Steps:
binary segmentation, a split kept when a sequential permutation test gives p < alpha, the change is at least
`min_change` and twice the run-to-run noise, and a straight line does not fit better; each kept change gets a
hierarchical bootstrap interval over runs and their samples. Creep: over the last `window` runs after the last
change, a Mann-Kendall trend (permutation p-value) with the Theil-Sen slope per run. Why the run is the unit, and
the tests' details: docs/guides/read-the-report.md, 'The history'.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_infergate.stats import percentile

ALPHA = 0.05  # per split; with 8 runs (4 | 4) a permutation test cannot go below 2/70 = 0.029
MIN_CHANGE = 0.05  # smaller steps are noise for a gate whose tolerance is typically 10%
MIN_SIZE = 2  # runs on each side of a change: one run alone is the gate's business, not history's
PERMUTATIONS = 999
EXCEEDANCES = 20  # Besag-Clifford: stop shuffling once this many shuffles beat the observed statistic
CREEP_WINDOW = 8
CREEP_ALPHA = 0.01  # a history has one creep test per series: false alarms add up across a suite
MIN_CREEP = 0.05  # total drift over the window


@dataclass
class ChangePoint:
    index: int  # position of the first run at the new level
    before: float  # level (geometric mean of run values) of the stretch before
    after: float
    change: float  # after / before - 1
    low: float  # 95% CI of the change
    high: float
    p_value: float


@dataclass
class Creep:
    start: int  # first run of the window
    slope: float  # relative change per run (Theil-Sen on the log scale)
    drift: float  # over the window: (1 + slope) ** (runs - 1) - 1
    p_value: float  # Mann-Kendall, permutation


def _max_t(z: Sequence[float], min_size: int) -> tuple[int, float]:
    """(split, statistic): the two-sample t statistic of z[:k] against z[k:], largest over k."""
    n = len(z)
    total, total_sq = sum(z), sum(v * v for v in z)
    best_k, best = min_size, -1.0
    left = left_sq = 0.0
    for k in range(1, n - min_size + 1):
        left += z[k - 1]
        left_sq += z[k - 1] * z[k - 1]
        if k < min_size:
            continue
        right, right_sq, m = total - left, total_sq - left_sq, n - k
        diff = right / m - left / k
        ss = max(0.0, left_sq - left * left / k) + max(0.0, right_sq - right * right / m)
        scale = math.sqrt(ss / max(1, n - 2) * (1 / k + 1 / m))
        stat = abs(diff) / scale if scale > 1e-12 else (math.inf if abs(diff) > 1e-12 else 0.0)
        if stat > best:
            best_k, best = k, stat
    return best_k, best


def _run_noise(z: Sequence[float]) -> float:
    """Run-to-run noise (log scale) from successive differences (median absolute, scaled to a normal's standard
    deviation): a step moves one difference only, so it barely changes this estimate."""
    if len(z) < 3:
        return 0.0
    return 1.4826 * percentile([abs(b - a) for a, b in zip(z, z[1:])], 50) / math.sqrt(2)


def _permutation_p(z: list[float], observed: float, statistic, rng: random.Random) -> float:
    shuffled, beaten = list(z), 0
    for done in range(1, PERMUTATIONS + 1):
        rng.shuffle(shuffled)
        if statistic(shuffled) >= observed:
            beaten += 1
            if beaten >= EXCEEDANCES:
                return beaten / done
    return (beaten + 1) / (PERMUTATIONS + 1)


def _rss_steps(z: Sequence[float], min_size: int) -> float:
    """The smallest residual sum of squares of a piecewise-constant fit with one or two steps (each piece at
    least `min_size` runs): a staircase of two regressions must not pass for a trend."""
    n = len(z)
    sums, squares = [0.0], [0.0]
    for v in z:
        sums.append(sums[-1] + v)
        squares.append(squares[-1] + v * v)

    def ss(a: int, b: int) -> float:
        total = sums[b] - sums[a]
        return max(0.0, squares[b] - squares[a] - total * total / (b - a))

    best = min((ss(0, k) + ss(k, n) for k in range(min_size, n - min_size + 1)), default=math.inf)
    for j in range(min_size, n - 2 * min_size + 1):
        for k in range(j + min_size, n - min_size + 1):
            best = min(best, ss(0, j) + ss(j, k) + ss(k, n))
    return best


def _rss_line(z: Sequence[float]) -> float:
    n = len(z)
    x_mean, z_mean = (n - 1) / 2, sum(z) / n
    sxx = sum((x - x_mean) ** 2 for x in range(n))
    slope = sum((x - x_mean) * (v - z_mean) for x, v in enumerate(z)) / sxx
    return sum((v - z_mean - slope * (x - x_mean)) ** 2 for x, v in enumerate(z))


def _splits(z: list[float], lo: int, hi: int, rng: random.Random, alpha: float, min_change: float,
            min_size: int) -> list[tuple[int, float]]:
    """Binary segmentation of z[lo:hi]: (index, p-value) of every accepted split."""
    part = z[lo:hi]
    if len(part) < 2 * min_size:
        return []
    k, observed = _max_t(part, min_size)
    step = abs(sum(part[k:]) / len(part[k:]) - sum(part[:k]) / k)
    if observed <= 0 or math.expm1(step) < max(min_change, 2 * _run_noise(part)):
        return []
    if _rss_line(part) <= _rss_steps(part, min_size):  # a trend fits at least as well: creep, not a step
        return []
    p = _permutation_p(part, observed, lambda s: _max_t(s, min_size)[1], rng)
    if p >= alpha:
        return []
    return (_splits(z, lo, lo + k, rng, alpha, min_change, min_size) + [(lo + k, p)]
            + _splits(z, lo + k, hi, rng, alpha, min_change, min_size))


def _run_value(samples: Sequence[float], q: float = 50) -> float:
    return percentile(samples, q)


def _thin(samples: Sequence[float], most: int = 64) -> list[float]:
    """At most `most` samples, evenly spaced in sorted order: the same distribution, a bounded bootstrap cost."""
    ordered = sorted(samples)
    if len(ordered) <= most:
        return ordered
    return [ordered[round(i * (len(ordered) - 1) / (most - 1))] for i in range(most)]


def _run_draws(samples: Sequence[float], rng: random.Random, q: float = 50, count: int = 200) -> list[float]:
    """Log statistics of `count` bootstrap resamples of one run's samples (drawn once per run, then reused)."""
    thin = _thin(samples)
    return [math.log(_run_value(rng.choices(thin, k=len(thin)), q)) for _ in range(count)]


def shift_ci(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]], resamples: int = 1000,
             seed: int = 0, q: float = 50) -> tuple[float, float, float]:
    """(change, low, high): the relative change of level from `before` to `after` (each a list of runs, each run
    its samples) and its 95% hierarchical bootstrap interval: runs resampled, then within each chosen run a
    resample of its samples (from a pool of its bootstrap medians)."""
    rng = random.Random(seed)
    pools = [[_run_draws(r, rng, q) for r in side] for side in (before, after)]

    def drawn_level(pool: list[list[float]]) -> float:
        return sum(rng.choice(run) for run in rng.choices(pool, k=len(pool))) / len(pool)

    point = math.expm1(_level(after, q) - _level(before, q))
    draws = [math.expm1(drawn_level(pools[1]) - drawn_level(pools[0])) for _ in range(resamples)]
    return point, percentile(draws, 2.5), percentile(draws, 97.5)


def _level(runs: Sequence[Sequence[float]], q: float = 50) -> float:
    return sum(math.log(_run_value(r, q)) for r in runs) / len(runs)


def change_points(runs: Sequence[Sequence[float]], alpha: float = ALPHA, min_change: float = MIN_CHANGE,
                  min_size: int = MIN_SIZE, seed: int = 0, q: float = 50) -> list[ChangePoint]:
    """The level changes in a series of runs (each run: its positive samples, at least one), oldest run first,
    of each run's `q`-th percentile."""
    runs = [list(r) for r in runs]
    z = [math.log(_run_value(r, q)) for r in runs]
    found = _splits(z, 0, len(z), random.Random(seed), alpha, min_change, min_size)
    bounds = [0] + [k for k, _ in found] + [len(z)]
    points = []
    for i, (k, p) in enumerate(found):
        before, after = runs[bounds[i]:k], runs[k:bounds[i + 2]]
        change, low, high = shift_ci(before, after, seed=seed, q=q)
        level_before = math.exp(_level(before, q))
        points.append(ChangePoint(k, level_before, level_before * (1 + change), change, low, high, p))
    return points


def _mann_kendall(z: Sequence[float]) -> float:
    return float(sum((z[j] > z[i]) - (z[j] < z[i]) for i in range(len(z)) for j in range(i + 1, len(z))))


def _theil_sen(z: Sequence[float]) -> float:
    return percentile([(z[j] - z[i]) / (j - i) for i in range(len(z)) for j in range(i + 1, len(z))], 50)


def creep(runs: Sequence[Sequence[float]], start: int = 0, window: int = CREEP_WINDOW, alpha: float = CREEP_ALPHA,
          min_drift: float = MIN_CREEP, seed: int = 0, q: float = 50) -> Creep | None:
    """A monotone drift over the last `window` runs from `start` on (e.g. after the last change point), in
    either direction; None when there is none, too little of it, or fewer runs than the window."""
    first = max(start, len(runs) - window)
    z = [math.log(_run_value(r, q)) for r in runs[first:]]
    if len(z) < window:
        return None
    slope = _theil_sen(z)
    drift = math.expm1(slope * (len(z) - 1))
    if abs(drift) < min_drift:
        return None
    observed = abs(_mann_kendall(z))
    p = _permutation_p(z, observed, lambda s: abs(_mann_kendall(s)), random.Random(seed))
    return Creep(first, math.expm1(slope), drift, p) if p < alpha else None
