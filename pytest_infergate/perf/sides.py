"""One side of a stored comparison: a measurement's repetitions of one metric as costs (larger is worse), with what
was measured beside each (the calibration probe, the others' share, the load-free share, each request's own
waiting), summarized by its least-disturbed repetitions; and the comparison of two sides (perf.stored decides on
it, perf.busy where the kernel saw a busy runner)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pytest_infergate.measurement import METRICS, Measurement
from pytest_infergate.stats import harrell_davis, interval_status, paired_bootstrap_ci, percentile
from pytest_infergate.status import Status

FAST_QUANTILE = 0.10  # which repetitions summarize a side: the least disturbed tenth, smoothed over all of them
MIN_REPETITIONS = 3  # fewer: the pooled samples are compared (verdict.compare_samples)


@dataclass(frozen=True)
class Side:
    """One measurement's repetitions of one metric, oriented so that larger is worse (throughputs inverted)."""

    costs: list[float]
    during: list[float]  # the probe's time during each repetition (empty: not calibrated)
    quiet: list[float]  # before and after each repetition, no workload running (empty: not recorded)
    others: list[float] = field(default_factory=list)  # per repetition, the machine's share other processes took
    # per repetition, the share of its wall time the work would have taken with the CPUs to itself (Measurement.
    # load_free_share); empty: not measured
    load_free: list[float] = field(default_factory=list)
    cpu_threads: int = 0  # Measurement.cpu_threads: how exact load_free is (interference.load_free_residual)
    load_free_by: str = ""  # Measurement.load_free_by: what measured load_free
    per_request: bool = False  # a percentile of per-request figures (a latency), not a figure of the repetition
    # per repetition, the percentile of the requests' latencies with each request's own waiting taken out
    # (Measurement.load_free_samples: one thread on the CPU); empty: not measured so
    own_waits: list[float] = field(default_factory=list)

    def load_free_costs(self) -> list[float] | None:
        """Each repetition's cost with the co-tenants' load taken out: a latency by each request's own waiting where
        measured (own_waits), else the cost × the repetition's load-free share (for a per-request percentile the
        repetition's share then stands for each request's); None: not measured."""
        if self.own_waits:
            return list(self.own_waits)
        if len(self.load_free) != len(self.costs) or min(self.load_free, default=0.0) <= 0:
            return None
        return [c * f for c, f in zip(self.costs, self.load_free)]


@dataclass(frozen=True)
class Comparison:
    """Candidate/baseline cost ratio with its bootstrap interval, and the two sides' summaries in cost units."""

    ratio: float
    low: float
    high: float
    candidate_cost: float
    baseline_cost: float
    normalization: str  # "as measured", "by level" or "per repetition"

    def status(self, threshold: float) -> Status:
        return interval_status(self.low, self.high, threshold)


def least_disturbed(values: list[float]) -> float:
    return harrell_davis(values, FAST_QUANTILE)


def side(measurement: Measurement, metric: str, pct: float | None, probed: bool) -> Side | None:
    """`metric` per repetition as a cost, with the repetitions' probes where `probed` (both sides ran the same
    probe); None when the measurement did not keep the split by repetition, has too few repetitions or a value
    that cannot be a cost (zero throughput)."""
    reps = measurement.by_repetition(metric)
    if not reps or len(reps) < MIN_REPETITIONS or not all(reps):
        return None
    per_request = METRICS[metric][2]
    values = [percentile(v, pct or 50) if per_request else v[0] for v in reps]
    if min(values) <= 0:
        return None
    costs = [1.0 / v for v in values] if METRICS[metric][1] else values
    calibrated = probed and len(measurement.probe_s) == len(reps) and min(measurement.probe_s) > 0
    quiet = len(measurement.probe_quiet_s) == len(reps) and min(measurement.probe_quiet_s, default=0) > 0
    others = list(measurement.others_share) if len(measurement.others_share) == len(reps) else []
    load_free = list(measurement.load_free_share) if len(measurement.load_free_share) == len(reps) else []
    own = measurement.load_free_by_repetition(metric) if per_request else None
    own_waits = [percentile(v, pct or 50) for v in own] if own and all(own) else []
    return Side(costs, list(measurement.probe_s) if calibrated else [],
                list(measurement.probe_quiet_s) if calibrated and quiet else [], others, load_free,
                measurement.cpu_threads, measurement.load_free_source(), per_request,
                own_waits if own_waits and min(own_waits) > 0 else [])


def side_resolution(measurement: Measurement, metric: str, pct: float | None) -> float:
    """The smallest change this side alone resolves, as a factor: √(high/low) of the bootstrap interval of its
    least-disturbed summary of `metric` (inf: too few repetitions to summarize)."""
    one = side(measurement, metric, pct, probed=False)
    if one is None:
        return math.inf
    _, low, high = paired_bootstrap_ci(one.costs, least_disturbed, resamples=500)
    return math.sqrt(high / low) if low > 0 else math.inf
