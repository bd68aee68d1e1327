"""Verdicts against a stored baseline: the run and the baseline were measured apart (another process, maybe hours
later), so nothing cancels the machine's noise as an interleaved A/B does. Each side is summarized by its
least-disturbed repetitions (interference only slows); a failure stands only beyond the runs' own drift
(RUN_DRIFT); the calibration probe (perf.calibration) and the kernel's load evidence (perf.interference, perf.busy)
only say which way the machine moved, and keep the verdicts that hold whatever the size of the move; a pass the
drift left undecided may stand at the save's speed of the engine's own thread (perf.speed_pass). Why, with the
measurements: docs/explanation/perf-gates.md and docs/measurements.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from pytest_infergate import units
from pytest_infergate.measurement import METRICS, Measurement, busy_share, scales_with_speed
from pytest_infergate.perf import busy, interference
from pytest_infergate.perf.sides import CostRatio, MachineChange, Side, StoredVerdict
from pytest_infergate.perf.speed_pass import at_thread_speed, held_to_save_speed
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.stats import (
    bootstrap_ratio_ci,
    harrell_davis,
    interval_status,
    least_disturbed,
    percentile,
)
from pytest_infergate.status import Status

MIN_REPETITIONS = 3  # fewer: the pooled samples are compared (verdict.compare_samples)
# a stored baseline's candidate is re-measured at most this many times (a block of repetitions each) while undecided
# (perf.gate.PerfGate)
STORED_MORE = 2


def side(measurement: Measurement, metric: str, pct: float | None, probed: bool,
         thread_probed: bool = False) -> Side | None:
    """`metric` per repetition as a cost, with the repetitions' probes where `probed` (both sides ran the same
    calibration probe) and the engine thread's speed probe where `thread_probed`; None when the measurement did not
    keep the split by repetition, has too few repetitions or a value that cannot be a cost (zero throughput)."""
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
    thread_probe = list(measurement.thread_probe_s) if thread_probed and len(measurement.thread_probe_s) == len(reps) \
        else []
    return Side(costs, list(measurement.probe_s) if calibrated else [],
                list(measurement.probe_quiet_s) if calibrated and quiet else [], others, load_free,
                measurement.cpu_threads, measurement.load_free_source(), per_request, per_request_load_free,
                thread_probe)


# A failure's fresh block (perf.gate.StoredReference.confirm) stops early once EARLY_CONFIRM fresh repetitions are
# each slower than the baseline's least-disturbed figure by more than the threshold × SPELL: SPELL lies at the
# largest whole-run slowdown a shared VM shows with nothing else of ours running (docs/measurements.md), so no spell
# reaches it, while a ×2 regression passes it on every repetition and need not take the whole block.
EARLY_CONFIRM = 3
SPELL = 1.3
# A failure beyond doubt: every repetition so far (at least MIN_REPETITIONS) slower than the baseline's
# least-disturbed figure by more than the threshold × BEYOND_DOUBT, load-corrected where the load was measured, and
# the decision failing it. BEYOND_DOUBT is a whole-run spell of the host (SPELL) and the load correction's largest
# error (interference.LOAD_FREE_RESIDUAL) at once, ×2.08: more than both together make of unchanged code, and more
# than a ×2 slowdown reads at a 10% threshold (×2.29 needed), so only gross changes are cut short. Such a failure
# needs neither the rest of the repetition plan nor more repetitions for the other figures, and its fresh block
# confirms it after BEYOND_DOUBT_CONFIRM repetitions beyond the same bound (perf.gate).
BEYOND_DOUBT = SPELL * interference.LOAD_FREE_RESIDUAL
BEYOND_DOUBT_CONFIRM = 2
# A failure against a stored baseline stands only where its interval's low end lies beyond threshold × RUN_DRIFT.
# The two sides ran in different processes, minutes apart, and the fastest repetitions of one process do not
# cancel the VM's own drift: with nothing else running, unchanged code compared with a baseline saved a minute
# earlier can read slower beyond a 10% threshold (the CPU time per token moves with the wall time, with no steal and
# no run-queue wait: the host's drift, invisible to the guest, which the calibration probe barely sees; the figures:
# docs/measurements.md). A slowdown within the drift is inconclusive and says to compare in one process, where the
# drift cancels.
RUN_DRIFT = 1.08


def repetitions_beyond(candidate: Measurement, baseline: Measurement, last: int | None, metric: str,
                       pct: float | None, bound: float) -> bool:
    """The candidate's last `last` repetitions (None: all) each cost more than the baseline's least-disturbed
    figure × `bound`, with the co-tenants' load taken out where it was measured."""
    now, then = side(candidate, metric, pct, probed=False), side(baseline, metric, pct, probed=False)
    if now is None or then is None or (last or 0) > len(now.costs):
        return False
    costs = now.load_free_costs() or now.costs
    return min(costs[-(last or len(costs)):]) > least_disturbed(then.costs) * bound


