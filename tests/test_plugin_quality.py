"""Golden-sample gates through pytest, on tiny-random-llama with a small sample set."""

import json
import re

import pytest

TEST_FILE = """
import pytest

{marker}
def test_quality(infergate_golden):
    infergate_golden.check()

def test_regression(infergate_golden):
    infergate_golden.check_regression()
"""


def test_policy_pass_and_fail_with_worst_samples(golden_project):
    pytester, run = golden_project
    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_top1=0.0, max_mean_kl=50)"))
    result = run("-k", "test_quality")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*quality PASS*nf4 vs fp32 (4 samples*rougeL*mean_kl*"])

    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_exact_match=1.0, max_mean_kl=0)"))
    result = run("-k", "test_quality")
    result.assert_outcomes(passed=1, failed=1)  # fp32 against itself passes
    result.stdout.fnmatch_lines(["*quality of nf4 vs fp32 breaks the policy*", "*min_exact_match: exact_match = *",
                                 "*max_mean_kl: mean_kl = *", "*worst samples:*", "*first divergence at token*"])


@pytest.mark.parametrize("marker_args, message", [
    ("min_rougel=0.5", "*unknown quality key 'min_rougel'*"),
    ("exact=2", "*exact=2 is a switch: 1 (on) or 0 (off)*"),  # a regression-gate key, checked at collection too
])
def test_bad_quality_marker_fails_collection(golden_project, marker_args, message):
    pytester, run = golden_project
    pytester.makepyfile(TEST_FILE.format(marker=f"@pytest.mark.infergate_quality({marker_args})"))
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_ini_policy_per_precision(golden_project):
    pytester, run = golden_project
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    nf4: min_exact_match=1.0\n")
    pytester.makepyfile(TEST_FILE.format(marker=""))
    run("-k", "test_quality").assert_outcomes(passed=1, failed=1)


def test_golden_regression_lifecycle(golden_project):
    pytester, run = golden_project
    pytester.makepyfile(TEST_FILE.format(marker=""))
    first = run("-k", "test_regression", "-rs")
    first.assert_outcomes(skipped=2)
    first.stdout.fnmatch_lines(["*no accepted golden outputs at *cpu-fp32.jsonl*--infergate-update-golden*"])

    update = run("-k", "test_regression", "--infergate-update-golden")
    update.assert_outcomes(passed=2)
    update.stdout.fnmatch_lines(["*golden UPDATED nf4*", "*new golden file with 4 samples*"])
    (path,) = (pytester.path / "golden").rglob("cpu-nf4.jsonl")
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["precision"] == "nf4" and len(lines) == 5
    assert json.loads(lines[1])["top_logprobs"], "reference logprobs were not stored"

    run("-k", "test_regression").assert_outcomes(passed=2)  # an unchanged rerun reproduces them exactly

    tampered = json.loads(lines[2])
    tampered["token_ids"][0] = (tampered["token_ids"][0] + 1) % 200 + 3
    path.write_text("\n".join([lines[0], lines[1], json.dumps(tampered)] + lines[3:]) + "\n")
    # nf4's quality against fp32 is as accepted: the changed output is listed, and passes
    listed = run("-k", "test_regression")
    listed.assert_outcomes(passed=2)
    listed.stdout.fnmatch_lines(["*golden PASS*nf4: 1 of 4 outputs changed, 1 drift*judged quality against the "
                                 "reference, this run's vs as accepted in cpu-nf4.jsonl*"])
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    nf4: exact=1\n")  # token for token, opted in
    result = run("-k", "test_regression")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1 of 4 golden outputs of nf4 changed*", "*exact=1: 1 of 4 outputs changed*",
                                 f"*{tampered['id']}*first divergence at token 0*"])

    path.write_text(lines[0] + "\n{broken\n")
    result = run("-k", "test_regression")
    result.stdout.fnmatch_lines(["*cpu-nf4.jsonl:2: not valid JSON*"])


