"""Perf gates: the metrics and their Measurement, budgets, noise-aware verdicts, stored baselines and the gate that
decides (one PerfOutcome for a stored baseline and for an interleaved A/B run). No pytest and no torch here; the
engine bench (`perf.bench`) imports the engine when it is used; the fixture object is `gates.bench`."""

from pytest_infergate.measurement import METRICS, PERCENTILES, Measurement, add_request_latencies
from pytest_infergate.perf.baseline import BaselineEntry, BaselineError, load_baseline, save_baseline
from pytest_infergate.perf.budget import (
                                          Budget,
                                          BudgetError,
                                          Limit,
                                          Violation,
                                          check_budget,
                                          merge_budgets,
                                          parse_budget,
                                          parse_ini_budgets,
                                          resolve_budget,
)
from pytest_infergate.perf.gate import PerfOutcome, evaluate_ab, evaluate_perf
from pytest_infergate.perf.verdict import Verdict, compare_measurements, compare_paired, compare_samples

__all__ = ["METRICS", "PERCENTILES", "BaselineEntry", "BaselineError", "Budget", "BudgetError", "Limit",
           "Measurement", "PerfOutcome", "Verdict", "Violation", "add_request_latencies", "check_budget",
           "compare_measurements", "compare_paired", "compare_samples", "evaluate_ab", "evaluate_perf",
           "load_baseline", "merge_budgets", "parse_budget", "parse_ini_budgets", "resolve_budget", "save_baseline"]
