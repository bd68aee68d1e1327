"""The perf gate and its one decision: a candidate measurement against its budget and its reference (a strategy of
the Reference protocol: NoReference, StoredReference, perf.interleaved.Interleaved) → a PerfOutcome. PerfGate.check
is the one way in — the in-run gate, `infergate compare` and the history go through it, so they cannot disagree on
the same data: it decides (decide_perf, pure), measures once more through the reference while noise alone leaves a
verdict undecided, and decides again after a fresh block where a failure needs confirming. Made before its
candidate is measured, so that after the measurement only the decision runs; verdicts are made here alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from pytest_infergate.measurement import MEMORY_METRICS, METRICS, Measurement, busy_share, scales_with_speed
from pytest_infergate.perf.fingerprint import FingerprintDiff, diff_fingerprints
from pytest_infergate.perf.outcome import Budget, PerfOutcome, Route, budget_violations
from pytest_infergate.perf.paired import compare_paired, compare_paired_percentiles, load_aware_paired
from pytest_infergate.perf.stored import RUN_DRIFT, STORED_MORE, beyond_doubt, compare_stored, fresh_repetitions_confirm
from pytest_infergate.perf.verdict import (
    Verdict,
    compare_memory,
    compare_samples,
    within_memory_resolution,
)
from pytest_infergate.status import Status

if TYPE_CHECKING:  # the entry's type only: reading a baseline file is not the decision's (it reads the clock)
    from pytest_infergate.perf.baseline import BaselineEntry

# the fresh block after which a failure against a stored baseline is decided again (at most as many as the first)
CONFIRM_REPETITIONS = 8


class Reference(Protocol):
    """What a candidate is compared with: a strategy per route (NoReference, StoredReference below;
    perf.interleaved.Interleaved). `compare` makes the verdicts (by the functions below) into the relative part of a
    PerfOutcome (its verdicts, notes, what changed, the baseline's provenance, why a relative check asked for is
    missing), given what changed since the reference (`diff`, from `changes`); `measure_more` measures once more
    where that could decide (False: it could not, or nothing more can be measured); `confirm` re-measures a failure
    where the route needs it (returns how many repetitions); `beyond_doubt` says why a failure needs neither
    (perf.stored.BEYOND_DOUBT), "" where none does."""

    route: Route
    baseline: Measurement | None

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None: ...

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome: ...

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool: ...

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int: ...

    def beyond_doubt(self, candidate: Measurement, outcome: PerfOutcome) -> str: ...


class NoReference:
    """Budgets only. `baseline_given`: a baseline file was passed and has no entry for this measurement, so a
    relative check asked for did not run (a check not run as asked)."""

    route = Route.BUDGET
    baseline = None

    def __init__(self, baseline_given: bool = False):
        self.missing = "the baseline file has no entry for this measurement" if baseline_given else ""

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None:
        return None

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome:
        """The relative check skipped, said in a note (`missing`: why, where one was asked for)."""
        return PerfOutcome(relative_check_missing=self.missing, notes=["relative check skipped: " + (
            self.missing or "no baseline was given (--infergate-baseline PATH)")],
            relative_check_fix="record one with --infergate-save-baseline" if self.missing else "")

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool:
        return False

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        return 0

    def beyond_doubt(self, candidate: Measurement, outcome: PerfOutcome) -> str:
        return ""


class StoredReference:
    """A stored baseline entry. `remeasure` adds a repetition (or a block) to the candidate; None: the candidate
    is a record and cannot grow (`infergate compare`, the history)."""

    route = Route.STORED

    def __init__(self, entry: BaselineEntry, remeasure: Callable[[], None] | None = None):
        self.entry, self.remeasure = entry, remeasure
        self.baseline = entry.measurement
        self.provenance = entry.provenance()  # said in every verdict: made once, before the candidate is measured

    def changes(self, fingerprint: dict | None) -> FingerprintDiff:
        return diff_fingerprints(fingerprint or {}, self.entry.fingerprint or {})

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome:
        return stored_comparison(candidate, self.baseline, budget, diff, self.provenance)

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool:
        """Once more while a verdict is undecided by noise alone; on a runner the kernel saw busy only where a pass
        straddles the bar at the save's thread speed (more of this run narrows that whatever the load), since
        elsewhere more repetitions would take minutes to say the same (perf.interference)."""
        busy = busy_share(candidate.others_share) is not None
        narrowable = any(v.narrowable and v.status == Status.INCONCLUSIVE for v in outcome.verdicts)
        if self.remeasure is None or (busy and not narrowable) or not undecided_by_noise(outcome, diff):
            return False
        self.remeasure()
        return True

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        """A failure against a stored baseline is decided again after a fresh block of repetitions (returns how
        many). The least-disturbed repetitions' interval is narrow and takes the repetitions as independent, but
        interference on a shared machine comes in spells that can cover a whole run, its fastest repetitions
        included (docs/measurements.md). A real regression
        slows the fresh block as well and the failure stands; after a spell the fresh block decides. A failure far
        beyond what a spell can do ends the block early, one beyond doubt earlier still
        (stored.fresh_repetitions_confirm)."""
        failing = [v for v in outcome.verdicts if v.status == Status.FAIL and v.repetitions]
        if self.remeasure is None or not failing:
            return 0
        first = candidate.repetitions
        while candidate.repetitions - first < min(first, CONFIRM_REPETITIONS):
            before = candidate.repetitions
            self.remeasure()
            if candidate.repetitions == before:  # the callback added nothing: nothing fresh to decide with
                break
            if any(fresh_repetitions_confirm(candidate, self.baseline, candidate.repetitions - first, v.metric,
                                             v.percentile, v.threshold) for v in failing):
                break
        return candidate.repetitions - first

    def beyond_doubt(self, candidate: Measurement, outcome: PerfOutcome) -> str:
        """Why a failing comparison of `outcome` fails beyond doubt on every repetition so far (stored.beyond_doubt);
        "" where none does."""
        return next((why for v in outcome.verdicts if v.status == Status.FAIL and v.repetitions
                     if (why := beyond_doubt(candidate, self.baseline, v.metric, v.percentile, v.threshold))), "")


@dataclass
class PerfGate:
    """A budget and a reference. `fingerprint`: the candidate's machine and software (what changed since a stored
    baseline); `max_more`: how many times at most to measure more while undecided."""

    budget: Budget
    reference: Reference
    fingerprint: dict | None = None
    max_more: int = STORED_MORE
    other_model: bool = True  # a baseline of another model is compared (decide_perf; gates.gating.prepare_gate)
    diff: FingerprintDiff | None = field(init=False)  # what changed since the reference: known before measuring

    def __post_init__(self) -> None:
        self.diff = self.reference.changes(self.fingerprint)

    def check(self, candidate: Measurement) -> PerfOutcome:
        """`decide_perf`, measuring more through the reference while it says that could decide (at most `max_more`
        times), then the reference's confirmation of a failure. What changed since the reference (`diff`) is known
        before the candidate is measured; the runner's load is read from the candidate as it stands."""
        diff = self.diff
        outcome = decide_perf(candidate, self.reference, self.budget, self.fingerprint, diff, self.other_model)
        if self.budget.max_regression is None:
            return outcome
        more = 0
        # a failure beyond doubt decides the record: more repetitions for its other figures cannot change that
        while more < self.max_more and not self.reference.beyond_doubt(candidate, outcome) \
                and self.reference.measure_more(candidate, outcome, diff):
            more += 1
            outcome = decide_perf(candidate, self.reference, self.budget, self.fingerprint, diff, self.other_model)
        confirmed = self.reference.confirm(candidate, outcome)
        if confirmed:
            outcome = decide_perf(candidate, self.reference, self.budget, self.fingerprint, diff, self.other_model)
        outcome.remeasured, outcome.confirmed = more, confirmed
        why = self.reference.beyond_doubt(candidate, outcome)
        if why:
            outcome.notes.append(f"a failure beyond doubt ({why}): its figures measured no further")
        return outcome

    def failed_beyond_doubt(self, candidate: Measurement) -> str:
        """Why the candidate as measured so far fails beyond doubt (the reference's beyond_doubt of the decision: the
        measuring loop stops then, below its plan's least too); "" where not. Decided only where a figure could."""
        baseline, budget = self.reference.baseline, self.budget
        if budget.max_regression is None or baseline is None or not any(
                beyond_doubt(candidate, baseline, metric, budget.percentile_of(metric), 1.0 + budget.max_regression)
                for metric in budget.relative_metrics() if scales_with_speed(metric)):
            return ""
        outcome = decide_perf(candidate, self.reference, budget, self.fingerprint, self.diff, self.other_model)
        return self.reference.beyond_doubt(candidate, outcome)


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
        outcome.relative_check_missing = (f"the baseline is of another model ({model_change}), compared under "
                                          "--infergate-strict only with --infergate-allow-model-change")
        outcome.relative_check_fix = ("pass --infergate-allow-model-change for a model upgrade on purpose, else save a "
                                      "baseline of this model")
        return outcome
    compared = reference.compare(candidate, budget, diff)
    outcome.verdicts, outcome.baseline = compared.verdicts, reference.baseline
    outcome.relative_check_missing, outcome.relative_check_fix = compared.relative_check_missing, \
        compared.relative_check_fix
    outcome.machine_mismatch, outcome.changes = compared.machine_mismatch, compared.changes
    outcome.baseline_provenance = compared.baseline_provenance
    outcome.notes += compared.notes
    return outcome


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
    missing = f"the baseline has no {', '.join(lacking)} samples (saved when no gate compared them)" if lacking else ""
    return PerfOutcome(verdicts=verdicts, notes=[calibration_note(candidate, baseline, verdicts)],
                       machine_mismatch=list(diff.machine_described), changes=list(diff.under_test_described),
                       baseline_provenance=provenance,
                       relative_check_missing=missing, relative_check_fix="re-save it with --infergate-save-baseline"
                       if lacking else "")