def test_a_quantization_is_compared_with_the_one_it_replaces(golden_project):
    """docs/guides/quantization.md: int8 -> nf4 directly, int8 as the reference precision; nf4's accepted outputs
    record their figures against int8, and the regression gate compares those."""
    pytester, run = golden_project
    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_top1=0.0, max_mean_kl=50)"))
    direct = ("--infergate-reference-precision=int8", "--infergate-precisions=nf4", "--infergate-json=out.json")
    result = run(*direct, "-k", "test_quality")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*quality PASS*nf4 vs int8 (4 samples*"])
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"] if r["kind"] == "quality"]
    assert record["precision"] == "nf4" and record["reference_precision"] == "int8"
    run(*direct, "-k", "test_regression", "--infergate-update-golden").assert_outcomes(passed=1)
    (path,) = (pytester.path / "golden").rglob("cpu-nf4.jsonl")
    assert json.loads(path.read_text().splitlines()[0])["figures_against"] == "int8"
    again = run(*direct, "-k", "test_regression")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*golden PASS*nf4: 0 of 4 outputs changed*judged quality against the reference*"])


# ---- the regression gate: drift vs near-ties, headers, batch invariance ------------------------------------------

CHAT = ["capital?", "def f():", "春天", "hello there", "count to ten", "what is 2+2", "tell me a story", "json please"]
REGRESSION_FILE = """
import os

import torch


def test_regression(infergate_golden, infergate_model):
    scale = float(os.environ.get("INFERGATE_TEST_NOISE", "0"))
    if scale:  # a deliberately changed model: noise on one layer's weights (seeded, relative to their spread)
        weight = infergate_model.model.model.layers[0].mlp.down_proj.weight
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(1))
        weight.data += scale * weight.data.std() * noise
    infergate_golden.check_regression()


def test_batch_invariance(infergate_golden):
    tokens = os.environ.get("INFERGATE_TEST_TOKENS")
    infergate_golden.check_batch_invariance(policy={"max_batch_variant_share": 1},
                                            max_new_tokens=int(tokens) if tokens else None)
"""


@pytest.fixture
def chat_project(pytester, cache_dir):
    golden = pytester.mkdir("golden")
    samples = [{"id": f"q{i}", "category": "chat", "messages": [{"role": "user", "content": text}],
                "max_new_tokens": 24} for i, text in enumerate(CHAT)]
    (golden / "chat.jsonl").write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in samples) + "\n")
    pytester.makepyfile(test_gate=REGRESSION_FILE)

    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32", "-p", "no:cacheprovider", *args)

    run("-k", "test_regression", "--infergate-update-golden").assert_outcomes(passed=1)
    (path,) = (pytester.path / "golden").rglob("cpu-fp32.jsonl")
    return pytester, run, path


def test_changed_model_fails_as_drift_and_numerics_pass_as_near_ties(chat_project, monkeypatch):
    pytester, run, path = chat_project
    header = json.loads(path.read_text().splitlines()[0])
    # schema 2 on: what the outputs depend on is the header's key (the machine, the change under test)
    assert header["schema_version"] == 3 and not {"environment", "method", "compositions"} & set(header)
    machine, under_test = header["key"]["machine"], header["key"]["under_test"]
    assert machine["threads"] >= 1 and "cpu_flags" in machine and machine["device"] == "cpu"
    assert under_test["method"]["scoring"].startswith("alone") and under_test["precision"] == "fp32"
    assert under_test["torch"] and under_test["compositions"]

    same = run("-k", "test_regression")  # the same model, unchanged
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*golden PASS*fp32: 0 of 8 outputs changed, 0 drift, 0 near-ties*"])
    assert "not run as asked" not in same.stdout.str() and "InfergateWarning" not in same.stdout.str()

    monkeypatch.setenv("INFERGATE_TEST_NOISE", "0.3")  # a changed model
    drift = run("-k", "test_regression")
    drift.assert_outcomes(failed=1)
    drift.stdout.fnmatch_lines(["*8 of 8 golden outputs of fp32 changed: 8 drift, 0 near-ties*",
                                "*drift in 8 of 8 outputs (100.0%), policy max_drift_share 0*",
                                "*drift (changed beyond numerics):*", "*q0 [[]chat[]] DRIFT (margin *",
                                "*accepted: *", "*current: *", "*and 3 more: q5, q6, q7*"])

    # last-bit-sized numerics (as on another CPU): tokens flip where the model was undecided, the accepted
    # continuation keeps its distribution; a tolerance for this toy model's flat distributions
    monkeypatch.setenv("INFERGATE_TEST_NOISE", "0.01")
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    fp32: max_accepted_kl=0.003\n")
    ties = run("-k", "test_regression")
    ties.assert_outcomes(passed=1)
    ties.stdout.fnmatch_lines(["*golden PASS*fp32: 3 of 8 outputs changed, 0 drift, 3 near-ties (near-ties: q0 "
                               "margin 0.*"])

    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    fp32: max_accepted_kl=0.003, exact=1\n")
    exact = run("-k", "test_regression")
    exact.assert_outcomes(failed=1)
    exact.stdout.fnmatch_lines(["*exact=1: 3 of 8 outputs changed (3 of them near-ties)*",
                                "*near-ties (numerics at a tie; they pass unless exact=1): q0 (token *, margin *"])


