"""The perf gate: one decision (perf.decide) over a candidate and its reference (a strategy of perf.reference), and
while a verdict is undecided by noise alone, one more measurement through the reference and a fresh decision; a
failure the route needs confirmed is decided again after a fresh block. Every route goes through
`PerfGate.check`; the fixtures build the reference and call it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import Budget
from pytest_infergate.perf.decide import Evidence, Reference, budget_violations, decide
from pytest_infergate.perf.outcome import PerfOutcome, Route
from pytest_infergate.perf.reference import CONFIRM_REPETITIONS, Interleaved, NoReference, RoundRunner, StoredReference
from pytest_infergate.stats import min_rounds

__all__ = ["AB_MORE_ROUNDS", "AB_ROUNDS", "CONFIRM_REPETITIONS", "Interleaved", "NoReference", "PerfGate",
           "PerfOutcome", "Reference", "RoundRunner", "Route", "StoredReference", "budget_violations",
           "by_repetition", "evaluate_ab", "evaluate_perf"]

# An interleaved A/B's rounds: the fewest whose extremes bound the median per-round ratio at 95% (stats.min_rounds),
# and up to AB_MORE_ROUNDS more while inconclusive: at 9 rounds the interval leaves out the most extreme round on
# each side, which is what a spell of co-tenant load on one round needs.
AB_ROUNDS = min_rounds()
AB_MORE_ROUNDS = 3
# a stored baseline's candidate is re-measured at most this many times (a block of repetitions each) while undecided
STORED_MORE = 2


@dataclass
class PerfGate:
    """A budget and a reference. `fingerprint`: the candidate's machine and software (what changed since a stored
    baseline); `max_more`: how many times at most to measure more while undecided."""

    budget: Budget
    reference: Reference
    strict: bool = False
    fingerprint: dict | None = None
    max_more: int = STORED_MORE
    allow_model_change: bool = False  # --infergate-allow-model-change (perf.decide.decide)

    def check(self, candidate: Measurement) -> PerfOutcome:
        """`decide`, measuring more through the reference while it says that could decide (at most `max_more`
        times), then the reference's confirmation of a failure. What changed since the baseline is worked out once;
        the runner's load once per decision."""
        diff = self.reference.changes(self.fingerprint)
        evidence = Evidence.of(candidate, diff)
        outcome = decide(candidate, self.reference, self.budget, self.fingerprint, self.strict, evidence,
                             self.allow_model_change)
        if self.budget.max_regression is None:
            return outcome
        more = 0
        while more < self.max_more and self.reference.measure_more(candidate, outcome, evidence):
            more += 1
            evidence = Evidence.of(candidate, diff)
            outcome = decide(candidate, self.reference, self.budget, self.fingerprint, self.strict, evidence,
                             self.allow_model_change)
        confirmed = self.reference.confirm(candidate, outcome)
        if confirmed:
            outcome = decide(candidate, self.reference, self.budget, self.fingerprint, self.strict,
                             Evidence.of(candidate, diff), self.allow_model_change)
        outcome.remeasured, outcome.confirmed = more, confirmed
        return outcome


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  strict: bool = False, remeasure: Callable[[], None] | None = None,
                  baseline_given: bool = True, allow_model_change: bool = False) -> PerfOutcome:
    """The budget-only or stored gate of `measurement`: the stored baseline's entry for it, if any.
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run."""
    reference = (StoredReference(baseline_entry, remeasure) if baseline_entry is not None
                 else NoReference(baseline_given))
    return PerfGate(budget, reference, strict, fingerprint, allow_model_change=allow_model_change).check(measurement)


def by_repetition(run_a: Callable[[Measurement], None], run_b: Callable[[Measurement], None]) -> RoundRunner:
    """Rounds of one whole repetition per side, A then B (`run_x(measurement)` adds one repetition): for what
    cannot run step-locked (perf.lockstep)."""
    def run_round(a: Measurement, b: Measurement, index: int) -> None:
        run_a(a)
        run_b(b)
    return run_round


def evaluate_ab(run_round: RoundRunner, budget: Budget, rounds: int = AB_ROUNDS, strict: bool = False,
                route: Route = Route.IN_PROCESS) -> tuple[Measurement, PerfOutcome]:
    """An interleaved gate: `rounds` rounds, then one more at a time while a verdict is inconclusive, up to
    AB_MORE_ROUNDS; B's budgets checked and every metric compared round by round. Returns B's Measurement and the
    outcome, whose `baseline` is A's."""
    reference = Interleaved(route, run_round)
    candidate = reference.measure(rounds)
    return candidate, PerfGate(budget, reference, strict, max_more=AB_MORE_ROUNDS).check(candidate)