def fresh_repetitions_confirm(candidate: Measurement, baseline: Measurement, fresh: int, metric: str,
                              pct: float | None, threshold: float) -> bool:
    """The candidate's last `fresh` repetitions each cost more than the baseline's least-disturbed figure × threshold
    × SPELL (at least EARLY_CONFIRM of them), or × BEYOND_DOUBT (at least BEYOND_DOUBT_CONFIRM)."""
    return (fresh >= EARLY_CONFIRM and repetitions_beyond(candidate, baseline, fresh, metric, pct, threshold * SPELL)) \
        or (fresh >= BEYOND_DOUBT_CONFIRM
            and repetitions_beyond(candidate, baseline, fresh, metric, pct, threshold * BEYOND_DOUBT))


def beyond_doubt(candidate: Measurement, baseline: Measurement, metric: str, pct: float | None,
                 threshold: float) -> str:
    """Why every repetition of `metric` so far (at least MIN_REPETITIONS) fails beyond doubt (BEYOND_DOUBT), in
    words; "" where they do not."""
    if candidate.repetitions < MIN_REPETITIONS or not repetitions_beyond(candidate, baseline, None, metric, pct,
                                                                          threshold * BEYOND_DOUBT):
        return ""
    return (f"{metric}{f' p{pct:g}' if pct and METRICS[metric][2] else ''}: each of {candidate.repetitions} "
            f"repetitions slower than the baseline by more than ×{threshold * BEYOND_DOUBT:.2f}: the limit ×"
            f"{threshold:g}, then ×{SPELL} for the host running slow through a whole run and ×"
            f"{interference.LOAD_FREE_RESIDUAL} for what a busy runner's correction can be off")


def as_measured(candidate: Side, baseline: Side) -> CostRatio:
    point, low, high = bootstrap_ratio_ci(candidate.costs, baseline.costs, least_disturbed)
    return CostRatio(point, low, high, least_disturbed(candidate.costs), least_disturbed(baseline.costs),
                      "as measured")


def machine_change(candidate: Side, baseline: Side) -> MachineChange | None:
    """The probe's level now against the baseline's, from the quiet probes where both sides have them (they do not
    compete with the workload), else from the probes during the repetitions."""
    probes = "quiet" if candidate.quiet and baseline.quiet else "during" if candidate.during and baseline.during \
        else ""
    if not probes:
        return None
    return _probes_moved(tuple(getattr(candidate, probes)), tuple(getattr(baseline, probes)))


@functools.lru_cache(maxsize=8)
def _probes_moved(now: tuple[float, ...], then: tuple[float, ...]) -> MachineChange:
    """The bootstrap of the probes' move, made once per pair of measurements: every metric compared repetition by
    repetition reads the same probes."""
    return MachineChange(*bootstrap_ratio_ci(now, then, least_disturbed))


def normalized(candidate: Side, baseline: Side) -> CostRatio | None:
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
            best = CostRatio(point, low, high, point * base_cost, base_cost, name)
    return best


