"""The perf gate's loop: decide (perf.decide), and while a verdict is undecided by noise alone, measure once more
through the reference (an interleaved round, or a fresh repetition of the candidate against a stored baseline)
and decide again; a failure against a stored baseline is decided again after a fresh block. Every route of
perf.reference goes through `run_gate`; `evaluate_perf` and `evaluate_ab` build the reference for the usual
calls."""

from __future__ import annotations

from collections.abc import Callable

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf import interference
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import Budget
from pytest_infergate.perf.decide import budget_violations, decide, undecided_by_noise
from pytest_infergate.perf.fingerprint import diff_fingerprints
from pytest_infergate.perf.outcome import PerfOutcome
from pytest_infergate.perf.reference import Reference, RoundRunner, Route
from pytest_infergate.stats import min_rounds
from pytest_infergate.status import Status

__all__ = ["AB_MORE_ROUNDS", "AB_ROUNDS", "CONFIRM_REPETITIONS", "PerfOutcome", "Reference", "RoundRunner", "Route",
           "budget_violations", "by_repetition", "evaluate_ab", "evaluate_perf", "run_gate"]

# the fresh block after which a failure against a stored baseline is decided again (at most as many as the first)
CONFIRM_REPETITIONS = 8
# An interleaved A/B's rounds: the fewest whose extremes bound the median per-round ratio at 95% (stats.min_rounds),
# and up to AB_MORE_ROUNDS more while inconclusive: at 9 rounds the interval leaves out the most extreme round on
# each side, which is what a spell of co-tenant load on one round needs.
AB_ROUNDS = min_rounds()
AB_MORE_ROUNDS = 3


def run_gate(candidate: Measurement, reference: Reference, budget: Budget, fingerprint: dict | None = None,
             strict: bool = False, max_remeasure: int = 2) -> PerfOutcome:
    """`decide`, measuring more through `reference.more` while a verdict is undecided by noise alone (at most
    `max_remeasure` times; never on a runner the kernel saw busy, where more repetitions would take minutes to
    say the same: perf.interference), then a stored baseline's failure confirmed on a fresh block."""
    outcome = decide(candidate, reference, budget, fingerprint, strict)
    more = reference.more
    if more is None or reference.measurement is None or budget.max_regression is None:
        return outcome
    stored = reference.route == Route.STORED
    busy_now = stored and interference.busy(candidate.others_share) is not None
    diff = diff_fingerprints(fingerprint or {}, reference.fingerprint or {}) if stored else None
    remeasured = 0
    while remeasured < max_remeasure and not busy_now and undecided_by_noise(outcome, diff):
        more()
        remeasured += 1
        outcome = decide(candidate, reference, budget, fingerprint, strict)
    confirmed = 0
    if stored and any(v.status == Status.FAIL and v.repetitions for v in outcome.verdicts):
        confirmed = confirm_failure(candidate, more)
        outcome = decide(candidate, reference, budget, fingerprint, strict)
    outcome.remeasured, outcome.confirmed = remeasured, confirmed
    return outcome


def confirm_failure(candidate: Measurement, remeasure: Callable[[], None]) -> int:
    """A failure against a stored baseline is decided again after a fresh block of repetitions (returns how many).
    The least-disturbed repetitions' interval is narrow and takes the repetitions as independent, but interference
    on a shared machine comes in spells that can cover a whole run: measured on a 2-vCPU VM, one unchanged run of 8
    repetitions had even its fastest 27% slower than the baseline's, with a calibration probe that did not notice,
    and the next runs were back to normal. A real regression slows the fresh block as well and the failure stands;
    after a spell the fresh block's repetitions are the least disturbed and decide."""
    first = candidate.repetitions
    while candidate.repetitions - first < min(first, CONFIRM_REPETITIONS):
        before = candidate.repetitions
        remeasure()
        if candidate.repetitions == before:  # the callback added nothing: nothing fresh to decide with
            break
    return candidate.repetitions - first


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  strict: bool = False, remeasure: Callable[[], None] | None = None, max_remeasure: int = 2,
                  baseline_given: bool = True) -> PerfOutcome:
    """Budgets, then the stored baseline's entry for this measurement (the budget-only or stored route).
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run."""
    reference = (Reference.stored(baseline_entry, remeasure) if baseline_entry is not None
                 else Reference.nothing(baseline_given))
    return run_gate(measurement, reference, budget, fingerprint, strict, max_remeasure)


def by_repetition(run_a: Callable[[Measurement], None], run_b: Callable[[Measurement], None]) -> RoundRunner:
    """Rounds of one whole repetition per side, A then B (`run_x(measurement)` adds one repetition): for what
    cannot run step-locked (perf.lockstep)."""
    def run_round(a: Measurement, b: Measurement, index: int) -> None:
        run_a(a)
        run_b(b)
    return run_round


def evaluate_ab(run_round: RoundRunner, budget: Budget, rounds: int = AB_ROUNDS, strict: bool = False,
                max_remeasure: int = AB_MORE_ROUNDS,
                route: Route = Route.IN_PROCESS) -> tuple[Measurement, PerfOutcome]:
    """An interleaved route: `rounds` rounds (each adds one repetition to A and one to B: step-locked, or
    `by_repetition`), then one more round at a time while a verdict is inconclusive, up to `max_remeasure`; B's
    budgets checked and every metric compared round by round. Returns B's Measurement and the outcome, whose
    `baseline` is A's."""
    reference, candidate = Reference.interleaved(route, run_round, rounds)
    return candidate, run_gate(candidate, reference, budget, strict=strict, max_remeasure=max_remeasure)
