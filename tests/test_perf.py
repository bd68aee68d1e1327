import json
import random

import pytest

from pytest_infergate.perf import (
    BaselineEntry,
    BaselineError,
    BudgetError,
    Measurement,
    check_budget,
    compare_measurements,
    compare_samples,
    evaluate_perf,
    load_baseline,
    merge_budgets,
    parse_budget,
    parse_ini_budgets,
    save_baseline,
)
from pytest_infergate.stats import percentile


def noisy(center, n, noise=0.05, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_parse_budget_keys_and_percentiles():
    budget = parse_budget({"ttft_ms_p95": 200, "tokens_per_s": 10, "percentile": 90, "tpot_ms": 50, "e2e_ms_p99": 9,
                           "max_regression": 0.1})
    by_key = {limit.key: limit for limit in budget.limits}
    assert by_key["ttft_ms_p95"].percentile == 95
    assert by_key["tpot_ms"].percentile == 90  # the budget's default percentile
    assert by_key["e2e_ms_p99"].metric == "e2e_ms" and by_key["e2e_ms_p99"].percentile == 99
    assert by_key["tokens_per_s"].percentile is None and by_key["tokens_per_s"].higher_is_better
    assert budget.max_regression == 0.1


@pytest.mark.parametrize("kwargs,match", [
    ({"ttft": 5}, r"unknown budget key 'ttft'; allowed: ttft_ms, tpot_ms"),
    ({"tokens_per_s_p95": 5}, "unknown budget key 'tokens_per_s_p95'"),
    ({"ttft_ms_p42": 5}, "unknown budget key 'ttft_ms_p42'"),
    ({"ttft_ms": "fast"}, r"ttft_ms='fast' must be a positive number \(ms\)"),
    ({"ttft_ms": -1}, "must be a positive number"),
    ({"percentile": 97}, r"percentile=97 must be one of \(50, 90, 95, 99, 99.9\)"),
    ({"max_regression": "10%"}, "max_regression='10%' must be a fraction"),
])
def test_bad_budgets_name_the_key(kwargs, match):
    with pytest.raises(BudgetError, match=match):
        parse_budget(kwargs)


def test_ini_budgets_and_merge():
    scoped = parse_ini_budgets(["* : tokens_per_s=1", "int8: tokens_per_s=5, peak_mem_mb=900", "# comment"])
    merged = merge_budgets(scoped["*"], scoped["int8"], parse_budget({"peak_mem_mb": 800}))
    assert {limit.key: limit.value for limit in merged.limits} == {"tokens_per_s": 5, "peak_mem_mb": 800}
    with pytest.raises(BudgetError, match="needs the form 'SCOPE: key=value"):
        parse_ini_budgets(["tokens_per_s=5"])


def test_check_budget_lists_every_violation_with_margin():
    m = Measurement(samples={"ttft_ms": [100.0] * 9 + [1000.0], "tokens_per_s": [8.0, 9.0, 10.0]})
    violations = check_budget(m, parse_budget({"ttft_ms_p99": 500, "ttft_ms": 200, "tokens_per_s": 12}))
    assert [v.key for v in violations] == ["ttft_ms_p99", "tokens_per_s"]
    assert violations[1].margin == pytest.approx((12 - 9) / 12)
    text = violations[0].describe()
    assert "measured p99" in text and "budget <= 500 ms" in text and "n=10" in text


def test_missing_metric_is_a_clear_error():
    with pytest.raises(BudgetError, match="no kv_mem_mb samples"):
        check_budget(Measurement(samples={"ttft_ms": [1.0]}), parse_budget({"kv_mem_mb": 5}))


@pytest.mark.parametrize("true_ratio,expected", [(1.0, "pass"), (1.5, "fail"), (0.8, "pass")])
def test_verdicts_on_synthetic_distributions(true_ratio, expected):
    baseline = noisy(100.0, 200, seed=1)
    candidate = noisy(100.0 * true_ratio, 200, seed=2)
    verdict = compare_samples("ttft_ms", candidate, baseline, max_regression=0.10, pct=50)
    assert verdict.status == expected
    assert verdict.low <= verdict.ratio <= verdict.high
    assert abs(verdict.ratio - true_ratio) < 0.05


def test_regression_at_the_threshold_is_inconclusive():
    baseline = noisy(100.0, 40, noise=0.1, seed=3)
    candidate = noisy(110.0, 40, noise=0.1, seed=4)
    assert compare_samples("ttft_ms", candidate, baseline, 0.10).status == "inconclusive"


def test_throughput_direction_is_oriented():
    # tokens/s dropping by a third is a regression even though the number got smaller
    verdict = compare_samples("tokens_per_s", noisy(66.0, 30, 0.02, 5), noisy(100.0, 30, 0.02, 6), 0.10)
    assert verdict.status == "fail" and verdict.ratio == pytest.approx(1.5, rel=0.05)


def test_interleaved_rounds_compare_pairwise_so_drift_cancels():
    # the machine slows down round by round (a shared CI box); B is 2x slower than A within every round
    drift = [1.0, 0.5, 1.3, 0.4, 0.9]
    a = Measurement(samples={"tokens_per_s": [100.0 * d for d in drift], "ttft_ms": [10.0] * 5})
    b = Measurement(samples={"tokens_per_s": [50.0 * d * (1 + 0.03 * (-1) ** i) for i, d in enumerate(drift)],
                             "ttft_ms": [10.0] * 5})
    budget = parse_budget({"tokens_per_s": 1e-9, "max_regression": 0.5})
    independent = compare_measurements(b, a, budget)[0]
    paired = compare_measurements(b, a, budget, paired=True)[0]
    assert independent.status == "inconclusive"  # the drift swamps the 2x effect between runs
    assert paired.paired and paired.status == "fail" and paired.ratio == pytest.approx(2.0, rel=0.05)
    assert "paired by round" in paired.describe()
    # per-request latencies are not paired: they are many samples per round
    ttft = compare_measurements(b, a, parse_budget({"ttft_ms": 100, "max_regression": 0.5}), paired=True)[0]
    assert not ttft.paired


def test_percentile_matches_numpy_linear():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(8.8)


def test_baseline_round_trip_and_errors(tmp_path):
    m = Measurement(samples={"ttft_ms": [1.0, 2.0]}, repetitions=2)
    path = tmp_path / "b.json"
    save_baseline(path, {"t::x": BaselineEntry({"cpu": "x"}, m)})
    entries = load_baseline(path)
    assert entries["t::x"].measurement == m
    path.write_text("{not json")
    with pytest.raises(BaselineError, match=r"b.json is not valid JSON"):
        load_baseline(path)
    path.write_text(json.dumps({"schema_version": 99, "entries": {}}))
    with pytest.raises(BaselineError, match="schema version 99"):
        load_baseline(path)
    with pytest.raises(BaselineError, match="does not exist"):
        load_baseline(tmp_path / "missing.json")


def test_gate_skips_relative_check_on_fingerprint_mismatch():
    m = Measurement(samples={"ttft_ms": noisy(100, 50)})
    entry = BaselineEntry({"cpu": "other", "torch": "2.0"}, Measurement(samples={"ttft_ms": noisy(50, 50)}))
    budget = parse_budget({"max_regression": 0.1, "ttft_ms": 1000})
    lenient = evaluate_perf(m, budget, {"cpu": "this", "torch": "2.0"}, entry)
    assert lenient.status == "pass" and lenient.verdicts == []
    assert "cpu: baseline 'other', now 'this'" in lenient.message()
    assert evaluate_perf(m, budget, {"cpu": "this", "torch": "2.0"}, entry, strict=True).status == "fail"
    same = evaluate_perf(m, budget, {"cpu": "other", "torch": "2.0"}, entry)
    assert same.status == "fail" and same.verdicts[0].status == "fail"


def test_inconclusive_remeasures_then_decides():
    base = noisy(100.0, 30, 0.1, 7)
    m = Measurement(samples={"ttft_ms": noisy(108.0, 6, 0.1, 8)})
    entry = BaselineEntry({}, Measurement(samples={"ttft_ms": base}))
    calls = []

    def remeasure():
        calls.append(1)
        m.samples["ttft_ms"].extend(noisy(130.0, 60, 0.02, 9 + len(calls)))

    outcome = evaluate_perf(m, parse_budget({"max_regression": 0.1, "ttft_ms": 1e6}), {}, entry, remeasure=remeasure)
    assert calls and outcome.remeasured == len(calls)
    assert outcome.status == "fail"