def decide_stored(candidate: Side, baseline: Side, max_regression: float) -> StoredVerdict:
    """The verdict as measured, kept only where the machine's move (by the probe) cannot have made it: see the
    module's docstring. The calibration probe's normalized comparison is reported, never decisive. Where the two
    sides were quiet, or beside the same co-tenant, and the verdict was left undecided by the drift between
    processes, the engine thread's own speed probe decides a pass (perf.speed_pass.at_thread_speed); where the
    thread's speed moved, a decided verdict must hold at the save's speed too (perf.speed_pass.held_to_save_speed)."""
    threshold = 1.0 + max_regression
    measured = as_measured(candidate, baseline)
    status = as_measured_status = interval_status(measured.low, measured.high, threshold)
    change = machine_change(candidate, baseline)
    drift = within_drift(measured, status, threshold)
    if drift:  # no failure as measured, whatever the evidence below (the load-corrected figures decide apart)
        status = Status.INCONCLUSIVE
    if busy_share(candidate.others) is not None or busy_share(baseline.others) is not None:
        loaded = busy.busy_sides(candidate, baseline, measured, status, threshold, threshold * RUN_DRIFT)
        verdict = replace(loaded, machine=change, steady="")
        corrected = (candidate.load_free_costs() or [], baseline.load_free_costs() or [])
        if loaded.steady:
            return at_thread_speed(verdict, *corrected, candidate, baseline, threshold, steady_evidence=loaded.steady)
        costs = corrected if loaded.load_corrected else (candidate.costs, baseline.costs)
        return held_to_save_speed(verdict, *costs, candidate, baseline, threshold, threshold * RUN_DRIFT,
                                  evidence=loaded.disagreement)
    verdict = _quiet_sides(candidate, baseline, measured, status, change, drift, threshold)
    undecided = verdict.status == Status.INCONCLUSIVE and measured.low <= threshold * RUN_DRIFT \
        and as_measured_status != Status.PASS
    # The calibration probe blaming the save is not the last word where both sides' kernels saw no other process
    # run: the save's host then ran slow (no co-tenant's wait inflated its wall times), which the engine thread's
    # own probe follows and the calibration child on another CPU need not (docs/measurements.md, "the host's slow
    # spells"); with a co-tenant's wait, or no evidence, the thread's CPU-time probe cannot see it, and the blame
    # stands.
    seen_quiet = bool(candidate.others) and bool(baseline.others)
    if undecided and not verdict.baseline_at_fault or verdict.baseline_at_fault and seen_quiet:
        verdict = at_thread_speed(verdict, candidate.costs, baseline.costs, candidate, baseline, threshold)
    return held_to_save_speed(verdict, candidate.costs, baseline.costs, candidate, baseline, threshold,
                              threshold * RUN_DRIFT)


def _quiet_sides(candidate: Side, baseline: Side, measured: CostRatio, status: Status, change: MachineChange | None,
                 drift: str, threshold: float) -> StoredVerdict:
    """Neither side measured busy: the verdict as measured, the runs' drift and the calibration probe's move."""
    if drift:
        return StoredVerdict(status, measured, change, drift, within_drift=measured.ratio <= threshold * RUN_DRIFT,
                             fail_bar=threshold * RUN_DRIFT)
    if change is None:
        return StoredVerdict(status, measured, change, "")
    # the normalized comparison (two bootstraps) is made only where a verdict or its sentence reads it
    if change.low > threshold:  # slower now: a busy runner (or a slower host)
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
                             f"from the machine's{_normalized_aside(candidate, baseline, threshold)}",
                             fail_bar=threshold * change.high * RUN_DRIFT)
    if change.high < 1.0 / threshold:  # faster now: the baseline was saved on a busy runner
        if status == Status.FAIL:
            return StoredVerdict(status, measured, change, "")
        return StoredVerdict(Status.INCONCLUSIVE, measured, change,
                             f"the baseline was saved on a busy runner: the calibration probe ran "
                             f"×{1.0 / change.ratio:.2f} slower then than now, so what that load took from its "
                             f"figures may hide a slowdown in this run's ratio (×{measured.ratio:.3f})"
                             f"{_normalized_aside(candidate, baseline, threshold)}", baseline_at_fault=True)
    if status == Status.INCONCLUSIVE:
        return StoredVerdict(status, measured, change, "")
    adjusted = normalized(candidate, baseline)
    other = interval_status(adjusted.low, adjusted.high, threshold) if adjusted is not None else Status.INCONCLUSIVE
    if other not in (Status.INCONCLUSIVE, status):
        return StoredVerdict(Status.INCONCLUSIVE, measured, change,
                             f"as measured it would {status}, normalized {adjusted.normalization} for the machine's "
                             f"speed (probe ×{change.ratio:.3f}) it would {other} (×{adjusted.ratio:.3f})")
    return StoredVerdict(status, measured, change, "")


