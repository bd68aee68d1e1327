"""Verdicts against a stored baseline: the run and the baseline were measured apart (another process, maybe hours
later), so nothing cancels the machine's noise as an interleaved A/B does. Each side is summarized by its
least-disturbed repetitions (interference only slows); a failure stands only beyond the runs' own drift
(RUN_DRIFT); the calibration probe (perf.calibration) and the kernel's load evidence (perf.interference) only say
which way the machine moved, and keep the verdicts that hold whatever the size of the move. Why, with the
measurements: docs/explanation/perf-gates.md and docs/measurements.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pytest_infergate.measurement import METRICS, Measurement, busy_share, scales_with_speed
from pytest_infergate.perf import interference
from pytest_infergate.stats import (
    bootstrap_ratio_ci,
    harrell_davis,
    interval_status,
    paired_bootstrap_ci,
    percentile,
)
from pytest_infergate.status import Status

FAST_QUANTILE = 0.10  # which repetitions summarize a side: the least disturbed tenth, smoothed over all of them
MIN_REPETITIONS = 3  # fewer: the pooled samples are compared (verdict.compare_samples)
# How many repetitions a side of a stored comparison takes (a save, and the run compared with it): at least
# LEAST_REPETITIONS, then more until the side's own least-disturbed summary resolves a change of SETTLED_SHARE of
# max_regression (its 95% interval as a factor), at most MOST_REPETITIONS. Two such sides give the comparison an
# interval about half the threshold wide (√2/3 of it), so an unchanged run passes and a ×1.25 one fails at 10%.
LEAST_REPETITIONS, MOST_REPETITIONS = 5, 12
SETTLED_SHARE = 1 / 3


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
    per_request_load_free: list[float] = field(default_factory=list)

    def load_free_costs(self) -> list[float] | None:
        """Each repetition's cost with the co-tenants' load taken out: a latency by each request's own waiting where
        measured (per_request_load_free), else the cost × the repetition's load-free share (for a per-request
        percentile the repetition's share then stands for each request's); None: not measured."""
        if self.per_request_load_free:
            return list(self.per_request_load_free)
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


@dataclass(frozen=True)
class MachineChange:
    """How much slower the machine is now than at the baseline, by the calibration probe (1.2: 20% slower)."""

    ratio: float
    low: float
    high: float

    def beyond(self, threshold: float) -> bool:
        """The whole interval lies outside [1/threshold, threshold]: the machine changed more than the gate allows."""
        return self.low > threshold or self.high < 1.0 / threshold


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
    per_request_load_free = [percentile(v, pct or 50) for v in own] if own and all(own) else []
    if per_request_load_free and min(per_request_load_free) <= 0:
        per_request_load_free = []
    return Side(costs, list(measurement.probe_s) if calibrated else [],
                list(measurement.probe_quiet_s) if calibrated and quiet else [], others, load_free,
                measurement.cpu_threads, measurement.load_free_source(), per_request, per_request_load_free)


def side_resolution(measurement: Measurement, metric: str, pct: float | None) -> float:
    """The smallest change this side alone resolves, as a factor: √(high/low) of the bootstrap interval of its
    least-disturbed summary of `metric` (inf: too few repetitions to summarize)."""
    one = side(measurement, metric, pct, probed=False)
    if one is None:
        return math.inf
    _, low, high = paired_bootstrap_ci(one.costs, least_disturbed, resamples=500)
    return math.sqrt(high / low) if low > 0 else math.inf


# A failure's fresh block (perf.gate.StoredReference.confirm) stops early once EARLY_CONFIRM fresh repetitions are
# each slower than the baseline's least-disturbed figure by more than the threshold × SPELL: the largest whole-run
# slowdown this VM kind showed with nothing else of ours running was ×1.27-1.3 (docs/measurements.md), so no spell
# reaches that, while a ×2 regression passes it on every repetition and need not take the whole block.
EARLY_CONFIRM = 3
SPELL = 1.3
# A failure against a stored baseline stands only where its interval's low end lies beyond threshold × RUN_DRIFT.
# The two sides ran in different processes, minutes apart, and the fastest repetitions of one process do not
# cancel the VM's own drift: with nothing else running, unchanged tiny-random-llama runs compared with a baseline
# saved a minute earlier read up to x1.20 slower (interval low ends up to x1.144; the CPU time per token moved with
# the wall time, no steal and no run-queue wait: the host's, invisible to the guest; the calibration probe moved
# x1.005-1.05), and would fail a 10% gate about 1 compare in 8 (docs/measurements.md). A slowdown within the drift
# is inconclusive and says to compare in one process, where the drift cancels.
RUN_DRIFT = 1.08


def fresh_repetitions_confirm(candidate: Measurement, baseline: Measurement, fresh: int, metric: str,
                              pct: float | None, threshold: float) -> bool:
    """The candidate's last `fresh` repetitions (at least EARLY_CONFIRM) each cost more than the baseline's
    least-disturbed figure × threshold × SPELL, with the co-tenants' load taken out where it was measured."""
    now, then = side(candidate, metric, pct, probed=False), side(baseline, metric, pct, probed=False)
    if now is None or then is None or fresh < EARLY_CONFIRM or fresh > len(now.costs):
        return False
    costs = now.load_free_costs() or now.costs
    return min(costs[-fresh:]) > least_disturbed(then.costs) * threshold * SPELL


