"""Issue #55 point 4 through pytest: `infergate_golden.check_corpus()` on tiny-random-llama's nf4 against its fp32
over the built-in corpus (its byte-level tokenizer reads it as 42,935 tokens in 85 chunks, under a second), recorded
in the terminal, the results JSON and the report; its figures accepted with --infergate-update-golden and a later
run's mean KL rise over them gated (the pure parts: test_corpus.py)."""

import json

CORPUS_TEST = """
import pytest

@pytest.mark.infergate_quality(max_corpus_kl=50, min_corpus_top1=0, max_corpus_kl_rise=0.5)
def test_corpus(infergate_golden, infergate_precision):
    if infergate_precision == "fp32":
        pytest.skip("the reference: nothing to compare it with")
    result = infergate_golden.check_corpus()
    assert result.summary["tokens"] > 10_000
"""


def test_corpus_check_records_accepts_and_gates_the_rise_over_accepted_figures(golden_project):
    pytester, run = golden_project
    pytester.makepyfile(CORPUS_TEST)

    first = run("--infergate-json=first.json")
    first.assert_outcomes(passed=1, skipped=1)  # inconclusive passes its test: nothing accepted to rise over
    first.stdout.fnmatch_lines(["*corpus INCONCLUSIVE nf4 vs fp32 (*s): 42,850 tokens in 85 chunks: mean KL * (* to *),"
                                " top-1 *, Δppl *, KL p99 *, p99.9 *",
                                "*under the policy from marker infergate_quality(max_corpus_kl=50, min_corpus_top1=0, "
                                "max_corpus_kl_rise=0.5)*",
                                "*inconclusive: max_corpus_kl_rise: kl_rise was not measured*no corpus figures accepted"
                                " at *cpu-nf4.corpus.json: accept them with --infergate-update-golden*",
                                "*infergate verdict: INCONCLUSIVE*"])
    (record,) = [r for r in json.loads((pytester.path / "first.json").read_text())["records"] if r["kind"] == "corpus"]
    assert record["status"] == "inconclusive" and record["precision"] == "nf4" and len(record["chunks"]) == 85
    assert set(record["summary"]) >= {"mean_kl", "mean_kl_ci", "top1_ci", "delta_ppl_rel_ci", "p99_kl", "p999_kl"}

    update = run("--infergate-update-golden")
    update.assert_outcomes(passed=1, skipped=1)
    (accepted,) = (pytester.path / "golden").rglob("cpu-nf4.corpus.json")
    update.stdout.fnmatch_lines([f"*against accepted: accepted now: {accepted}*"])
    figures = json.loads(accepted.read_text())
    assert figures["kind"] == "corpus-figures" and figures["reference_precision"] == "fp32"

    rerun = run("--infergate-report=report.html")
    rerun.assert_outcomes(passed=1, skipped=1)
    rerun.stdout.fnmatch_lines(["*corpus PASS*nf4 vs fp32*mean KL vs accepted *: +0.0% (+0.0% to +0.0%)*",
                                f"*against accepted: {accepted} (accepted * on *)*", "*infergate verdict: PASS*"])
    html = (pytester.path / "report.html").read_text()
    assert "Quality over a text corpus" in html and "42,850 tokens in 85 chunks of 512" in html

    for chunk in figures["chunks"]:  # accepted when the model read the text 5 times closer to its reference
        chunk["kl"] /= 5
    accepted.write_text(json.dumps(figures))
    worse = run()
    worse.assert_outcomes(failed=1, skipped=1)
    worse.stdout.fnmatch_lines(["*corpus quality of nf4 vs fp32 breaks the policy*",
                                "*max_corpus_kl_rise: kl_rise = 4 (95% CI 4-4) lies wholly above 0.5*",
                                "*infergate verdict: FAIL*"])