def within_drift(measured: CostRatio, status: Status, threshold: float) -> str:
    """Why a failure as measured is no failure against a stored baseline (its low end within threshold ×
    RUN_DRIFT), or "" where it stands or is no failure."""
    bound = threshold * RUN_DRIFT
    if status != Status.FAIL or measured.low > bound:
        return ""
    return (f"×{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}] slower than the baseline, but not "
            f"beyond ×{bound:.2f} (the threshold × {RUN_DRIFT}, the most an unchanged run drifted from a stored "
            "baseline on these machines): the two runs cannot tell it from the machine's own drift; compare in one "
            "process (infergate_bench.ab) or set a max_regression above the drift")


def _normalized_aside(candidate: Side, baseline: Side, threshold: float) -> str:
    adjusted = normalized(candidate, baseline)
    if adjusted is None:
        return ""
    status = interval_status(adjusted.low, adjusted.high, threshold)
    return (f" (normalized by the probe it would read ×{adjusted.ratio:.3f}, {status}, but the probe does not slow "
            "as the engine does)")


def compared_figure(measurement: Measurement, metric: str, pct: int | None = 50) -> float | None:
    """The figure a later comparison with `measurement` reads for `metric`: its least-disturbed repetitions' (each
    side's summary here), in the metric's unit; None where it has no split by repetition."""
    summarized = side(measurement, metric, pct, probed=False)
    return in_metric_units(metric, least_disturbed(summarized.costs)) if summarized else None


def in_metric_units(metric: str, cost: float) -> float:
    """A cost back in the metric's own unit (throughputs were inverted)."""
    return 1.0 / cost if METRICS[metric][1] and cost > 0 else cost


def compare_stored(metric: str, candidate: Measurement, baseline: Measurement, max_regression: float,
                   pct: int | None = 50) -> Verdict | None:
    """A time-like metric against a stored baseline, repetition by repetition (perf.stored: each side summarized
    by its least-disturbed repetitions; the calibration probe's move said, a pass the drift left undecided decided
    at the save's thread speed). None: not a time-like metric, or a side without the split by repetition."""
    if not scales_with_speed(metric):
        return None
    probed = bool(candidate.probe) and candidate.probe == baseline.probe
    same_thread_probe = bool(candidate.thread_probe) and candidate.thread_probe == baseline.thread_probe
    cand = side(candidate, metric, pct, probed, same_thread_probe)
    base = side(baseline, metric, pct, probed, same_thread_probe)
    if cand is None or base is None:
        return None
    decided = decide_stored(cand, base, max_regression)
    measured, machine = decided.measured, decided.machine
    verdict = Verdict(metric, decided.status, measured.ratio, measured.low, measured.high, 1.0 + max_regression,
                   pct if METRICS[metric][2] else None, in_metric_units(metric, measured.candidate_cost),
                   in_metric_units(metric, measured.baseline_cost), (len(cand.costs), len(base.costs)),
                   machine_slowdown=machine.ratio if machine else None, repetitions=True, note=decided.disagreement,
                   baseline_at_fault=decided.baseline_at_fault, load_corrected=decided.load_corrected,
                   load_free_by=cand.load_free_by if decided.load_corrected else "",
                   unresolvable=decided.within_drift, at_thread_speed=decided.at_thread_speed,
                   narrowable=decided.narrowable, fail_bar=decided.fail_bar,
                   fail_bar_load_corrected=decided.fail_bar_load_corrected)
    if verdict.status == Status.INCONCLUSIVE and not verdict.note and beyond_remeasure(verdict):
        verdict = replace(verdict, unresolvable=True, note=(
            f"this comparison's noise is {units.noise(verdict.resolution, places=0)} on this runner (the two sides' "
            f"own spread), and re-measuring cannot bring it below max_regression {max_regression:g}: compare in one "
            f"process (infergate_bench.ab, or --infergate-compare-model), or set max_regression >= "
            f"{verdict.resolution - 1:.2f}"))
    return verdict


# PerfGate re-measures a stored comparison at most STORED_MORE times, adding a block of repetitions each time: at
# most about 1 + STORED_MORE times the repetitions, which narrows a bootstrap interval's log-width by about its root
REMEASURE_NARROWING = math.sqrt(1 + STORED_MORE)


def beyond_remeasure(verdict: Verdict) -> bool:
    """Whether even the re-measured comparison would still straddle the threshold: its resolution, narrowed by
    REMEASURE_NARROWING in log space, stays above the threshold."""
    return math.log(verdict.resolution) / REMEASURE_NARROWING > math.log(verdict.threshold)