@dataclass(frozen=True)
class RepetitionPlan:
    """The repetitions of a measurement that saves a baseline or is compared with one: at least `least`, then
    more while a gated metric's side is wider than `target` (side_resolution), at most `most`."""

    least: int
    most: int
    max_regression: float
    metrics: tuple[tuple[str, float | None], ...]  # (metric, the percentile its budget gates)

    @classmethod
    def of(cls, repeats: int, max_regression: float | None, metrics: list[tuple[str, float | None]]
           ) -> RepetitionPlan:
        least = max(repeats, LEAST_REPETITIONS)
        return cls(least, max(least, MOST_REPETITIONS), max_regression or 0.10,
                   tuple((metric, pct) for metric, pct in metrics if scales_with_speed(metric)))

    @property
    def target(self) -> float:
        return 1.0 + self.max_regression * SETTLED_SHARE

    def widest(self, measurement: Measurement) -> float:
        """The widest gated metric's side_resolution (1.0 where nothing time-like is measured)."""
        return max((side_resolution(measurement, metric, pct) for metric, pct in self.metrics
                    if measurement.samples.get(metric)), default=1.0)

    def settled(self, measurement: Measurement) -> bool:
        return measurement.repetitions >= self.least and self.widest(measurement) <= self.target

    def describe(self, first_s: float) -> str:
        """What the plan will cost, from the first repetition's time."""
        return (f"{self.least}–{self.most} repetitions of about {first_s:.1f} s (until each gated figure's spread "
                f"resolves ×{self.target:.3f}): {self.least * first_s:.0f}–{self.most * first_s:.0f} s")


def as_measured(candidate: Side, baseline: Side) -> Comparison:
    point, low, high = bootstrap_ratio_ci(candidate.costs, baseline.costs, least_disturbed)
    return Comparison(point, low, high, least_disturbed(candidate.costs), least_disturbed(baseline.costs),
                      "as measured")


def machine_change(candidate: Side, baseline: Side) -> MachineChange | None:
    """The probe's level now against the baseline's, from the quiet probes where both sides have them (they do not
    compete with the workload), else from the probes during the repetitions."""
    probes = "quiet" if candidate.quiet and baseline.quiet else "during" if candidate.during and baseline.during \
        else ""
    if not probes:
        return None
    return MachineChange(*bootstrap_ratio_ci(getattr(candidate, probes), getattr(baseline, probes), least_disturbed))


def normalized(candidate: Side, baseline: Side) -> Comparison | None:
    """The comparison at the baseline's machine speed, whichever of two normalizations gives the narrower interval:
    by the machine's level (each side's cost summary over its quiet-probe summary: a machine whose speed moved
    between the runs but not much within either), or repetition by repetition (each cost over the probe run during
    it: load that comes and goes within a run). The bootstrap resamples repetitions together with their probes, so
    the interval carries the probe's own noise. Candidate and baseline summaries are in the baseline's units."""
    if not candidate.during or not baseline.during:
        return None
    # Per repetition, the median: the probe already took out the interference it tracked, and a low quantile of
    # cost/probe would pick the repetitions whose probe read slowest by its own noise.
    options = [("per repetition",
                [c / p for c, p in zip(candidate.costs, candidate.during)],
                [c / p for c, p in zip(baseline.costs, baseline.during)], lambda xs: harrell_davis(xs, 0.5))]
    if candidate.quiet and baseline.quiet:
        def by_level(items: list[tuple[float, float]]) -> float:
            return least_disturbed([c for c, _ in items]) / least_disturbed([p for _, p in items])

        options.append(("by level", list(zip(candidate.costs, candidate.quiet)),
                        list(zip(baseline.costs, baseline.quiet)), by_level))
    best, base_cost = None, least_disturbed(baseline.costs)
    for name, cand, base, statistic in options:
        point, low, high = bootstrap_ratio_ci(cand, base, statistic)
        if best is None or high / low < best.high / best.low:
            best = Comparison(point, low, high, point * base_cost, base_cost, name)
    return best


