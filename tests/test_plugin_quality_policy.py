"""Issue #55 points 1-2 through pytest, on tiny-random-llama with a small sample set: a quality check with no policy
is decided by the default of the precision's class and names it (terminal, failure message, verdict, JSON); a
threshold inside the interval is inconclusive, saying how many samples would decide; where an ini scope and a marker
both set a key, the verdict names the one that decided."""

import json

import pytest

TEST_FILE = """
import pytest

{marker}
def test_quality(infergate_golden):
    infergate_golden.check()
"""


@pytest.fixture
def project(golden_project):
    pytester, run_project = golden_project

    def run(marker: str = "", *args):
        pytester.makepyfile(TEST_FILE.format(marker=marker))
        result = run_project("--infergate-json=out.json", *args)
        records = json.loads((pytester.path / "out.json").read_text())["records"]
        return result, {r["precision"]: r for r in records if r["kind"] == "quality"}

    return pytester, run


def test_a_check_without_marker_or_ini_policy_is_decided_by_the_default_policy_it_names(project):
    _, run = project
    result, records = run()
    # tiny-random-llama's nf4 agrees with fp32 at top-1 ~0.3: the default for 4-bit (0.9) fails it; fp32 against
    # itself passes its own class's default
    result.assert_outcomes(passed=1, failed=1)
    default = "default policy for nf4 (4-bit class): min_top1=0.9, max_mean_kl=0.05"
    result.stdout.fnmatch_lines([f"*quality of nf4 vs fp32 breaks the policy ({default}):*",
                                 "*min_top1: top1 = * (95% CI *) lies wholly below 0.9 (default policy for nf4)*"])
    result.stdout.fnmatch_lines(["*quality FAIL*nf4 vs fp32 (4 samples*", f"*under the {default}*"])
    result.stdout.fnmatch_lines(["*FAIL quality gate *test_quality?nf4?: min_top1: top1 = *(default policy for nf4)*"])
    # issue #56 trial: a failure under a bar nobody chose says what to do, in the verdict's reason and the failure
    advice = ("Accept the loss with a policy for nf4 (ini infergate_quality_policy or an infergate_quality marker), "
              "or drop nf4 from the precisions.")
    result.stdout.fnmatch_lines([f"*FAIL quality gate *test_quality?nf4?: *(default policy for nf4). {advice}"])
    result.stdout.fnmatch_lines(["*max_mean_kl: mean_kl = *", advice, "worst samples:"])
    nf4, fp32 = records["nf4"], records["fp32"]
    assert nf4["status"] == "fail" and nf4["decided_by"] == default
    assert nf4["policy"] == {"min_top1": 0.9, "max_mean_kl": 0.05} and len(nf4["problems"]) == 2
    assert fp32["status"] == "pass"
    assert fp32["decided_by"] == "default policy for fp32 (floating point class): min_top1=0.95, max_mean_kl=0.01"


def test_a_threshold_inside_the_interval_is_inconclusive_and_says_how_many_samples_would_decide(project):
    _, run = project
    _, records = run("@pytest.mark.infergate_quality(min_top1=0, max_mean_kl=1000)")
    summary = records["nf4"]["summary"]
    low, high = summary["top1_ci"]
    threshold = round((low + summary["top1"]) / 2, 4)  # inside the interval, below the point
    assert low < threshold < high

    result, records = run(f"@pytest.mark.infergate_quality(min_top1={threshold}, max_mean_kl=1000)")
    result.assert_outcomes(passed=2)  # undecided is not a failure unless --infergate-strict
    result.stdout.fnmatch_lines(["*quality INCONCLUSIVE nf4 vs fp32*",
                                 f"*inconclusive: min_top1: top1 = * (95% CI *) straddles {threshold:g} (marker "
                                 "infergate_quality): about * samples would decide (4 now)*"])
    result.stdout.fnmatch_lines([f"*INCONCLUSIVE quality gate *test_quality?nf4?: min_top1*straddles {threshold:g}*"])
    nf4 = records["nf4"]
    assert nf4["status"] == "inconclusive" and not nf4["problems"] and "samples would decide" in nf4["undecided"][0]
    assert nf4["decided_by"] == f"policy from marker infergate_quality(min_top1={threshold:g}, max_mean_kl=1000)"

    strict, _ = run(f"@pytest.mark.infergate_quality(min_top1={threshold}, max_mean_kl=1000)", "--infergate-strict")
    strict.assert_outcomes(passed=1, failed=1)


def test_where_an_ini_scope_and_a_marker_set_the_same_key_the_verdict_names_the_marker(project):
    pytester, run = project
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    nf4: min_top1=0.01, max_mean_kl=0.01\n")
    result, records = run("@pytest.mark.infergate_quality(min_top1=0.99)")
    result.assert_outcomes(passed=1, failed=1)
    over = "marker infergate_quality, over ini infergate_quality_policy scope 'nf4': min_top1=0.01"
    assert "Accept the loss" not in result.stdout.str()  # a stated policy: the loss was chosen, no advice
    result.stdout.fnmatch_lines([f"*min_top1: top1 = * lies wholly below 0.99 ({over})*",
                                 "*max_mean_kl: mean_kl = * lies wholly above 0.01 (ini infergate_quality_policy "
                                 "scope 'nf4')*"])
    result.stdout.fnmatch_lines([f"*FAIL quality gate *test_quality?nf4?: min_top1: *({over});*"])
    assert records["nf4"]["decided_by"] == (
        "policy from marker infergate_quality(min_top1=0.99) and ini infergate_quality_policy scope 'nf4' "
        f"(max_mean_kl=0.01); min_top1 from {over}")
    assert records["fp32"]["decided_by"] == "policy from marker infergate_quality(min_top1=0.99)"
