"""The perf gate's decision for one measurement: absolute budgets, then the noise-aware comparison with a baseline
(a stored baseline entry, or side A of an interleaved A/B run). Both modes return one PerfOutcome."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_infergate.perf.baseline import BaselineEntry, fingerprint_mismatches
from pytest_infergate.perf.budget import Budget, Violation, check_budget
from pytest_infergate.perf.metrics import Measurement
from pytest_infergate.perf.verdict import Verdict, compare_measurements
from pytest_infergate.status import Status

# the fresh block after which a failure against a stored baseline is decided again (at most as many as the first)
CONFIRM_REPETITIONS = 8


@dataclass
class PerfOutcome:
    violations: list[Violation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remeasured: int = 0
    strict: bool = False
    fingerprint_mismatch: list[str] = field(default_factory=list)
    # a relative check was asked for (max_regression) but could not run; a warning, a failure under strict
    relative_check_missing: str = ""
    baseline: Measurement | None = None  # what the candidate was compared with (A of an A/B run)
    confirmed: int = 0  # repetitions of the fresh block a failure against a stored baseline was re-measured with

    @property
    def status(self) -> Status:
        if self.violations or any(v.status == Status.FAIL for v in self.verdicts):
            return Status.FAIL
        if self.strict and (self.fingerprint_mismatch or self.relative_check_missing):
            return Status.FAIL
        if any(v.status == Status.INCONCLUSIVE for v in self.verdicts):
            return Status.FAIL if self.strict else Status.INCONCLUSIVE
        return Status.PASS

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL

    def message(self) -> str:
        lines = []
        if self.violations:
            lines.append(f"{len(self.violations)} budget(s) exceeded:")
            lines += ["  " + v.describe() for v in self.violations]
        bad = [v for v in self.verdicts if v.status != Status.PASS]
        if bad:
            lines.append("regression against the baseline:")
            lines += ["  " + v.describe() for v in bad]
            if self.remeasured:
                lines.append(f"  (re-measured {self.remeasured} more time(s) before deciding)")
            if self.confirmed:
                lines.append(f"  (a failure was decided again after a fresh block of {self.confirmed} repetitions)")
            undecided = [v for v in bad if v.status == Status.INCONCLUSIVE]
            if undecided:
                spread = max((v.high - v.low) / 2 / v.ratio for v in undecided)
                lines.append(f"  inconclusive: the 95% interval spans about ±{spread:.0%} of the ratio, wider than "
                             f"the threshold allows; on this machine at this many repetitions a max_regression "
                             f"below about {spread:.2f} cannot be confirmed either way — take more repetitions "
                             "(repeats=), gate with infergate_bench.ab() on a shared machine, or set a "
                             "max_regression the noise allows")
        if self.fingerprint_mismatch:
            lines.append("environment differs from the baseline's: " + "; ".join(self.fingerprint_mismatch))
        if self.relative_check_missing and self.strict:
            lines.append(f"relative check not run (a failure under --infergate-strict): {self.relative_check_missing}")
        lines += self.notes
        return "\n".join(lines)


def normalize_fingerprint(fingerprint: dict) -> dict:
    """Engine configs and nested values compare as canonical JSON strings."""
    return {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for k, v in fingerprint.items()}


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  strict: bool = False, remeasure: Callable[[], None] | None = None, max_remeasure: int = 2,
                  baseline_given: bool = True) -> PerfOutcome:
    """Budgets, then the stored baseline's entry for this measurement (re-measuring while inconclusive).
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run."""
    outcome = PerfOutcome(violations=check_budget(measurement, budget), strict=strict)
    if baseline_entry is None:
        if budget.max_regression is not None:
            outcome.relative_check_missing = (
                "the baseline file has no entry for this measurement (record one with --infergate-save-baseline)"
                if baseline_given else "no baseline was given (--infergate-baseline PATH)")
            outcome.notes.append(f"relative check skipped: {outcome.relative_check_missing}")
            if not baseline_given:  # budgets alone were asked for: nothing was silently skipped
                outcome.relative_check_missing = ""
        return outcome
    mismatch = fingerprint_mismatches(normalize_fingerprint(fingerprint),
                                      normalize_fingerprint(baseline_entry.fingerprint))
    if mismatch:
        outcome.fingerprint_mismatch = mismatch
        outcome.notes.append("relative check skipped: the baseline was measured in another environment")
        return outcome
    if budget.max_regression is None:
        return outcome
    outcome.baseline = baseline = baseline_entry.measurement
    outcome.verdicts = compare_measurements(measurement, baseline, budget, stored_baseline=True)
    while (remeasure is not None and outcome.remeasured < max_remeasure
           and any(v.status == Status.INCONCLUSIVE for v in outcome.verdicts)):
        remeasure()
        outcome.remeasured += 1
        outcome.verdicts = compare_measurements(measurement, baseline, budget, stored_baseline=True)
    if remeasure is not None and any(v.status == Status.FAIL and v.repetitions for v in outcome.verdicts):
        confirm_failure(outcome, measurement, baseline, budget, remeasure)
    outcome.notes.append(calibration_note(measurement, baseline, outcome.verdicts))
    return outcome


def confirm_failure(outcome: PerfOutcome, measurement: Measurement, baseline: Measurement, budget: Budget,
                    remeasure: Callable[[], None]) -> None:
    """A failure against a stored baseline is decided again after a fresh block of repetitions. The least-disturbed
    repetitions' interval is narrow and takes the repetitions as independent, but interference on a shared machine
    comes in spells that can cover a whole run: measured on a 2-vCPU VM, one unchanged run of 8 repetitions had
    even its fastest 27% slower than the baseline's, with a calibration probe that did not notice, and the next
    runs were back to normal. A real regression slows the fresh block as well and the failure stands; after a
    spell the fresh block's repetitions are the least disturbed and decide."""
    first = measurement.repetitions
    while measurement.repetitions - first < min(first, CONFIRM_REPETITIONS):
        before = measurement.repetitions
        remeasure()
        if measurement.repetitions == before:  # the callback added nothing: nothing fresh to decide with
            break
    outcome.confirmed = measurement.repetitions - first
    outcome.verdicts = compare_measurements(measurement, baseline, budget, stored_baseline=True)


