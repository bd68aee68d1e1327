"""Noise-aware verdicts: is a candidate measurement worse than a baseline by more than `max_regression`?

A bootstrap confidence interval of the candidate/baseline ratio decides: pass when the whole interval lies at or
below the threshold, fail when it lies above, inconclusive when it straddles it (more samples would decide).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pytest_infergate.perf import calibration
from pytest_infergate.perf.budget import Budget
from pytest_infergate.perf.metrics import METRICS, Measurement
from pytest_infergate.stats import bootstrap_ratio_ci, paired_bootstrap_ci, percentile
from pytest_infergate.status import Status


@dataclass
class Verdict:
    """Candidate vs baseline for one metric. `ratio` > 1 means the candidate is worse, whatever the direction."""

    metric: str
    status: Status
    ratio: float
    low: float
    high: float
    threshold: float  # 1 + max_regression
    percentile: int | None
    candidate: float
    baseline: float
    samples: tuple[int, int]
    paired: bool = False  # the ratio is the median of per-round ratios of an interleaved A/B run
    # Normalized for machine speed (perf.calibration): the calibration probe's time now / when the baseline was
    # measured (1.2: the machine is 20% slower now); `candidate` is then the value at the baseline's machine speed
    # and `raw_candidate` the value measured. None: not normalized.
    machine_slowdown: float | None = None
    raw_candidate: float | None = None
    normalization: str = ""  # "by level" or "per repetition" (compare_calibrated)

    def describe(self) -> str:
        where = f"p{self.percentile} " if self.percentile else ""
        pairing = ", paired by round" if self.paired else ""
        normalized = ""
        if self.machine_slowdown is not None:
            normalized = (f"; normalized for machine speed: calibration probe x{self.machine_slowdown:.3f} of the "
                          f"baseline's{f' ({self.normalization})' if self.normalization else ''}, measured "
                          f"{self.raw_candidate:.4g} before normalizing, CI over repetitions")
        return (f"{self.metric} {where}{self.status.upper()}: candidate/baseline slowdown x{self.ratio:.3f} "
                f"(95% CI {self.low:.3f}-{self.high:.3f}, threshold x{self.threshold:.3f}; "
                f"{self.candidate:.4g} vs {self.baseline:.4g}, n={self.samples[0]}/{self.samples[1]}{pairing}"
                f"{normalized})")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "status": Status(data["status"]), "samples": tuple(data.get("samples", (0, 0)))})


def compare_samples(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                    pct: int | None = 50, confidence: float = 0.95, resamples: int = 2000) -> Verdict:
    """Bootstrap CI of the candidate/baseline ratio of the chosen percentile, oriented so that > 1 is worse.

    pass: the whole CI lies at or below 1 + max_regression; fail: the whole CI lies above it;
    inconclusive: the CI straddles it (more samples would decide).
    """
    higher_is_better = METRICS[metric][1]
    stat = (lambda xs: percentile(xs, pct)) if METRICS[metric][2] else (lambda xs: percentile(xs, 50))
    if higher_is_better:  # worse = smaller, so take baseline/candidate
        point, low, high = bootstrap_ratio_ci(baseline, candidate, stat, confidence, resamples)
    else:
        point, low, high = bootstrap_ratio_ci(candidate, baseline, stat, confidence, resamples)
    threshold = 1.0 + max_regression
    return Verdict(metric, _decide(low, high, threshold), point, low, high, threshold,
                   pct if METRICS[metric][2] else None, stat(candidate), stat(baseline),
                   (len(candidate), len(baseline)))


def compare_paired(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                   confidence: float = 0.95, resamples: int = 2000) -> Verdict:
    """Like compare_samples for a per-repetition metric of an interleaved A/B run, where candidate[i] and
    baseline[i] were measured back to back: the ratio is taken within each round, so drift of the machine
    between rounds cancels instead of widening the interval; the CI bootstraps the median over rounds."""
    higher_is_better = METRICS[metric][1]
    ratios = [(b / c if higher_is_better else c / b) for c, b in zip(candidate, baseline) if c > 0 and b > 0]
    if len(ratios) != len(candidate):
        return compare_samples(metric, candidate, baseline, max_regression)
    point, low, high = paired_bootstrap_ci(ratios, lambda xs: percentile(xs, 50), confidence, resamples)
    threshold = 1.0 + max_regression
    return Verdict(metric, _decide(low, high, threshold), point, low, high, threshold, None,
                   percentile(candidate, 50), percentile(baseline, 50), (len(candidate), len(baseline)),
                   paired=True)


def normalized_repetitions(measurement: Measurement, metric: str, reference_s: float) -> list[list[float]] | None:
    """`metric`'s samples per repetition, each scaled to the machine speed at which the calibration probe takes
    `reference_s` by the probe measured next to its own repetition; None without a usable calibration."""
    reps = measurement.by_repetition(metric)
    if reps is None or not measurement.probe or len(measurement.probe_s) != len(reps) \
            or min(measurement.probe_s, default=0) <= 0:
        return None
    return [[v * calibration.scale(metric, probe, reference_s) for v in values]
            for values, probe in zip(reps, measurement.probe_s)]


def calibration_usable(candidate: Measurement, baseline: Measurement) -> bool:
    """Both measured with the same calibration probe, next to every repetition."""
    return bool(candidate.probe) and candidate.probe == baseline.probe \
        and len(candidate.probe_s) == candidate.repetitions > 0 and len(baseline.probe_s) == baseline.repetitions > 0


def machine_slowdown(candidate: Measurement, baseline: Measurement) -> float:
    """How much slower the machine is now than when the baseline was measured, by the calibration probe."""
    return percentile(candidate.probe_s, 50) / percentile(baseline.probe_s, 50)


def quiet_usable(candidate: Measurement, baseline: Measurement) -> bool:
    """Both recorded the quiet probe (right before and after, no workload running) for every repetition."""
    return all(len(m.probe_quiet_s) == m.repetitions > 0 and min(m.probe_quiet_s) > 0 for m in (candidate, baseline))


def compare_calibrated(metric: str, candidate: Measurement, baseline: Measurement, max_regression: float,
                       pct: int | None = 50, confidence: float = 0.95, resamples: int = 2000) -> Verdict | None:
    """compare_samples for a candidate and a stored baseline that were both measured next to the calibration
    probe, normalized to the baseline's machine speed in one of two ways, whichever gives the narrower interval:
    - by the machine's level: each side scaled by the median of its quiet probes (right before and after each
      repetition), for a machine whose speed moved between the two runs but not much within either; the probes
      during a repetition compete with it for the cores and would add their own noise to every repetition;
    - repetition by repetition, every sample by the probes run during its own repetition, for a machine whose load
      changes within a run (the probe sampled through a repetition tracks it; before and after alone do not).
    Either way the bootstrap resamples whole repetitions with their probes, so the CI holds what the probe did not
    cancel, its own noise included. The statistic is the chosen percentile of the pooled samples for per-request
    metrics, the geometric mean over repetitions for per-repetition ones (a median of a few repetitions barely
    moves under resampling). None: not normalizable."""
    if not calibration.normalizes(metric) or not calibration_usable(candidate, baseline):
        return None
    cand_reps, base_reps = candidate.by_repetition(metric), baseline.by_repetition(metric)
    if not cand_reps or not base_reps or not all(cand_reps) or not all(base_reps):
        return None
    if not METRICS[metric][2] and min(v for reps in (cand_reps, base_reps) for values in reps for v in values) <= 0:
        return None
    if METRICS[metric][2]:
        def pooled(reps: list[list[float]]) -> float:
            return percentile([v for values in reps for v in values], pct or 50)
    else:
        def pooled(reps: list[list[float]]) -> float:
            return math.exp(sum(math.log(values[0]) for values in reps) / len(reps))
    reference = percentile(baseline.probe_s, 50)
    cand_normalized = normalized_repetitions(candidate, metric, reference)
    base_normalized = normalized_repetitions(baseline, metric, reference)
    if cand_normalized is None or base_normalized is None:
        return None

    def per_repetition(items: list) -> float:  # items: (samples already normalized by their own probe, unused)
        return pooled([values for values, _ in items])

    def by_level(items: list) -> float:  # items: (samples as measured, the repetition's quiet probe)
        # scaled to the baseline's quiet level: the quiet probe runs alone, so it reads faster than the one during
        return pooled([values for values, _ in items]) * calibration.scale(
            metric, percentile([probe for _, probe in items], 50), percentile(baseline.probe_quiet_s, 50))

    choices = [("per repetition", per_repetition, cand_normalized, base_normalized, candidate.probe_s,
                baseline.probe_s, machine_slowdown(candidate, baseline))]
    if quiet_usable(candidate, baseline):
        choices.append(("by level", by_level, cand_reps, base_reps, candidate.probe_quiet_s, baseline.probe_quiet_s,
                        percentile(candidate.probe_quiet_s, 50) / percentile(baseline.probe_quiet_s, 50)))
    higher_is_better = METRICS[metric][1]
    best = None
    for name, stat, cand_values, base_values, cand_probes, base_probes, slowdown in choices:
        cand, base = list(zip(cand_values, cand_probes)), list(zip(base_values, base_probes))
        worse, better = (base, cand) if higher_is_better else (cand, base)
        point, low, high = _cluster_bootstrap_ratio(worse, better, stat, confidence, resamples)
        if best is None or high / low < best[2] / best[1]:
            best = (point, low, high, name, stat(cand), stat(base), slowdown)
    point, low, high, name, cand_value, base_value, slowdown = best
    threshold = 1.0 + max_regression
    raw = candidate.value(metric, pct) if METRICS[metric][2] else percentile(candidate.samples[metric], 50)
    return Verdict(metric, _decide(low, high, threshold), point, low, high, threshold,
                   pct if METRICS[metric][2] else None, cand_value, base_value, (len(cand_reps), len(base_reps)),
                   machine_slowdown=slowdown, raw_candidate=raw, normalization=name)


def _cluster_bootstrap_ratio(numerator: list, denominator: list, stat: Callable[[list], float], confidence: float,
                             resamples: int, seed: int = 0) -> tuple[float, float, float]:
    """(point, low, high) of stat(numerator) / stat(denominator), resampling each side's items (repetitions)."""
    rng = random.Random(seed)
    point = stat(numerator) / stat(denominator)
    ratios = []
    for _ in range(resamples):
        num = [numerator[rng.randrange(len(numerator))] for _ in numerator]
        den = stat([denominator[rng.randrange(len(denominator))] for _ in denominator])
        if den:
            ratios.append(stat(num) / den)
    tail = (1 - confidence) / 2 * 100
    return point, percentile(ratios, tail), percentile(ratios, 100 - tail)


