"""The stored-baseline gate as the tests call it: one PerfGate.check (the one way into the decision) of a
measurement against a baseline entry, or against budgets alone where there is none."""

from collections.abc import Callable

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.perf.gate import NoReference, PerfGate, StoredReference
from pytest_infergate.perf.outcome import Budget, PerfOutcome


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: BaselineEntry | None,
                  remeasure: Callable[[], None] | None = None, baseline_given: bool = True,
                  other_model: bool = True) -> PerfOutcome:
    """The budget-only or stored gate of `measurement`: the stored baseline's entry for it, if any.
    `baseline_given`: a baseline file was passed, so a missing entry means a check that silently did not run."""
    reference = (StoredReference(baseline_entry, remeasure) if baseline_entry is not None
                 else NoReference(baseline_given))
    return PerfGate(budget, reference, fingerprint, other_model=other_model).check(measurement)
