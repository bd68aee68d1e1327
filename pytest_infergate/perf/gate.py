"""The perf gate's decision for one measurement: absolute budgets, then the noise-aware comparison with a baseline
(a stored baseline entry, or side A of an interleaved A/B run). Both modes return one PerfOutcome.

`evaluate_perf` is the one decision against a stored baseline: the in-run gate, `infergate compare`, the report
(which shows the records the gate wrote) and the history (each run against the one before it) all go through it,
so they cannot disagree on the same data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf import calibration, interference
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import Budget, Violation, check_budget
from pytest_infergate.perf.fingerprint import FingerprintDiff, diff_fingerprints
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
    # the baseline's machine differs (timings not comparable: those verdicts are inconclusive), and what under
    # test changed since the baseline (compared, and named in every message)
    machine_mismatch: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    # a relative check was asked for (max_regression) but could not run; a warning, a failure under strict
    relative_check_missing: str = ""
    baseline: Measurement | None = None  # what the candidate was compared with (A of an A/B run)
    baseline_provenance: str = ""  # a stored baseline's repetitions, when and where it was recorded
    confirmed: int = 0  # repetitions of the fresh block a failure against a stored baseline was re-measured with

    @property
    def status(self) -> Status:
        checks = [v.status for v in self.violations] + [v.status for v in self.verdicts]
        if Status.FAIL in checks:
            return Status.FAIL
        if self.strict and self.relative_check_missing:
            return Status.FAIL
        if Status.INCONCLUSIVE in checks:
            return Status.FAIL if self.strict else Status.INCONCLUSIVE
        return Status.PASS

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL

    def message(self) -> str:
        lines = []
        if self.violations:
            undecided = sum(1 for v in self.violations if v.undecided)
            lines.append(f"{len(self.violations)} budget(s) exceeded"
                         + (f" ({undecided} inconclusive: the runner was busy)" if undecided else "") + ":")
            lines += ["  " + v.describe() for v in self.violations]
        bad = [v for v in self.verdicts if v.status != Status.PASS]
        if bad:
            lines.append("regression against the baseline"
                         + (f" ({self.baseline_provenance})" if self.baseline_provenance else "") + ":")
            # against a stored baseline, what changed since it was saved (an A/B run names its sides elsewhere)
            what = (", ".join(self.changes) if self.changes else "nothing under test changed") + ": " \
                if self.baseline_provenance else ""
            lines += [f"  {what}{v.headline()}" for v in bad]
            lines += ["    " + v.describe() for v in bad]
            if self.remeasured:
                lines.append(f"  (re-measured {self.remeasured} more time(s) before deciding)")
            if self.confirmed:
                lines.append(f"  (a failure was decided again after a fresh block of {self.confirmed} repetitions)")
            # undecided by the noise alone (a verdict with a note says its own reason: a busy runner, another machine)
            undecided = [v for v in bad if v.status == Status.INCONCLUSIVE and not v.note]
            if undecided:
                spread = max((v.high - v.low) / 2 / v.ratio for v in undecided)
                lines.append(f"  inconclusive: the 95% interval spans about ±{spread:.0%} of the ratio, wider than "
                             f"the threshold allows; on this machine at this many repetitions a max_regression "
                             f"below about {spread:.2f} cannot be confirmed either way — take more repetitions "
                             "(repeats=), gate with infergate_bench.ab() on a shared machine, or set a "
                             "max_regression the noise allows")
        if self.machine_mismatch:
            lines.append("the baseline was measured on another machine: " + ", ".join(self.machine_mismatch))
        if self.relative_check_missing and self.strict:
            lines.append(f"relative check not run (a failure under --infergate-strict): {self.relative_check_missing}")
        lines += self.notes
        return "\n".join(lines)


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  strict: bool = False, remeasure: Callable[[], None] | None = None, max_remeasure: int = 2,
                  baseline_given: bool = True) -> PerfOutcome:
    """Budgets, then the stored baseline's entry for this measurement (re-measuring while inconclusive).
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run.
    What under test changed since the baseline (model, libraries, engine config) is compared and named; a
    baseline from another machine makes the timing verdicts inconclusive, naming the difference."""
    outcome = PerfOutcome(violations=budget_violations(measurement, budget), strict=strict)
    if baseline_entry is None:
        if budget.max_regression is not None:
            outcome.relative_check_missing = (
                "the baseline file has no entry for this measurement (record one with --infergate-save-baseline)"
                if baseline_given else "no baseline was given (--infergate-baseline PATH)")
            outcome.notes.append(f"relative check skipped: {outcome.relative_check_missing}")
            if not baseline_given:  # budgets alone were asked for: nothing was silently skipped
                outcome.relative_check_missing = ""
        return outcome
    if budget.max_regression is None:
        return outcome
    diff = diff_fingerprints(fingerprint, baseline_entry.fingerprint)
    outcome.machine_mismatch = [change.describe() for change in diff.machine]
    outcome.changes = [change.describe() for change in diff.under_test]
    outcome.baseline = baseline = baseline_entry.measurement
    outcome.baseline_provenance = baseline_entry.provenance()

    def decide() -> list[Verdict]:
        return judged(compare_measurements(measurement, baseline, budget, stored_baseline=True), diff)

    outcome.verdicts = decide()
    # more repetitions on a runner the kernel saw busy would take minutes to say the same (perf.interference)
    busy_now = interference.busy(measurement.others_share) is not None
    while (remeasure is not None and outcome.remeasured < max_remeasure and not busy_now
           and any(v.status == Status.INCONCLUSIVE and not machine_bound(v, diff) for v in outcome.verdicts)):
        remeasure()
        outcome.remeasured += 1
        outcome.verdicts = decide()
    if remeasure is not None and any(v.status == Status.FAIL and v.repetitions for v in outcome.verdicts):
        confirm_failure(outcome, measurement, remeasure, decide)
    outcome.notes.append(calibration_note(measurement, baseline, outcome.verdicts))
    return outcome


def budget_violations(measurement: Measurement, budget: Budget) -> list[Violation]:
    """The budgets `measurement` breaks. A breach made by time while other processes kept the runner busy
    (perf.interference) is inconclusive with that reason, not a failure: the figure measured the machine's load
    as much as the code — unless it is worse than the load can explain. A breach of memory, counts or rates of
    success stands whatever the load."""
    violations = check_budget(measurement, budget)
    share = interference.busy(measurement.others_share)
    if share is None:
        return violations
    metric_of = {limit.key: limit.metric for limit in budget.limits}
    bound = interference.explainable_slowdown(share)
    out = []
    for v in violations:
        worse, better = (v.limit, v.measured) if v.higher_is_better else (v.measured, v.limit)
        times = worse / better if better > 0 else float("inf")  # how many times worse than the budget
        if calibration.normalizes(metric_of.get(v.key, "")) and times <= bound:
            v = replace(v, undecided=f"the runner was busy: {interference.describe(share)} during the measurement, "
                                     f"which alone can slow a time up to ×{bound:.1f}; rerun on a quiet runner")
        out.append(v)
    return out


def machine_bound(verdict: Verdict, diff: FingerprintDiff) -> bool:
    """Whether `verdict` compares figures that the baseline's other machine makes incomparable: timings, and
    every figure where the device changed. Re-measuring cannot decide such a verdict."""
    return bool(diff.machine) and (calibration.normalizes(verdict.metric) or diff.device_changed)


def judged(verdicts: list[Verdict], diff: FingerprintDiff) -> list[Verdict]:
    """The verdicts with what the fingerprints say applied: against another machine, timings (and, where the
    device changed, every figure) are inconclusive; with nothing under test changed, a candidate much faster than
    its baseline says the baseline was disturbed, not that anything improved."""
    out = []
    for v in verdicts:
        timing = calibration.normalizes(v.metric)
        if machine_bound(v, diff):
            v = replace(v, status=Status.INCONCLUSIVE,
                        note=f"the baseline was measured on another machine ({diff.machine_text()}), so its "
                             f"figures are no yardstick here; re-save the baseline on this runner")
        elif not diff.under_test and timing and v.status == Status.PASS and v.high < 1.0 / v.threshold:
            v = replace(v, status=Status.INCONCLUSIVE,
                        note=f"nothing under test changed, yet this run is ×{1.0 / v.ratio:.2f} as fast as the "
                             "baseline: the baseline was likely measured on a busy runner; re-save it on a quiet one")
        out.append(v)
    return out


def confirm_failure(outcome: PerfOutcome, measurement: Measurement, remeasure: Callable[[], None],
                    decide: Callable[[], list[Verdict]]) -> None:
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
    outcome.verdicts = decide()


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
    return "machine speed not checked: no calibration probe ran with this measurement"


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