def test_header_from_another_environment_warns_and_fails_under_same_environment(chat_project):
    pytester, run, path = chat_project
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["key"]["machine"]["cpu_flags"] = ["sve"]  # no flag list of an x86 machine
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    warned = run("-k", "test_regression", "--infergate-json=out.json")
    warned.assert_outcomes(passed=1)
    warned.stdout.fnmatch_lines(["*InfergateWarning: *test_regression*recorded in another environment*cpu_flags: "
                                 "accepted [[]'sve'[]], now *"])
    results = json.loads((pytester.path / "out.json").read_text())
    # said, not counted: the gate decided (its record keeps the mismatch); one reason per thing in the verdict
    assert not any("cpu_flags" in w for w in results["warnings"]) and results["verdict"] == "pass"
    (record,) = [r for r in results["records"] if r["kind"] == "golden"]
    assert record["environment_mismatch"][0].startswith("cpu_flags")

    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    *: same_environment=1\n")
    failed = run("-k", "test_regression")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*same_environment=1: the accepted outputs were recorded in another environment: "
                                 "cpu_flags*"])


def test_accepted_files_are_kept_per_machine(chat_project):
    """Files accepted on another kernel path stay; this machine's outputs are accepted beside them and compared."""
    pytester, run, default = chat_project
    lines = default.read_text().splitlines()
    header = json.loads(lines[0])
    header["key"]["machine"]["kernels"] = {"torch_cpu_capability": "ELSEWHERE"}
    elsewhere = json.loads(lines[1])  # outputs of the other kernel path differ in a token
    elsewhere["token_ids"][0] = (elsewhere["token_ids"][0] + 1) % 200 + 3
    default.write_text("\n".join([json.dumps(header), json.dumps(elsewhere)] + lines[2:]) + "\n")
    accepted_elsewhere = default.read_text()

    fallback = run("-k", "test_regression", "--infergate-json=out.json")
    fallback.stdout.fnmatch_lines(["*InfergateWarning: *recorded in another environment*kernels: accepted*ELSEWHERE*"
                                   "--infergate-update-golden*picks the file by machine*"])
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"] if r["kind"] == "golden"]
    assert record["path"] == str(default) and len(record["changed"]) == 1

    update = run("-k", "test_regression", "--infergate-update-golden")
    update.assert_outcomes(passed=1)
    update.stdout.fnmatch_lines(["*a file for this machine, beside cpu-fp32.jsonl*"])
    assert default.read_text() == accepted_elsewhere, "the other kernel path's file was overwritten"
    (tagged,) = default.parent.glob("cpu-fp32.*.jsonl")
    assert re.fullmatch(r"cpu-fp32\.[a-z0-9-]+-[0-9a-f]{8}\.jsonl", tagged.name)

    matched = run("-k", "test_regression", "--infergate-json=out.json")
    matched.assert_outcomes(passed=1)
    matched.stdout.fnmatch_lines(["*golden PASS*fp32: 0 of 8 outputs changed*"])
    said = matched.stdout.str()
    assert "not run as asked" not in said and "recorded in another environment" not in said
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"] if r["kind"] == "golden"]
    assert record["path"] == str(tagged)

    run("-k", "test_regression", "--infergate-update-golden").assert_outcomes(passed=1)
    assert set(default.parent.glob("cpu-fp32*.jsonl")) == {default, tagged}, "an update added a second tag"


def test_drift_against_another_machine_is_inconclusive_where_the_policy_says_it_cannot_be_told(chat_project,
                                                                                               monkeypatch):
    """gate_other_machine=0 (the quantized precisions' default) on a precision with no figures against a reference
    (here fp32, made to travel): drift against a file accepted on another CPU model is neither a pass nor a failure
    but inconclusive, naming what to do, and a failure under --infergate-strict; against this machine's own file
    the same drift fails. (With figures, tests/test_golden_travel.py: the figures decide.)"""
    pytester, run, path = chat_project
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    fp32: gate_other_machine=0\n")
    monkeypatch.setenv("INFERGATE_TEST_NOISE", "0.3")  # a changed model: drift
    here = run("-k", "test_regression")
    here.assert_outcomes(failed=1)
    here.stdout.fnmatch_lines(["*drift in 8 of 8 outputs (100.0%), policy max_drift_share 0*"])

    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["key"]["machine"]["cpu"] = "Another CPU model"  # the same kernel path, another machine
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    elsewhere = run("-k", "test_regression", "--infergate-json=out.json")
    elsewhere.assert_outcomes(passed=1)
    elsewhere.stdout.fnmatch_lines(["*golden INCONCLUSIVE fp32: 8 of 8 outputs changed, 8 drift*",
                                    "*inconclusive: drift in 8 of 8 outputs*against outputs accepted on another "
                                    "machine*--infergate-update-golden*"])
    elsewhere.stdout.fnmatch_lines(["*INCONCLUSIVE golden gate *test_regression*: drift in 8 of 8 outputs (100.0%) "
                                    "against outputs accepted on another machine (Another CPU model; *"])
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"] if r["kind"] == "golden"]
    assert record["status"] == "inconclusive" and "gate_other_machine=0" in record["undecided"][0]
    assert record["path"] == str(path), "the file of the same kernel path is the one compared"

    strict = run("-k", "test_regression", "--infergate-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*8 of 8 golden outputs of fp32 changed: 8 drift*",
                                 "*against outputs accepted on another machine (Another CPU model*"])

    monkeypatch.setenv("INFERGATE_TEST_NOISE", "0")
    unchanged_model = run("-k", "test_regression")  # no drift: nothing to decide, it passes
    unchanged_model.assert_outcomes(passed=1)
    unchanged_model.stdout.fnmatch_lines(["*golden PASS*fp32: 0 of 8 outputs changed*"])


