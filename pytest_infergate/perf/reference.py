"""What a perf measurement is compared with: a strategy per route of perf.decide.Reference.

- NoReference: nothing to compare with (the absolute budgets decide alone);
- StoredReference: a baseline entry an earlier run saved (--infergate-baseline), or run A's record (`infergate
  compare`, the history's previous run); measured at another time, so the fingerprints say what changed since;
- Interleaved: the same workload in another Python environment (--infergate-baseline-python), another model,
  precision or engine config in this process (`infergate_bench.ab()`), or a second server
  (--infergate-reference-endpoint): both sides measured in rounds that alternate.

Each makes its verdicts through perf.decide and says whether measuring more could decide; none measures when it is
built (Interleaved.measure takes the first rounds)."""

from __future__ import annotations

from collections.abc import Callable

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import Budget
from pytest_infergate.perf.decide import (
    Comparison,
    Evidence,
    interleaved_comparison,
    no_comparison,
    stored_comparison,
    undecided_by_noise,
)
from pytest_infergate.perf.fingerprint import FingerprintDiff, diff_fingerprints
from pytest_infergate.perf.outcome import PerfOutcome, Route
from pytest_infergate.perf.stored import fresh_repetitions_confirm
from pytest_infergate.status import Status

__all__ = ["CONFIRM_REPETITIONS", "Interleaved", "NoReference", "RoundRunner", "Route", "StoredReference"]

RoundRunner = Callable[[Measurement, Measurement, int], None]  # one round into (A, B); the int: which round
# the fresh block after which a failure against a stored baseline is decided again (at most as many as the first)
CONFIRM_REPETITIONS = 8


class NoReference:
    """Budgets only. `baseline_given`: a baseline file was passed and has no entry for this measurement, so a
    relative check asked for did not run (a warning, a failure under strict)."""

    route = Route.BUDGET
    baseline = None

    def __init__(self, baseline_given: bool = False):
        self.missing = ("the baseline file has no entry for this measurement (record one with "
                        "--infergate-save-baseline)" if baseline_given else "")

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None:
        return None

    def compare(self, candidate: Measurement, budget: Budget, evidence: Evidence) -> Comparison:
        return no_comparison(self.missing)

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, evidence: Evidence) -> bool:
        return False

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        return 0


class StoredReference:
    """A stored baseline entry. `remeasure` adds a repetition (or a block) to the candidate; None: the candidate
    is a record and cannot grow (`infergate compare`, the history)."""

    route = Route.STORED

    def __init__(self, entry: BaselineEntry, remeasure: Callable[[], None] | None = None):
        self.entry, self.remeasure = entry, remeasure
        self.baseline = entry.measurement

    def changes(self, fingerprint: dict | None) -> FingerprintDiff:
        return diff_fingerprints(fingerprint or {}, self.entry.fingerprint or {})

    def compare(self, candidate: Measurement, budget: Budget, evidence: Evidence) -> Comparison:
        return stored_comparison(candidate, self.baseline, budget, evidence, self.entry.provenance())

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, evidence: Evidence) -> bool:
        """Once more while a verdict is undecided by noise alone; never on a runner the kernel saw busy, where
        more repetitions would take minutes to say the same (perf.interference)."""
        if self.remeasure is None or evidence.busy_share is not None or not undecided_by_noise(outcome,
                                                                                                evidence.diff):
            return False
        self.remeasure()
        return True

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        """A failure against a stored baseline is decided again after a fresh block of repetitions (returns how
        many). The least-disturbed repetitions' interval is narrow and takes the repetitions as independent, but
        interference on a shared machine comes in spells that can cover a whole run (docs/measurements.md: one
        unchanged run of 8 repetitions had even its fastest 27% slower than the baseline's). A real regression
        slows the fresh block as well and the failure stands; after a spell the fresh block decides. A failure far
        beyond what a spell can do ends the block early (stored.fresh_repetitions_confirm)."""
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


class Interleaved:
    """An interleaved A/B on `route`: `run_round` adds one repetition to A (the baseline side) and one to B (the
    candidate), step-locked or a repetition per side and turn. `measure(rounds)` takes the first rounds and returns
    B; `measure_more` one more round while a verdict is inconclusive."""

    def __init__(self, route: Route, run_round: RoundRunner):
        if not route.interleaved:
            raise ValueError(f"{route} is not an interleaved route")
        self.route, self.run_round = route, run_round
        self.baseline = Measurement(label="A")
        self.candidate = Measurement(label="B")
        self.rounds = 0

    def measure(self, rounds: int) -> Measurement:
        for _ in range(rounds):
            self._one_round()
        return self.candidate

    def _one_round(self) -> None:
        self.run_round(self.baseline, self.candidate, self.rounds)
        self.rounds += 1

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None:
        return None

    def compare(self, candidate: Measurement, budget: Budget, evidence: Evidence) -> Comparison:
        return interleaved_comparison(candidate, self.baseline, budget)

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, evidence: Evidence) -> bool:
        if not undecided_by_noise(outcome, None):
            return False
        self._one_round()
        return True

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        return 0  # the rounds pair up in time: a spell of load hits both sides of a round
