"""The perf gate's decision for one test: absolute budgets, then the noise-aware comparison with a baseline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from pytest_infergate.baseline import baseline_measurement, fingerprint_mismatches
from pytest_infergate.perf import Budget, Measurement, Verdict, Violation, check_budget, compare_measurements


@dataclass
class PerfOutcome:
    violations: list[Violation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remeasured: int = 0
    strict: bool = False
    fingerprint_mismatch: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.violations or any(v.status == "fail" for v in self.verdicts):
            return "fail"
        if self.strict and self.fingerprint_mismatch:
            return "fail"
        if any(v.status == "inconclusive" for v in self.verdicts):
            return "fail" if self.strict else "inconclusive"
        return "pass"

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def message(self) -> str:
        lines = []
        if self.violations:
            lines.append(f"{len(self.violations)} budget(s) exceeded:")
            lines += ["  " + v.describe() for v in self.violations]
        bad = [v for v in self.verdicts if v.status != "pass"]
        if bad:
            lines.append("regression against the baseline:")
            lines += ["  " + v.describe() for v in bad]
            if self.remeasured:
                lines.append(f"  (re-measured {self.remeasured} more time(s) before deciding)")
        if self.fingerprint_mismatch:
            lines.append("environment differs from the baseline's: " + "; ".join(self.fingerprint_mismatch))
        lines += self.notes
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"status": self.status, "violations": [v.__dict__ | {"margin": v.margin} for v in self.violations],
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": self.notes,
                "fingerprint_mismatch": self.fingerprint_mismatch, "remeasured": self.remeasured}


def normalize_fingerprint(fingerprint: dict) -> dict:
    """Engine configs and nested values compare as canonical JSON strings."""
    return {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for k, v in fingerprint.items()}


def evaluate_perf(measurement: Measurement, budget: Budget, fingerprint: dict, baseline_entry: dict | None,
                  strict: bool = False, remeasure: Callable[[], None] | None = None,
                  max_remeasure: int = 2) -> PerfOutcome:
    outcome = PerfOutcome(violations=check_budget(measurement, budget), strict=strict)
    if baseline_entry is None:
        if budget.max_regression is not None:
            outcome.notes.append("no baseline entry for this test: the relative check was skipped "
                                 "(record one with --infergate-save-baseline)")
        return outcome
    mismatch = fingerprint_mismatches(normalize_fingerprint(fingerprint),
                                      normalize_fingerprint(baseline_entry["fingerprint"]))
    if mismatch:
        outcome.fingerprint_mismatch = mismatch
        outcome.notes.append("relative check skipped: the baseline was measured in another environment")
        return outcome
    if budget.max_regression is None:
        return outcome
    accepted = baseline_measurement(baseline_entry)
    outcome.verdicts = compare_measurements(measurement, accepted, budget)
    while (remeasure is not None and outcome.remeasured < max_remeasure
           and any(v.status == "inconclusive" for v in outcome.verdicts)):
        remeasure()
        outcome.remeasured += 1
        outcome.verdicts = compare_measurements(measurement, accepted, budget)
    return outcome


def evaluate_ab(run_a: Callable, run_b: Callable, budget: Budget, rounds: int, strict: bool = False,
                max_remeasure: int = 2):
    """Interleaved A/B gate: `rounds` of A then B (each `run_x(measurement)` adds one repetition), then one more
    round at a time while a verdict is inconclusive, up to `max_remeasure`. Returns (A, B, verdicts, status,
    remeasured)."""
    from pytest_infergate.bench import measure_interleaved

    a, b = measure_interleaved(run_a, run_b, rounds)
    verdicts = compare_measurements(b, a, budget, paired=True)
    remeasured = 0
    while remeasured < max_remeasure and any(v.status == "inconclusive" for v in verdicts):
        run_a(a)
        run_b(b)
        remeasured += 1
        verdicts = compare_measurements(b, a, budget, paired=True)
    status = ("fail" if any(v.status == "fail" for v in verdicts) else
              "inconclusive" if any(v.status == "inconclusive" for v in verdicts) else "pass")
    if status == "inconclusive" and strict:
        status = "fail"
    return a, b, verdicts, status, remeasured