def calibration_note(measurement: Measurement, baseline: Measurement, verdicts: list[Verdict]) -> str:
    """What the outcome says about the calibration probe and normalization for machine speed (perf.stored)."""
    probed = next((v for v in verdicts if v.machine_slowdown is not None), None)
    if probed is not None:
        which = "quiet probes before and after" if measurement.probe_quiet_s and baseline.probe_quiet_s \
            else "probes during"
        normalized = [v.metric for v in verdicts if v.normalization in ("by level", "per repetition")]
        how = (f"normalized for machine speed ({', '.join(normalized)}): the machine's speed changed by more than "
               "the threshold" if normalized else "not shown to have changed by more than the threshold, so "
               "compared as measured (the probe's own noise would only widen the intervals)")
        return (f"calibration probe ({measurement.probe}) x{probed.machine_slowdown:.3f} its time at the baseline "
                f"({which} each of {measurement.repetitions}/{baseline.repetitions} repetitions): {how}")
    if measurement.probe and not baseline.probe:
        return ("not normalized for machine speed: the baseline has no calibration probe (saved by an older "
                "pytest-infergate); re-save it with --infergate-save-baseline to gate robustly on a shared machine")
    if measurement.probe and baseline.probe != measurement.probe:
        return (f"not normalized for machine speed: the baseline's calibration probe is {baseline.probe!r}, this "
                f"one is {measurement.probe!r}; re-save the baseline with --infergate-save-baseline")
    if measurement.probe:
        return "not normalized for machine speed: no time-like metric was compared repetition by repetition"
    return "not normalized for machine speed: no calibration probe ran with this measurement"


RoundRunner = Callable[[Measurement, Measurement, int], None]  # one round into (A, B); the int: which round


def by_repetition(run_a: Callable[[Measurement], None], run_b: Callable[[Measurement], None]) -> RoundRunner:
    """Rounds of one whole repetition per side, A then B (`run_x(measurement)` adds one repetition): for what
    cannot run step-locked (perf.lockstep)."""
    def run_round(a: Measurement, b: Measurement, index: int) -> None:
        run_a(a)
        run_b(b)
    return run_round


def evaluate_ab(run_round: RoundRunner, budget: Budget, rounds: int, strict: bool = False,
                max_remeasure: int = 2) -> tuple[Measurement, PerfOutcome]:
    """Interleaved A/B gate: `rounds` rounds (each adds one repetition to A and one to B: step-locked, or
    `by_repetition`), then one more round at a time while a verdict is inconclusive, up to `max_remeasure`.
    Every metric is compared round by round. Returns B's Measurement and the outcome, whose `baseline` is A's."""
    a, b = Measurement(label="A"), Measurement(label="B")
    for index in range(rounds):
        run_round(a, b, index)
    outcome = PerfOutcome(strict=strict, baseline=a, verdicts=compare_measurements(b, a, budget, paired=True))
    while outcome.remeasured < max_remeasure and any(v.status == Status.INCONCLUSIVE for v in outcome.verdicts):
        run_round(a, b, rounds + outcome.remeasured)
        outcome.remeasured += 1
        outcome.verdicts = compare_measurements(b, a, budget, paired=True)
    return b, outcome