@dataclass(frozen=True)
class StoredVerdict:
    """What verdict.compare_stored turns into a Verdict."""

    status: Status
    measured: Comparison
    machine: MachineChange | None
    disagreement: str  # why a decisive comparison was made inconclusive ("" if it was not)
    baseline_at_fault: bool = False  # the disagreement blames the baseline's runner: more of this run cannot help
    load_corrected: bool = False  # decided on the figures with the co-tenants' load taken out (load_free_failure)
    within_drift: bool = False  # slower, but no more than the runs' own drift (RUN_DRIFT): more repetitions cannot help


def decide(candidate: Side, baseline: Side, max_regression: float) -> StoredVerdict:
    """The verdict as measured, kept only where the machine's move (by the probe) cannot have made it: see the
    module's docstring. The normalized comparison is reported, never decisive."""
    threshold = 1.0 + max_regression
    measured = as_measured(candidate, baseline)
    status = measured.status(threshold)
    change = machine_change(candidate, baseline)
    drift = within_drift(measured, status, threshold)
    if drift:  # no failure as measured, whatever the evidence below (the load-corrected figures decide apart)
        status = Status.INCONCLUSIVE
    busy = busy_sides(candidate, baseline, measured, status, threshold)
    if busy is not None:
        return StoredVerdict(busy.status, measured, change, busy.why, busy.baseline_at_fault, busy.load_corrected)
    if drift:
        return StoredVerdict(status, measured, change, drift, within_drift=measured.ratio <= threshold * RUN_DRIFT)
    adjusted = normalized(candidate, baseline) if change is not None else None
    if change is not None and change.low > threshold:  # slower now: a busy runner (or a slower host)
        if status == Status.PASS:
            return StoredVerdict(status, measured, change, "")
        if status == Status.FAIL and measured.low > threshold * change.high * RUN_DRIFT:
            # slower than the machine's move can explain: on these VMs the probe's own level moved x1.2-1.3 between
            # processes while an unchanged workload read x1.0 (docs/measurements.md), so the move alone must not
            # make a x2 regression inconclusive
            return StoredVerdict(status, measured, change,
                                 f"slower than the machine's move can explain: ×{measured.low:.3f} at least, beyond "
                                 f"the threshold × the probe's ×{change.high:.2f} × the runs' drift ×{RUN_DRIFT}")
        return StoredVerdict(Status.INCONCLUSIVE, measured, change,
                             f"the runner was busy: the calibration probe ran ×{change.ratio:.2f} slower than when the "
                             f"baseline was saved, so a slowdown as measured (×{measured.ratio:.3f}) cannot be told "
                             f"from the machine's{_normalized_aside(adjusted, threshold)}; rerun on a quiet runner")
    if change is not None and change.high < 1.0 / threshold:  # faster now: the baseline was saved on a busy runner
        if status == Status.FAIL:
            return StoredVerdict(status, measured, change, "")
        return StoredVerdict(Status.INCONCLUSIVE, measured, change,
                             f"the baseline was saved on a busy runner: the calibration probe ran "
                             f"×{1.0 / change.ratio:.2f} slower then than now, so this run being no slower "
                             f"(×{measured.ratio:.3f}) says nothing{_normalized_aside(adjusted, threshold)}; re-save "
                             "the baseline on a quiet runner", baseline_at_fault=True)
    other = adjusted.status(threshold) if adjusted is not None else Status.INCONCLUSIVE
    if status != Status.INCONCLUSIVE and other not in (Status.INCONCLUSIVE, status):
        return StoredVerdict(Status.INCONCLUSIVE, measured, change,
                             f"as measured it would {status}, normalized {adjusted.normalization} for the machine's "
                             f"speed (probe ×{change.ratio:.3f}) it would {other} (×{adjusted.ratio:.3f})")
    return StoredVerdict(status, measured, change, "")


