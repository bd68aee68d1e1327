"""Two runs' results side by side, decided exactly as the in-run gate decides against a stored baseline: run A's
record is the stored reference (its fingerprint and measurement), run B's the candidate, and `perf.decide.decide`
gives the verdict. So `infergate compare A.json B.json` says what `pytest --infergate-baseline` (with A saved as
the baseline) said of B, and the history says it of each run against the one before it."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.measurement import METRICS
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.budget import BudgetError, parse_budget
from pytest_infergate.perf.decide import decide
from pytest_infergate.perf.gate import StoredReference
from pytest_infergate.perf.outcome import Budget, PerfOutcome
from pytest_infergate.results.records import PerfRecord

# metrics compared when the candidate's record names none in its budget (a run with max_regression alone)
DEFAULT_COMPARED = ("ttft_ms", "tpot_ms", "e2e_ms", "tokens_per_s", "peak_mem_mb")
DEFAULT_MAX_REGRESSION = 0.10


@dataclass(frozen=True)
class PairOutcome:
    """One measurement key present in both runs, and the gate's outcome of B against A."""

    test: str
    baseline: PerfRecord
    candidate: PerfRecord
    outcome: PerfOutcome


def budget_of(record: PerfRecord, max_regression: float | None) -> Budget:
    """The budget the candidate's gate checked (from its record), with `max_regression` when given (else the
    record's, else 10%); a record whose budget names no metric compares DEFAULT_COMPARED."""
    values = {key: value for key, value in record.budget.items() if key != "max_regression"}
    try:
        budget = parse_budget(values, where=f"the budget recorded for {record.test}")
    except BudgetError:
        budget = parse_budget({})
    regression = max_regression if max_regression is not None else record.budget.get("max_regression")
    regression = DEFAULT_MAX_REGRESSION if regression is None else regression
    if not budget.limits:  # a limit no measurement can break names a metric without gating its value
        budget = parse_budget({metric: 1e-300 if METRICS[metric][1] else 1e300 for metric in DEFAULT_COMPARED})
    # as the in-run gate (gates.perf.measured_budget): a key the measurement has no figure for is not checked
    measured = tuple(limit for limit in budget.limits if record.measurement.samples.get(limit.metric))
    return Budget(measured, budget.percentile, regression)


def decide_pair(baseline: PerfRecord, candidate: PerfRecord, max_regression: float | None = None) -> PerfOutcome:
    """The candidate record's measurement against the baseline record's, as the in-run gate decides it. Only the
    relative question: the candidate's absolute budgets were its own run's verdict (`infergate summary`)."""
    reference = StoredReference(BaselineEntry(baseline.fingerprint, baseline.measurement))
    budget = budget_of(candidate, max_regression)
    outcome = decide(candidate.measurement, reference, budget, candidate.fingerprint)
    outcome.violations = []  # the relative question only: the absolute budgets were B's own run's verdict
    return outcome


def compare_records(baseline: list[PerfRecord], candidate: list[PerfRecord], max_regression: float | None = None
                    ) -> tuple[list[PairOutcome], list[str], list[str]]:
    """Outcomes for every measurement key in both lists, and the keys only in the baseline / only in the
    candidate."""
    old, new = {r.test: r for r in baseline}, {r.test: r for r in candidate}
    pairs = [PairOutcome(test, old[test], new[test], decide_pair(old[test], new[test], max_regression))
             for test in sorted(set(old) & set(new))]
    return pairs, sorted(set(old) - set(new)), sorted(set(new) - set(old))