def _decide(low: float, high: float, threshold: float) -> Status:
    return Status.FAIL if low > threshold else Status.PASS if high <= threshold else Status.INCONCLUSIVE


def compare_measurements(candidate: Measurement, baseline: Measurement, budget: Budget,
                         metrics: list[str] | None = None, paired: bool = False,
                         calibrated: bool = False) -> list[Verdict]:
    """Verdicts for every metric the budget names (or `metrics`), present in both measurements. `paired`:
    the two were measured in interleaved rounds, so per-repetition metrics compare round by round.
    `calibrated`: a stored baseline and a candidate both measured next to the calibration probe; time-like
    metrics are normalized for machine speed (compare_calibrated), memory is compared as measured."""
    if budget.max_regression is None:
        return []
    names = metrics or sorted({limit.metric for limit in budget.limits} or {"tokens_per_s", "ttft_ms"})
    verdicts = []
    for metric in names:
        a, b = candidate.samples.get(metric), baseline.samples.get(metric)
        if not a or not b or metric in ("load_s",):
            continue
        if paired and not METRICS[metric][2] and len(a) == len(b) > 1:
            verdicts.append(compare_paired(metric, a, b, budget.max_regression))
            continue
        pct = next((limit.percentile for limit in budget.limits if limit.metric == metric), budget.percentile)
        verdict = compare_calibrated(metric, candidate, baseline, budget.max_regression, pct) if calibrated else None
        verdicts.append(verdict or compare_samples(metric, a, b, budget.max_regression, pct))
    return verdicts
