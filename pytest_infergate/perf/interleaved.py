"""The interleaved A/B route: A (the baseline side) and B (the candidate) measured in alternating rounds — another
environment, model, precision, config or server — so that their per-round ratios cancel the machine's drift. The
Interleaved reference is a strategy of perf.gate's Reference protocol; evaluate_ab gates B through PerfGate.check,
the one way into the decision."""

from __future__ import annotations

from collections.abc import Callable

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.fingerprint import FingerprintDiff
from pytest_infergate.perf.gate import PerfGate, interleaved_comparison, undecided_by_noise
from pytest_infergate.perf.outcome import Budget, PerfOutcome, Route
from pytest_infergate.stats import min_rounds

# An interleaved A/B's rounds: the fewest whose extremes bound the median per-round ratio at 95% (stats.min_rounds),
# and up to AB_MORE_ROUNDS more while inconclusive: at 9 rounds the interval leaves out the most extreme round on
# each side, which is what a spell of co-tenant load on one round needs.
AB_ROUNDS = min_rounds()
AB_MORE_ROUNDS = 3

RoundRunner = Callable[[Measurement, Measurement, int], None]  # one round into (A, B); the int: which round


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
