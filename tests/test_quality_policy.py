"""Issue #55 points 1-2, the pure parts: check()'s default policy per precision class, each threshold decided on its
aggregate's interval, and the policy's sources named (the same through pytest: test_plugin_quality_policy.py)."""

from types import SimpleNamespace

import pytest

from pytest_infergate.quality.policy import ResolvedPolicy, decide_quality, resolve_policy
from pytest_infergate.quality.policy_defaults import EIGHT_BIT, FLOATING_POINT, FOUR_BIT, SERVED, default_policy
from pytest_infergate.quality.thresholds import ThresholdCheck
from pytest_infergate.status import Status

# the embedded model (SmolLM2-135M) against fp32 as measured (issue #55): int8 on 48 samples, nf4 as the starter's
# 16 read it (intervals as the bootstrap gives them)
INT8 = {"samples": 48, "top1": 0.94, "top1_ci": [0.926, 0.950], "mean_kl": 0.021, "mean_kl_ci": [0.018, 0.024]}
NF4 = {"samples": 16, "top1": 0.783, "top1_ci": [0.74, 0.82], "mean_kl": 0.289, "mean_kl_ci": [0.24, 0.34],
       "exact_match": 0.0625, "exact_match_ci": [0.0, 0.1875]}


def comparison(summary: dict) -> SimpleNamespace:
    return SimpleNamespace(summary=summary, categories={}, flags=[])


def check(summary: dict, key: str = "min_top1", threshold: float = 0.9) -> ThresholdCheck:
    figure, direction = {"min_top1": ("top1", "min"), "max_mean_kl": ("mean_kl", "max"),
                         "max_p99_kl": ("p99_kl", "max")}[key]
    return ThresholdCheck.of(summary, key, figure, direction, threshold, "marker infergate_quality")


@pytest.mark.parametrize("precision, expected", [("fp32", FLOATING_POINT), ("fp16", FLOATING_POINT),
                                                 ("bf16", FLOATING_POINT), ("int8", EIGHT_BIT), ("nf4", FOUR_BIT),
                                                 ("endpoint", SERVED), ("fp8", SERVED)])
def test_every_precision_has_a_default_class(precision, expected):
    assert default_policy(precision) is expected


def test_the_defaults_pass_int8_and_fail_nf4_as_measured_on_the_embedded_model():
    assert FLOATING_POINT.rules == {"min_top1": 0.95, "max_mean_kl": 0.01}  # half precision: tighter
    int8 = decide_quality(comparison(INT8), ResolvedPolicy().for_reference("int8"))
    assert int8.status == Status.PASS and not int8.undecided
    nf4 = decide_quality(comparison(NF4), ResolvedPolicy().for_reference("nf4"))
    assert nf4.problems == ["min_top1: top1 = 0.783 (95% CI 0.74-0.82) lies wholly below 0.9 (default policy for nf4)",
                            "max_mean_kl: mean_kl = 0.289 (95% CI 0.24-0.34) lies wholly above 0.05 "
                            "(default policy for nf4)"]


def test_no_threshold_of_check_means_the_default_decides_and_says_so():
    empty = ResolvedPolicy().for_reference("int8")
    assert empty.rules == {"min_top1": 0.9, "max_mean_kl": 0.05}
    assert empty.decided_by() == "default policy for int8 (8-bit class): min_top1=0.9, max_mean_kl=0.05"
    # another gate's keys (the regression gate's) are not a policy of check(): the default still decides
    regression_only = resolve_policy(["int8: max_drift_share=0.1"], [], "int8", "t.py::t[int8]").for_reference("int8")
    assert regression_only.default and regression_only.rules["max_drift_share"] == 0.1
    assert "max_drift_share" not in regression_only.decided_by()
    # one threshold of check() set: that policy decides whole, the default adds nothing
    own = ResolvedPolicy.given({"min_rouge_l": 0.4}).for_reference("nf4")
    assert own.rules == {"min_rouge_l": 0.4} and own.decided_by() == "policy from check(policy=...)(min_rouge_l=0.4)"