def undecided_by_noise(outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool:
    """Whether measuring more could decide: a verdict inconclusive by its interval (not by a stored baseline from
    another machine, `diff`, nor by one saved on a busy runner: no repetition of this run makes those comparable —
    unless its interval at the save's thread speed straddles the bar, which more of this run narrows; nor by a
    spread that more repetitions cannot narrow below the threshold: stored.beyond_remeasure)."""
    return any(v.status == Status.INCONCLUSIVE and (not v.baseline_at_fault or v.narrowable) and not v.unresolvable
               and not (diff is not None and machine_bound(v, diff)) for v in outcome.verdicts)


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
            v = replace(v, status=Status.INCONCLUSIVE, fail_bar=None, fail_bar_load_corrected=False,
                        note=f"the baseline was measured on another machine ({diff.machine_text}), so its "
                             f"figures are no yardstick here")
        elif not diff.under_test and timing and v.status == Status.PASS and v.high < 1.0 / (v.threshold * RUN_DRIFT):
            # faster than the runs' own drift allows, as a failure must be slower than it (perf.stored.RUN_DRIFT):
            # the host's speed moves between processes, and a pass within that drift is no sign of a bad baseline
            v = replace(v, status=Status.INCONCLUSIVE, baseline_at_fault=True,
                        note=f"nothing under test changed, yet this run is ×{1.0 / v.ratio:.2f} as fast as the "
                             f"baseline: the baseline was likely measured on a busy runner")
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
        # where the kernel's load evidence decided (perf.busy), the probe's rule did not: said, or "compared as
        # measured" sits beside "load-corrected" figures (a new user could not tell which comparison decided)
        how = ("the kernel saw the runner busy, so each figure says how it was compared (load-corrected where it "
               "says so), not by this probe" if any(v.load_corrected for v in verdicts) else
               "the machine is slower now by more than the threshold: a pass as measured stands, a failure only "
               "beyond what that move can explain"
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
    repetition, normalized for machine speed where needed (compare_stored); memory compares its samples (its
    limit never finer than MEMORY_RESOLUTION_MIB)."""
    if budget.max_regression is None:
        return []
    return [within_memory_resolution(_compare_metric(metric, candidate, baseline, budget, paired, stored_baseline))
            for metric in metrics or budget.relative_metrics()
            if candidate.samples.get(metric) and baseline.samples.get(metric) and metric != "load_s"]


def _compare_metric(metric: str, candidate: Measurement, baseline: Measurement, budget: Budget, paired: bool,
                    stored_baseline: bool) -> Verdict:
    """One metric's verdict by the route its measurements take (compare_measurements)."""
    a, b = candidate.samples[metric], baseline.samples[metric]
    if paired and not METRICS[metric][2] and len(a) == len(b) > 1:
        return load_aware_paired(compare_paired(metric, a, b, budget.max_regression), candidate, baseline,
                                 budget.max_regression)
    pct = budget.percentile_of(metric)
    by_round = compare_paired_percentiles(metric, candidate, baseline, budget.max_regression, pct) \
        if paired and METRICS[metric][2] else None
    if by_round is not None:
        return load_aware_paired(by_round, candidate, baseline, budget.max_regression)
    if stored_baseline and metric in MEMORY_METRICS:
        return compare_memory(metric, a, b, budget.max_regression)
    verdict = compare_stored(metric, candidate, baseline, budget.max_regression, pct) if stored_baseline else None
    return verdict or compare_samples(metric, a, b, budget.max_regression, pct)
