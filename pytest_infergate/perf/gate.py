"""The perf gate: a candidate measurement and its reference, one decision (perf.decide), and while a verdict is
undecided by noise alone one more measurement through the reference; a failure the route needs confirmed is decided
again after a fresh block. Each reference is a strategy (the perf.decide.Reference protocol): NoReference (budgets
alone), StoredReference (a baseline an earlier run saved, or an accepted run's record: the fingerprints say what
changed since) and Interleaved (A and B measured in alternating rounds: another environment, model, precision,
config or server). A gate is made before its candidate is measured (what changed is known then), so after the
measurement only the decision runs; no reference measures when it is built (Interleaved.measure takes the rounds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_infergate.measurement import Measurement, busy_share, scales_with_speed
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.decide import (
    Reference,
    budget_violations,
    decide_perf,
    interleaved_comparison,
    no_comparison,
    stored_comparison,
    undecided_by_noise,
)
from pytest_infergate.perf.fingerprint import FingerprintDiff, diff_fingerprints
from pytest_infergate.perf.outcome import Budget, PerfOutcome, Route
from pytest_infergate.perf.stored import STORED_MORE, beyond_doubt, fresh_repetitions_confirm
from pytest_infergate.stats import min_rounds
from pytest_infergate.status import Status

__all__ = ["AB_MORE_ROUNDS", "AB_ROUNDS", "CONFIRM_REPETITIONS", "Interleaved", "NoReference", "PerfGate",
           "PerfOutcome", "Reference", "RoundRunner", "Route", "StoredReference", "budget_violations",
           "by_repetition", "evaluate_ab", "evaluate_perf"]

# An interleaved A/B's rounds: the fewest whose extremes bound the median per-round ratio at 95% (stats.min_rounds),
# and up to AB_MORE_ROUNDS more while inconclusive: at 9 rounds the interval leaves out the most extreme round on
# each side, which is what a spell of co-tenant load on one round needs.
AB_ROUNDS = min_rounds()
AB_MORE_ROUNDS = 3

RoundRunner = Callable[[Measurement, Measurement, int], None]  # one round into (A, B); the int: which round
# the fresh block after which a failure against a stored baseline is decided again (at most as many as the first)
CONFIRM_REPETITIONS = 8


class NoReference:
    """Budgets only. `baseline_given`: a baseline file was passed and has no entry for this measurement, so a
    relative check asked for did not run (a check not run as asked)."""

    route = Route.BUDGET
    baseline = None

    def __init__(self, baseline_given: bool = False):
        self.missing = ("the baseline file has no entry for this measurement (record one with "
                        "--infergate-save-baseline)" if baseline_given else "")

    def changes(self, fingerprint: dict | None) -> FingerprintDiff | None:
        return None

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome:
        return no_comparison(self.missing)

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

    def compare(self, candidate: Measurement, budget: Budget, diff: FingerprintDiff | None) -> PerfOutcome:
        return interleaved_comparison(candidate, self.baseline, budget)

    def measure_more(self, candidate: Measurement, outcome: PerfOutcome, diff: FingerprintDiff | None) -> bool:
        if not undecided_by_noise(outcome, None):
            return False
        self._one_round()
        return True

    def confirm(self, candidate: Measurement, outcome: PerfOutcome) -> int:
        return 0  # the rounds pair up in time: a spell of load hits both sides of a round

    def beyond_doubt(self, candidate: Measurement, outcome: PerfOutcome) -> str:
        return ""  # its rounds are taken before the decision (measure), not cut short


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
        """Why the candidate, as measured so far, already fails beyond doubt against its reference (the reference's
        beyond_doubt of the decision); "" where it does not. The measuring loop stops adding repetitions then, below
        its plan's least too (gates.perf). The repetitions are looked at first, so the decision is made only where
        a figure could fail so."""
        baseline, budget = self.reference.baseline, self.budget
        if budget.max_regression is None or baseline is None or not any(
                beyond_doubt(candidate, baseline, metric, budget.percentile_of(metric), 1.0 + budget.max_regression)
                for metric in budget.relative_metrics() if scales_with_speed(metric)):
            return ""
        outcome = decide_perf(candidate, self.reference, budget, self.fingerprint, self.diff, self.other_model)
        return self.reference.beyond_doubt(candidate, outcome)


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  remeasure: Callable[[], None] | None = None, baseline_given: bool = True,
                  other_model: bool = True) -> PerfOutcome:
    """The budget-only or stored gate of `measurement`: the stored baseline's entry for it, if any.
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run."""
    reference = (StoredReference(baseline_entry, remeasure) if baseline_entry is not None
                 else NoReference(baseline_given))
    return PerfGate(budget, reference, fingerprint, other_model=other_model).check(measurement)


def by_repetition(run_a: Callable[[Measurement], None], run_b: Callable[[Measurement], None]) -> RoundRunner:
    """Rounds of one whole repetition per side, A then B (`run_x(measurement)` adds one repetition): for what
    cannot run step-locked (perf.lockstep)."""
    def run_round(a: Measurement, b: Measurement, index: int) -> None:
        run_a(a)
        run_b(b)
    return run_round


def evaluate_ab(run_round: RoundRunner, budget: Budget, rounds: int = AB_ROUNDS,
                route: Route = Route.IN_PROCESS) -> tuple[Measurement, PerfOutcome]:
    """An interleaved gate: `rounds` rounds, then one more at a time while a verdict is inconclusive, up to
    AB_MORE_ROUNDS; B's budgets checked and every metric compared round by round. Returns B's Measurement and the
    outcome, whose `baseline` is A's."""
    reference = Interleaved(route, run_round)
    candidate = reference.measure(rounds)
    return candidate, PerfGate(budget, reference, max_more=AB_MORE_ROUNDS).check(candidate)