def test_where_ini_scopes_and_markers_set_a_key_the_one_that_decided_is_named():
    policy = resolve_policy(["*: max_mean_kl=2", "nf4: min_top1=0.7, max_mean_kl=0.2"], [{"min_top1": 0.95}],
                            "nf4", "t.py::t[nf4]")
    assert policy.rules == {"max_mean_kl": 0.2, "min_top1": 0.95} and policy.scopes == ("*", "nf4")
    assert policy.decided_by() == (
        "policy from ini infergate_quality_policy scope 'nf4' (max_mean_kl=0.2) and marker infergate_quality"
        "(min_top1=0.95); max_mean_kl from ini infergate_quality_policy scope 'nf4', over ini infergate_quality_policy "
        "scope '*': max_mean_kl=2; min_top1 from marker infergate_quality, over ini infergate_quality_policy scope "
        "'nf4': min_top1=0.7")
    problems = decide_quality(comparison(NF4), policy).problems
    assert problems[0].endswith("lies wholly above 0.2 (ini infergate_quality_policy scope 'nf4', over ini "
                                "infergate_quality_policy scope '*': max_mean_kl=2)")
    assert problems[1].endswith("lies wholly below 0.95 (marker infergate_quality, over ini infergate_quality_policy "
                                "scope 'nf4': min_top1=0.7)")


@pytest.mark.parametrize("key, threshold, status", [
    ("min_top1", 0.7, Status.PASS), ("min_top1", 0.74, Status.PASS),  # the whole interval at or above
    ("min_top1", 0.9, Status.FAIL), ("min_top1", 0.8, Status.INCONCLUSIVE),
    ("max_mean_kl", 0.5, Status.PASS), ("max_mean_kl", 0.1, Status.FAIL), ("max_mean_kl", 0.3, Status.INCONCLUSIVE)])
def test_each_threshold_is_decided_on_its_interval(key, threshold, status):
    assert check(NF4, key, threshold).status == status


def test_an_undecided_threshold_says_about_how_many_samples_would_decide():
    # top-1 0.783 (0.74-0.82) against 0.8: the upper half-width 0.037 must shrink to the distance 0.017,
    # so 16 * (0.037 / 0.017)^2 = 75.8 samples
    straddling = check(NF4, "min_top1", 0.8)
    assert straddling.samples_needed() == 76
    assert straddling.describe() == ("min_top1: top1 = 0.783 (95% CI 0.74-0.82) straddles 0.8 (marker infergate_quality"
                                     "): about 76 samples would decide (16 now): add golden samples or raise `limit=`")
    undecided = decide_quality(comparison(NF4), ResolvedPolicy.given({"min_top1": 0.8}))
    assert undecided.status == Status.INCONCLUSIVE and "about 76 samples would decide" in undecided.undecided[0]
    on_it = check(NF4, "min_top1", 0.783)
    assert on_it.samples_needed() is None and "no number of samples decides" in on_it.describe()


def test_without_an_interval_the_point_decides_and_says_so():
    one = {"samples": 1, "top1": 0.85, "top1_ci": [0.85, 0.85]}
    assert check(one).status == Status.FAIL
    assert check(one).describe() == ("min_top1: top1 = 0.85 < 0.9 (marker infergate_quality), decided on the point "
                                     "(one sample)")
    p99 = {"samples": 48, "p99_kl": 0.2}
    assert check(p99, "max_p99_kl", 0.3).status == Status.PASS
    passed = decide_quality(comparison(p99), ResolvedPolicy.given({"max_p99_kl": 0.3}))
    assert passed.status == Status.PASS and passed.notes == [
        "max_p99_kl: p99_kl = 0.2 <= 0.3 (check(policy=...)), decided on the point (p99_kl has no interval)"]


def test_a_figure_not_measured_fails_a_policy_the_test_set_and_leaves_the_default_undecided():
    texts_only = {"samples": 6, "rougeL": 0.6, "rougeL_ci": [0.5, 0.7]}  # a server that returned no logprobs
    asked = decide_quality(comparison(texts_only), ResolvedPolicy.given({"min_top1": 0.9}))
    assert asked.problems == ["min_top1: top1 was not measured (check(policy=...))"]
    default = decide_quality(comparison(texts_only), ResolvedPolicy().for_reference("endpoint"))
    assert default.status == Status.INCONCLUSIVE and not default.problems
    assert default.undecided[0].startswith("min_top1: top1 was not measured (default policy for endpoint): a server "
                                           "that returned no logprobs has no top-1 or KL; set the policy on what it "
                                           "measured")