def within_drift(measured: Comparison, status: Status, threshold: float) -> str:
    """Why a failure as measured is no failure against a stored baseline (its low end within threshold ×
    RUN_DRIFT), or "" where it stands or is no failure."""
    bound = threshold * RUN_DRIFT
    if status != Status.FAIL or measured.low > bound:
        return ""
    return (f"×{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}] slower than the baseline, but not "
            f"beyond ×{bound:.2f} (the threshold × {RUN_DRIFT}, the most an unchanged run drifted from a stored "
            "baseline on these machines): the two runs cannot tell it from the machine's own drift; compare in one "
            "process (infergate_bench.ab) or set a max_regression above the drift")


@dataclass(frozen=True)
class BusyVerdict:
    status: Status
    why: str
    baseline_at_fault: bool = False  # the baseline's busy runner made it inconclusive
    load_corrected: bool = False


def busy_sides(candidate: Side, baseline: Side, measured: Comparison, status: Status,
               threshold: float) -> BusyVerdict | None:
    """The verdict where the kernel saw other processes keep either side's runner busy (perf.interference): the
    direct evidence, before the probe's indirect one. Busy now: only a pass as measured stands; busy at the save:
    only a failure; busy on both sides: nothing does. None: neither side measured busy."""
    now, then = busy_share(candidate.others), busy_share(baseline.others)
    if now is None and then is None:
        return None
    failed = load_free_failure(candidate, baseline, measured.ratio, threshold, max(now or 0.0, then or 0.0))
    if failed is not None:
        return BusyVerdict(Status.FAIL, failed, load_corrected=True)
    if now is not None and then is None:
        if status == Status.PASS or (status == Status.FAIL and measured.low > interference.explainable_slowdown(now)):
            return BusyVerdict(status, "")  # passed despite the load, or slower than the load can explain
        return BusyVerdict(Status.INCONCLUSIVE, f"the runner was busy: {interference.describe(now)} during this run, "
                                                f"so a slowdown as measured (×{measured.ratio:.3f}) cannot be told "
                                                "from the machine's load; rerun on a quiet runner")
    if then is not None and now is None:
        if status == Status.FAIL:
            return BusyVerdict(status, "")
        return BusyVerdict(Status.INCONCLUSIVE, f"the baseline was saved on a busy runner: "
                                                f"{interference.describe(then)} while it was measured, so this run "
                                                f"being no slower (×{measured.ratio:.3f}) says nothing; re-save the "
                                                "baseline on a quiet runner", baseline_at_fault=True)
    steady = steady_co_tenant(candidate, baseline, threshold, now, then)
    if steady is not None:
        return steady
    return BusyVerdict(Status.INCONCLUSIVE, f"the runner was busy on both sides, unevenly: "
                                            f"{interference.describe(now)} during this run and "
                                            f"{interference.taken(then)} while the baseline was saved; re-save the "
                                            "baseline and rerun on a quiet runner", baseline_at_fault=True)


# Two busy sides had "the same" co-tenant when the others' shares of the machine differ by at most SAME_LOAD_SHARE
# and our threads' load-free shares (the share of wall time they would have needed alone) by at most a factor
# SAME_LOAD_FACTOR: one busy loop beside the run at the save and at the compare, as a steady neighbour on a shared
# runner keeps.
SAME_LOAD_SHARE = 0.15
SAME_LOAD_FACTOR = 1.25


