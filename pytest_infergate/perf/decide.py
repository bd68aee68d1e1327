"""The one decision of a perf gate: a candidate measurement against its budget and its reference (a strategy of
perf.gate: none, stored, or an interleaved A/B) → a PerfOutcome. Pure: it measures nothing (perf.gate.PerfGate
measures more while it cannot decide). The in-run gate, `infergate compare` (history.series), the report (which
shows the records the gate wrote) and the history (each run against the one before it) all go through it, so they
cannot disagree on the same data (tests/test_one_decision.py). The strategies call back into the comparisons here,
so that verdicts are made in this module only."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from pytest_infergate import units
from pytest_infergate.measurement import MEMORY_METRICS, METRICS, Measurement, busy_share, scales_with_speed
from pytest_infergate.perf import interference
from pytest_infergate.perf.fingerprint import FingerprintDiff, diff_fingerprints
from pytest_infergate.perf.outcome import Budget, PerfOutcome, Route, Violation, check_budget
from pytest_infergate.perf.stored import RUN_DRIFT, compare_stored
from pytest_infergate.perf.verdict import (
    Verdict,
    compare_memory,
    compare_paired,
    compare_paired_percentiles,
    compare_samples,
    load_aware_paired,
)
from pytest_infergate.stats import percentile
from pytest_infergate.status import Status


class Reference(Protocol):
    """What a candidate is compared with (perf.gate holds the strategies). `compare` makes the verdicts (by
    the functions below) into the relative part of a PerfOutcome (its verdicts, notes, what changed, the baseline's
    provenance, why a relative check asked for is missing), given what changed since the reference (`diff`, from
    `changes`); `measure_more` measures once more where that could decide (False: it could not, or nothing more can
    be measured); `confirm` re-measures a failure where the route needs it (returns how many repetitions);
    `beyond_doubt` says why a failure needs neither (perf.stored.BEYOND_DOUBT), "" where none does."""

    route: Route
    baseline: Measurement | None

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None: ...

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome: ...

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool: ...

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int: ...

    def beyond_doubt(self, candidate: Measurement, outcome: PerfOutcome) -> str: ...


def decide_perf(candidate: Measurement, reference: Reference, budget: Budget, fingerprint: dict | None = None,
                diff: FingerprintDiff | None = None, other_model: bool = True) -> PerfOutcome:
    """Budgets on the candidate (a key it has no figure for is not checked: the gate warns about those), then, when
    the budget has a max_regression, the reference's comparison. `fingerprint`: the candidate's, for what changed
    since a stored baseline; `diff`: what changed, worked out by the caller (PerfGate does, once, before the
    candidate is measured), else here from `fingerprint`. A stored
    baseline of another model is compared and said (outcome.model_change) where `other_model` (under
    --infergate-strict only with --infergate-allow-model-change: gates.gating.prepare_gate): else the relative check
    is missing."""
    diff = diff if diff is not None else reference.changes(fingerprint)
    notes: list[str] = []
    outcome = PerfOutcome(violations=budget_violations(candidate, budget, notes), route=reference.route.value)
    outcome.notes += notes
    if budget.max_regression is None:
        return outcome
    model_change = diff.model_text if diff else ""
    outcome.model_change = model_change
    if model_change and not other_model:
        outcome.relative_check_missing = (
            f"the baseline is of another model ({model_change}): under --infergate-strict it is compared only with "
            "--infergate-allow-model-change (a model upgrade on purpose), else save a baseline of this model")
        return outcome
    compared = reference.compare(candidate, budget, diff)
    outcome.verdicts, outcome.baseline = compared.verdicts, reference.baseline
    outcome.relative_check_missing = compared.relative_check_missing
    outcome.machine_mismatch, outcome.changes = compared.machine_mismatch, compared.changes
    outcome.baseline_provenance = compared.baseline_provenance
    outcome.notes += compared.notes
    return outcome


def no_comparison(missing: str) -> PerfOutcome:
    """No reference: the relative check is skipped, said in a note (`missing`: why, where one was asked for)."""
    return PerfOutcome(relative_check_missing=missing, notes=["relative check skipped: " + (
        missing or "no baseline was given (--infergate-baseline PATH)")])


def interleaved_comparison(candidate: Measurement, baseline: Measurement, budget: Budget) -> PerfOutcome:
    """An interleaved A/B: every metric compared round by round."""
    return PerfOutcome(verdicts=compare_measurements(candidate, baseline, budget, paired=True))


def stored_comparison(candidate: Measurement, baseline: Measurement, budget: Budget, diff: FingerprintDiff | None,
                      provenance: str) -> PerfOutcome:
    """A stored baseline: compared repetition by repetition, with what under test changed since it named and a
    baseline from another machine making timings inconclusive (`diff`)."""
    diff = diff or diff_fingerprints({}, {})
    verdicts = judged(compare_measurements(candidate, baseline, budget, stored_baseline=True), diff)
    # a metric the candidate has and the baseline lacks: a baseline saved when no gate compared it (its per-token
    # samples are dropped then: perf.baseline.for_baseline), or of an older version; said, never skipped in silence
    lacking = [metric for metric in budget.relative_metrics() if metric != "load_s"
               and candidate.samples.get(metric) and not baseline.samples.get(metric)]
    missing = (f"the baseline has no {', '.join(lacking)} samples (saved when no gate compared them): re-save it with "
               "--infergate-save-baseline" if lacking else "")
    return PerfOutcome(verdicts=verdicts, notes=[calibration_note(candidate, baseline, verdicts)],
                       machine_mismatch=list(diff.machine_described), changes=list(diff.under_test_described),
                       baseline_provenance=provenance,
                       relative_check_missing=missing)


def undecided_by_noise(outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool:
    """Whether measuring more could decide: a verdict inconclusive by its interval (not by a stored baseline from
    another machine, `diff`, nor by one saved on a busy runner: no repetition of this run makes those comparable —
    unless its interval at the save's thread speed straddles the bar, which more of this run narrows; nor by a
    spread that more repetitions cannot narrow below the threshold: stored.beyond_remeasure)."""
    return any(v.status == Status.INCONCLUSIVE and (not v.baseline_at_fault or v.narrowable) and not v.unresolvable
               and not (diff is not None and machine_bound(v, diff)) for v in outcome.verdicts)


def budget_violations(measurement: Measurement, budget: Budget, notes: list[str] | None = None) -> list[Violation]:
    """The budgets `measurement` breaks (keys it has no figure for are not checked). A breach made by time while
    other processes kept the runner busy (perf.interference) is inconclusive with that reason, not a failure: the
    figure measured the machine's load as much as the code — unless it is worse than the load can explain, or the
    figure load-corrected (load_free_value: by the kernel's run-queue delays, or the device's time) meets the
    budget with room for the correction's error (interference.load_free_residual): then the breach is cleared,
    said in `notes`. The correction never makes a failure (an open-loop workload's queue grows faster than its
    service slows, which a per-repetition share does not take out). A breach of memory, counts or rates of success
    stands whatever the load (how busy: the others' share on the measurement's median repetition,
    measurement.busy_share)."""
    measured = replace(budget, limits=tuple(limit for limit in budget.limits
                                            if measurement.samples.get(limit.metric)))
    violations = check_budget(measurement, measured)
    share = busy_share(measurement.others_share)
    if share is None:
        return violations
    metric_of = {limit.key: limit.metric for limit in budget.limits}
    bound = interference.explainable_slowdown(share)
    residual = interference.load_free_residual(measurement)
    corrected_by = interference.load_corrected(measurement.load_free_source())
    out = []
    for v in violations:
        metric = metric_of.get(v.key, "")
        if not scales_with_speed(metric) or _times_worse(v.measured, v) > bound:
            out.append(v)
            continue
        corrected = load_free_value(measurement, metric, v.percentile)
        if corrected is not None and _times_worse(corrected, v) <= 1.0 / residual:
            if notes is not None:
                shown = units.metric_value(metric, corrected)
                notes.append(f"{v.key}: {units.metric_value(metric, v.measured)} as measured breaks the budget "
                             f"{units.metric_value(metric, v.limit)} on a busy runner "
                             f"({interference.describe(share)}); {corrected_by} it is {shown}, within the "
                             f"budget by more than the correction can be off (×{residual}): met")
            continue
        aside = (f"; {corrected_by} it is {units.metric_value(metric, corrected)}, too close to the budget "
                 f"to tell" if corrected is not None else "")
        out.append(replace(v, undecided=f"the runner was busy: {interference.describe(share)} during the "
                                        f"measurement, which alone can slow a time up to ×{bound:.1f}{aside}; "
                                        f"{interference.RERUN}"))
    return out


def _times_worse(value: float, violation: Violation) -> float:
    """How many times worse than its budget `value` is (below 1: within it)."""
    worse, better = (violation.limit, value) if violation.higher_is_better else (value, violation.limit)
    return worse / better if better > 0 else float("inf")


def load_free_value(measurement: Measurement, metric: str, pct: float | None = 50) -> float | None:
    """`metric` with the co-tenants' load taken out: a per-request latency's percentile `pct` over each request's
    own load-free figure (Measurement.load_free_samples), a repetition's figure scaled by its load-free share
    (Measurement.load_free_share), throughputs divided by it; None for a per-request percentile not measured per
    request (the share is the repetition's, not each request's), where the shares were not measured for every
    repetition or the samples are not split by repetition."""
    if METRICS[metric][2] and measurement.load_free_by_repetition(metric):
        return percentile(measurement.load_free_samples[metric], pct or 50)
    shares, reps = measurement.load_free_share, measurement.by_repetition(metric)
    if METRICS[metric][2] or not reps or len(shares) != len(reps) or min(shares) <= 0:
        return None  # a per-request percentile: the repetition's share is not each request's (perf.stored.side)
    higher_is_better = METRICS[metric][1]
    scaled = [value / share if higher_is_better else value * share for values, share in zip(reps, shares)
              for value in values]
    return percentile(scaled, 50)


def machine_bound(verdict: Verdict, diff: FingerprintDiff) -> bool:
    """Whether `verdict` compares figures that the baseline's other machine makes incomparable: timings, and
    every figure where the device changed. Re-measuring cannot decide such a verdict."""
    return bool(diff.machine) and (scales_with_speed(verdict.metric) or diff.device_changed)


def judged(verdicts: list[Verdict], diff: FingerprintDiff) -> list[Verdict]:
    """The verdicts with what the fingerprints say applied: against another machine, timings (and, where the
    device changed, every figure) are inconclusive; with nothing under test changed, a candidate much faster than
    its baseline says the baseline was disturbed, not that anything improved."""
    out = []
    for v in verdicts:
        timing = scales_with_speed(v.metric)
        if machine_bound(v, diff):
            v = replace(v, status=Status.INCONCLUSIVE,
                        note=f"the baseline was measured on another machine ({diff.machine_text}), so its "
                             f"figures are no yardstick here; re-save the baseline on this runner")
        elif not diff.under_test and timing and v.status == Status.PASS and v.high < 1.0 / (v.threshold * RUN_DRIFT):
            # faster than the runs' own drift allows, as a failure must be slower than it (perf.stored.RUN_DRIFT):
            # the host's speed moves between processes, and a pass within that drift is no sign of a bad baseline
            v = replace(v, status=Status.INCONCLUSIVE, baseline_at_fault=True,
                        note=f"nothing under test changed, yet this run is ×{1.0 / v.ratio:.2f} as fast as the "
                             f"baseline: the baseline was likely measured on a busy runner; {interference.RESAVE}")
        out.append(v)
    return out


def calibration_note(measurement: Measurement, baseline: Measurement, verdicts: list[Verdict]) -> str:
    """What the outcome says about the calibration probe (perf.stored: it tells which way the machine moved,
    never scales a figure)."""
    probed = next((v for v in verdicts if v.machine_slowdown is not None), None)
    if probed is not None:
        which = "quiet probes before and after" if measurement.probe_quiet_s and baseline.probe_quiet_s \
            else "probes during"
        moved = probed.machine_slowdown
        threshold = probed.threshold
        how = ("the machine is slower now by more than the threshold: only a pass as measured stands"
               if moved > threshold else
               "the machine is faster now by more than the threshold: only a failure as measured stands"
               if moved < 1.0 / threshold else "within the threshold: compared as measured")
        return (f"calibration probe ({measurement.probe}) ×{moved:.3f} its time at the baseline "
                f"({which} each of {measurement.repetitions}/{baseline.repetitions} repetitions): {how}")
    if measurement.probe and not baseline.probe:
        return ("machine speed not checked: the baseline has no calibration probe (saved by an older "
                "pytest-infergate); re-save it with --infergate-save-baseline to gate robustly on a shared machine")
    if measurement.probe and baseline.probe != measurement.probe:
        return (f"machine speed not checked: the baseline's calibration probe is {baseline.probe!r}, this "
                f"one is {measurement.probe!r}; re-save the baseline with --infergate-save-baseline")
    if measurement.probe:
        return "machine speed not checked: no time-like metric was compared repetition by repetition"
    if not baseline.probe:
        return ("machine speed not checked: neither side took the calibration probe (the baseline, an older file or "
                "a run's results, has none, so this run measured without it too; on the CPU, a baseline saved with "
                "--infergate-save-baseline has it)")
    return "machine speed not checked: no calibration probe ran with this measurement"


def compare_measurements(candidate: Measurement, baseline: Measurement, budget: Budget,
                         metrics: list[str] | None = None, paired: bool = False,
                         stored_baseline: bool = False) -> list[Verdict]:
    """Verdicts for every metric the budget names (or `metrics`), present in both measurements. `paired`:
    the two were measured in interleaved rounds, so per-repetition metrics compare round by round.
    `stored_baseline`: the baseline was measured at another time; time-like metrics compare repetition by
    repetition, normalized for machine speed where needed (compare_stored); memory compares its samples."""
    if budget.max_regression is None:
        return []
    names = metrics or budget.relative_metrics()
    verdicts = []
    for metric in names:
        a, b = candidate.samples.get(metric), baseline.samples.get(metric)
        if not a or not b or metric in ("load_s",):
            continue
        if paired and not METRICS[metric][2] and len(a) == len(b) > 1:
            verdicts.append(load_aware_paired(compare_paired(metric, a, b, budget.max_regression), candidate,
                                              baseline, budget.max_regression))
            continue
        pct = budget.percentile_of(metric)
        by_round = compare_paired_percentiles(metric, candidate, baseline, budget.max_regression, pct) \
            if paired and METRICS[metric][2] else None
        if by_round is not None:
            verdicts.append(load_aware_paired(by_round, candidate, baseline, budget.max_regression))
            continue
        if stored_baseline and metric in MEMORY_METRICS:
            verdicts.append(compare_memory(metric, a, b, budget.max_regression))
            continue
        verdict = compare_stored(metric, candidate, baseline, budget.max_regression, pct) if stored_baseline else None
        verdicts.append(verdict or compare_samples(metric, a, b, budget.max_regression, pct))
    return verdicts