def test_batch_invariance_is_recorded_and_summarized(chat_project):
    pytester, run, _ = chat_project
    result = run("-k", "test_batch_invariance", "--infergate-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*batch invariance PASS  fp32: * of 8 samples change with the batch (*; batch KL *"])
    results = json.loads((pytester.path / "out.json").read_text())
    (record,) = [r for r in results["records"] if r["kind"] == "batch_invariance"]
    assert record["policy"] == {"max_batch_variant_share": 1.0} and len(record["samples"]) == 8
    assert [v["name"] for v in record["variants"]] == ["batch", "rotated"]


def test_batch_invariance_on_the_first_tokens_is_said(chat_project, monkeypatch):
    pytester, run, _ = chat_project
    monkeypatch.setenv("INFERGATE_TEST_TOKENS", "6")
    result = run("-k", "test_batch_invariance", "--infergate-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*batch invariance PASS  fp32: * of 8 samples change with the batch (*first 6 tokens"])
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"]
                 if r["kind"] == "batch_invariance"]
    assert record["max_new_tokens"] == 6
    monkeypatch.setenv("INFERGATE_TEST_TOKENS", "0")
    bad = run("-k", "test_batch_invariance")
    bad.assert_outcomes(failed=1)
    bad.stdout.fnmatch_lines(["*check_batch_invariance(max_new_tokens=0): give a whole number of tokens >= 1*"])


def test_new_weights_are_gated_against_the_accepted_outputs_of_the_weights_before(chat_project, monkeypatch):
    pytester, run, path = chat_project
    # the accepted release was another model fingerprint: its folder beside the one this model's outputs would take
    before = path.parent.parent / "0123456789abcdef"
    path.parent.rename(before)
    same = run("-k", "test_regression", "--infergate-json=out.json", "--infergate-report=out.html")
    same.assert_outcomes(passed=1)
    (record,) = [r for r in json.loads((pytester.path / "out.json").read_text())["records"] if r["kind"] == "golden"]
    assert record["path"].startswith(str(before)) and record["compared"] == 8
    assert record["environment_mismatch"][0].startswith(f"model fingerprint 0123456789abcdef → {path.parent.name}")
    # a pass across a model change says so (issue #44): terminal, JSON, report
    assert record["status"] == "pass" and record["model_change"].startswith("model fingerprint 0123456789abcdef →")
    same.stdout.fnmatch_lines(["*golden PASS*fp32*", "*across a model change: model fingerprint 0123456789abcdef → *"
                               "compared with the accepted outputs of the weights before these*"])
    assert "model fingerprint 0123456789abcdef →" in (pytester.path / "out.html").read_text()
    monkeypatch.setenv("INFERGATE_TEST_NOISE", "0.3")  # new weights whose outputs moved: drift, naming the change
    drift = run("-k", "test_regression")
    drift.assert_outcomes(failed=1)
    drift.stdout.fnmatch_lines(["*8 of 8 golden outputs of fp32 changed: 8 drift*"])
    assert "model fingerprint 0123456789abcdef →" in drift.stdout.str()


def test_the_built_in_set_notice_is_said_until_the_project_accepts_outputs(pytester, cache_dir):
    """A project on the built-in sample set is told to copy it while it has accepted nothing; once its golden folder
    holds accepted outputs of that set, it has adopted it and the notice is not said again."""
    pytester.makepyfile(test_gate="def test_regression(infergate_golden):\n"
                                  "    infergate_golden.check_regression(limit=2)\n")

    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32", "-p", "no:cacheprovider", *args)

    first = run("--infergate-update-golden")
    first.assert_outcomes(passed=1)
    assert "golden samples: using the built-in 48-sample set" in first.stdout.str()
    assert list((pytester.path / "golden").rglob("cpu-fp32.jsonl"))
    again = run()
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*golden PASS*fp32: 0 of 2 outputs changed*"])
    assert "built-in 48-sample set" not in again.stdout.str()
