"""Perf budgets as written: what a test promises (`ttft_ms_p95=200, tokens_per_s=10, max_regression=0.1`) and
where the promise comes from (ini lines by scope, then the test's markers), parsed into a perf.outcome.Budget.

A budget key is a metric, optionally with a percentile suffix: `ttft_ms`, `ttft_ms_p95`, `ttft_ms_p999` (p99.9),
`tokens_per_s`... Distribution metrics (latencies) use the key's percentile, else the budget's `percentile`
(default 50). A key may say its direction: `min_capacity_rps` (a metric where higher is better) and
`max_kv_usage` (lower is better) are the same limits as `capacity_rps` and `kv_usage`.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from pytest_infergate.errors import unknown_keys
from pytest_infergate.measurement import METRICS, PERCENTILE_OF_SUFFIX, PERCENTILES, Measurement, percentile_suffix
from pytest_infergate.perf.outcome import Budget, BudgetError, Limit
from pytest_infergate.scopes import applicable_scopes, parse_scoped_lines

_KEY = re.compile(r"^(?P<metric>[a-z0-9_]+?)(?:_p(?P<pct>\d+))?$")
_DIRECTION = re.compile(r"^(?P<bound>min|max)_(?P<metric>[a-z0-9_]+)$")
_OPTION_KEYS = {"percentile": int, "max_regression": float}


def allowed_keys() -> list[str]:
    keys = list(METRICS)
    keys += [f"{m}_{percentile_suffix(p)}" for m, (_, _, dist) in METRICS.items() if dist for p in PERCENTILES]
    keys += [f"{'min' if higher else 'max'}_{m}" for m, (_, higher, dist) in METRICS.items() if not dist]
    return keys + list(_OPTION_KEYS)


def _split_key(key: str, where: str) -> tuple[str, str | None]:
    """(metric, percentile suffix) of a budget key; `min_`/`max_` must agree with the metric's direction."""
    directed = _DIRECTION.match(key)
    if directed and directed.group("metric") in METRICS and not METRICS[directed.group("metric")][2]:
        metric, bound = directed.group("metric"), directed.group("bound")
        if (bound == "min") != METRICS[metric][1]:
            right = "min" if METRICS[metric][1] else "max"
            raise BudgetError(f"{where}: {key!r}: {metric} is {'higher' if METRICS[metric][1] else 'lower'}-is-"
                              f"better, so its limit is a {right}imum; write {right}_{metric} (or {metric})")
        return metric, None
    match = _KEY.match(key)
    metric, pct = (match.group("metric"), match.group("pct")) if match else (key, None)
    if metric not in METRICS and key in METRICS:
        metric, pct = key, None
    return metric, pct


def parse_budget(values: dict[str, Any], where: str = "infergate_budget") -> Budget:
    """Validate budget keys and values; raise BudgetError naming every unknown key (with the closest allowed one)
    and the allowed ones."""
    # a min_/max_ key of a known metric in the wrong direction gets its own message (_split_key)
    directed = [key for key in values if (m := _DIRECTION.match(key)) and m.group("metric") in METRICS]
    unknown = unknown_keys([key for key in values if key not in directed], allowed_keys(), "budget key")
    if unknown:
        raise BudgetError(f"{where}: {unknown}; allowed: {', '.join(allowed_keys())}")
    percentile_default = values.get("percentile", 50)
    if (not isinstance(percentile_default, (int, float)) or isinstance(percentile_default, bool)
            or percentile_default not in PERCENTILES):
        raise BudgetError(f"{where}: percentile={percentile_default!r} must be one of {PERCENTILES}")
    max_regression = values.get("max_regression")
    if max_regression is not None:
        if (isinstance(max_regression, bool) or not isinstance(max_regression, (int, float))
                or not 0 <= max_regression < 10):  # nan fails the range test too
            raise BudgetError(f"{where}: max_regression={max_regression!r} must be a fraction such as 0.10 (10%)")
        max_regression = float(max_regression)
    limits = []
    for key, value in values.items():
        if key in _OPTION_KEYS:
            continue
        metric, pct = _split_key(key, where)
        if metric not in METRICS or (pct is not None and (pct not in PERCENTILE_OF_SUFFIX or not METRICS[metric][2])):
            raise BudgetError(f"{where}: unknown budget key {key!r}; allowed: {', '.join(allowed_keys())}")
        zero_ok = METRICS[metric][0] == "count"  # max_preemptions=0: none allowed
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0 or (value == 0 and not zero_ok):
            finite = "" if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isfinite(value) \
                else "; a limit of nan or inf would never be checked"
            raise BudgetError(f"{where}: {key}={value!r} must be a positive number ({METRICS[metric][0]}){finite}")
        pct_value = (PERCENTILE_OF_SUFFIX[pct] if pct else percentile_default) if METRICS[metric][2] else None
        limits.append(Limit(key, metric, pct_value, float(value)))
    return Budget(tuple(limits), percentile_default, max_regression)


# the relative question `infergate compare` and the history ask of a record whose gate set no max_regression
DEFAULT_MAX_REGRESSION = 0.10


def recorded_budget(values: dict[str, Any], measurement: Measurement, max_regression: float | None = None,
                    where: str = "a recorded budget") -> Budget:
    """The budget a record's gate checked, as the record keeps it (gates.perf.finish_gate: the limits measured and
    max_regression), asking the relative question: `max_regression` where given, else the record's, else 10%. As
    in the run, a key the measurement has no figure for is not checked, and a budget that names no figure compares
    the in-run gate's default figures (Budget.relative_metrics); a budget this version cannot read (a record from
    another version) compares those too."""
    try:
        budget = parse_budget({key: value for key, value in values.items() if key != "max_regression"}, where)
    except BudgetError:
        budget = Budget()
    regression = max_regression if max_regression is not None else values.get("max_regression")
    measured, _ = budget.measured_in(measurement)
    return replace(measured, max_regression=DEFAULT_MAX_REGRESSION if regression is None else regression)


def parse_ini_budgets(lines: list[str]) -> dict[str, Budget]:
    """ini `infergate_budgets`, one line per scope: `SCOPE: key=value, key=value`. SCOPE is a precision,
    a substring of the test id (and measurement label), or `*`. Example: `int8: tokens_per_s=5, peak_mem_mb=900`."""
    return {scope: parse_budget(line.values, f"{line.where} ({scope})")
            for scope, line in parse_scoped_lines(lines, "infergate_budgets", BudgetError).items()}


def resolve_budget(ini_lines: list[str], marker_kwargs: list[dict[str, Any]], precision: str, key: str
                   ) -> tuple[Budget, list[str]]:
    """The budget of one measurement: ini lines whose scope applies (see scopes.py), then the test's markers
    (outermost first, so the marker closest to the test wins). Returns it with the ini scopes that applied."""
    scoped = parse_ini_budgets(ini_lines)
    scopes = applicable_scopes(scoped, precision, key)
    layers = [scoped[scope] for scope in scopes] + [parse_budget(kwargs) for kwargs in marker_kwargs]
    return merge_budgets(*layers), scopes


def merge_budgets(*budgets: Budget) -> Budget:
    """Later budgets override earlier ones key by key (marker over ini)."""
    limits: dict[str, Limit] = {}
    percentile_, max_regression = 50, None
    for budget in budgets:
        for limit in budget.limits:
            limits[limit.key] = limit
        percentile_ = budget.percentile if budget.percentile != 50 else percentile_
        max_regression = budget.max_regression if budget.max_regression is not None else max_regression
    return Budget(tuple(limits.values()), percentile_, max_regression)
