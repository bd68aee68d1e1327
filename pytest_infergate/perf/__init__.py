"""Perf gates: the metrics and their Measurement, budgets, noise-aware verdicts, stored baselines, the references
a candidate is compared with (a strategy per route), and the gate that makes the one decision over them and
measures more while it cannot decide (perf.gate.PerfGate.check, one PerfOutcome whatever the route). No
pytest and no torch here; the engine bench (`perf.local_bench`) imports the engine when it is used; the fixture
object is `gates.perf`."""

from pytest_infergate.measurement import METRICS, PERCENTILES, Measurement, add_request_latencies
from pytest_infergate.perf.baseline import BaselineEntry, BaselineError, load_baseline
from pytest_infergate.perf.budget import BudgetError, merge_budgets, parse_budget, parse_ini_budgets, resolve_budget
from pytest_infergate.perf.gate import NoReference, PerfGate, StoredReference, compare_measurements
from pytest_infergate.perf.interleaved import Interleaved, evaluate_ab
from pytest_infergate.perf.lockstep import Claim, Speedup, faster, grows
from pytest_infergate.perf.outcome import Budget, Limit, PerfOutcome, Route, Violation, check_budget
from pytest_infergate.perf.paired import compare_paired
from pytest_infergate.perf.verdict import Verdict, compare_samples

__all__ = ["METRICS", "PERCENTILES", "BaselineEntry", "BaselineError", "Budget", "BudgetError", "Claim",
           "Interleaved", "Limit", "Measurement", "NoReference", "PerfGate", "PerfOutcome", "Route", "Speedup",
           "StoredReference", "Verdict", "Violation", "add_request_latencies", "check_budget",
           "compare_measurements", "compare_paired", "compare_samples", "evaluate_ab", "faster",
           "grows", "load_baseline", "merge_budgets", "parse_budget", "parse_ini_budgets", "resolve_budget"]