def steady_co_tenant(candidate: Side, baseline: Side, threshold: float, now: float,
                     then: float) -> BusyVerdict | None:
    """Both sides ran beside the same co-tenant (SAME_LOAD_SHARE, SAME_LOAD_FACTOR): the load hit them alike, so
    their load-free costs (Side.load_free_costs) compare like a quiet pair's and decide both ways — a pass where the
    whole interval lies within the threshold, a failure beyond the threshold times the correction's per-repetition
    error (interference.load_free_residual: a steady load stretches both sides' latencies alike, so a team's or one
    thread's error applies, not the uneven-load margin). None: the loads differ, or were not measured alike."""
    cand, base = candidate.load_free_costs(), baseline.load_free_costs()
    if cand is None or base is None or candidate.load_free_by != baseline.load_free_by:
        return None
    free_now, free_then = harrell_davis(candidate.load_free, 0.5), harrell_davis(baseline.load_free, 0.5)
    if abs(now - then) > SAME_LOAD_SHARE or max(free_now, free_then) > SAME_LOAD_FACTOR * min(free_now, free_then):
        return None
    point, low, high = bootstrap_ratio_ci(cand, base, least_disturbed)
    residual = interference.load_free_residual(candidate, baseline, baseline_quiet=True)
    how = (f"{interference.load_corrected(candidate.load_free_by)}, both sides beside the same co-tenant "
           f"({interference.taken(now)} now, {interference.taken(then)} at the save; our threads had "
           f"{free_now:.0%} and {free_then:.0%} of the CPU they needed): ×{point:.3f} [{low:.3f}, {high:.3f}], "
           f"resolves slowdowns above ×{math.sqrt(high / low) if low > 0 else math.inf:.3f}")
    if high <= threshold:
        return BusyVerdict(Status.PASS, how, load_corrected=True)
    if low > threshold * residual:
        return BusyVerdict(Status.FAIL, f"{how}, beyond ×{threshold * residual:.2f} (the threshold × the "
                                        f"correction's error ×{residual})", load_corrected=True)
    return BusyVerdict(Status.INCONCLUSIVE, f"{how}: not beyond ×{threshold * residual:.2f}, the most the correction "
                                            "can be off, nor within the threshold")


def load_free_failure(candidate: Side, baseline: Side, measured_ratio: float, threshold: float,
                      share: float) -> str | None:
    """A slowdown on a busy runner that the load cannot have made: the two sides' costs with the co-tenants' load
    taken out (Side.load_free_costs) compared, failing only when the whole interval lies above the threshold
    times the estimate's measured residual (interference.load_free_residual: measured between runs, so the runs'
    own drift, RUN_DRIFT, is in it). Returns the reason, naming the load
    and the evidence, or None (not measured on both sides, or not beyond the bound)."""
    cand, base = candidate.load_free_costs(), baseline.load_free_costs()
    if cand is None or base is None or candidate.load_free_by != baseline.load_free_by:
        return None  # not measured on both sides, or by different evidence (run-queue delay vs device time)
    point, low, high = bootstrap_ratio_ci(cand, base, least_disturbed)
    residual = stored_residual(candidate, baseline)
    bound = threshold * residual
    if low <= bound:
        return None
    return (f"{interference.load_corrected(candidate.load_free_by)}: ×{point:.3f} [{low:.3f}, {high:.3f}] slower "
            f"with the co-tenants' load taken out (×{measured_ratio:.3f} as measured; {interference.describe(share)}), "
            f"beyond ×{bound:.2f}, the most the correction can be off (×{residual} on the threshold)")


def stored_residual(candidate: Side, baseline: Side) -> float:
    """How far two load-corrected sides of a stored comparison can be off: one thread's per-repetition error
    (interference.LOAD_FREE_RESIDUAL_ONE_THREAD) where both ran on one CPU thread and the figure is the repetition's
    own (a throughput), each request's own (WaitClock), or only the candidate was busy; else a team's margin
    (LOAD_FREE_RESIDUAL): a busy baseline's per-request percentile scaled by its repetition's share understates it
    unevenly, since a time-sliced co-tenant stretches a few requests a lot and most not at all (unchanged code read
    ITL ×1.31 [1.11, 1.43] slower that way, docs/measurements.md). Understating a busy *candidate* the same way can
    only hide a slowdown, never make one: one thread's error is its margin."""
    one_thread = candidate.cpu_threads == 1 and baseline.cpu_threads == 1
    whole = not candidate.per_request or bool(candidate.per_request_load_free and baseline.per_request_load_free)
    if one_thread and (whole or busy_share(baseline.others) is None):
        return interference.LOAD_FREE_RESIDUAL_ONE_THREAD
    return interference.LOAD_FREE_RESIDUAL


def _normalized_aside(adjusted: Comparison | None, threshold: float) -> str:
    if adjusted is None:
        return ""
    return (f" (normalized by the probe it would read ×{adjusted.ratio:.3f}, "
            f"{adjusted.status(threshold)}, but the probe does not slow as the engine does)")


def in_metric_units(metric: str, cost: float) -> float:
    """A cost back in the metric's own unit (throughputs were inverted)."""
    return 1.0 / cost if METRICS[metric][1] and cost > 0 else cost
