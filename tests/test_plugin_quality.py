"""Golden-sample gates through pytest, on tiny-random-llama with a small sample set."""

import json

import pytest

SAMPLES = [
    {"id": f"q{i}", "category": cat, "messages": [{"role": "user", "content": text}], "max_new_tokens": 10,
     "expected": ["zzz-never"] if i == 0 else []}
    for i, (cat, text) in enumerate([("factual", "capital?"), ("code", "def f():"), ("multilingual", "春天"),
                                     ("chat", "hello there")])
]

TEST_FILE = """
import pytest

{marker}
def test_quality(infergate_golden):
    infergate_golden.check()

def test_regression(infergate_golden):
    infergate_golden.check_regression()
"""


@pytest.fixture
def project(pytester, cache_dir):
    golden = pytester.mkdir("golden")
    (golden / "mine.jsonl").write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in SAMPLES) + "\n")

    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32,nf4", "-p", "no:cacheprovider", *args)

    return pytester, run


def test_policy_pass_and_fail_with_worst_samples(project):
    pytester, run = project
    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_top1=0.0, max_mean_kl=50)"))
    result = run("-k", "test_quality")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*quality PASS*nf4 vs fp32 (4 samples*rougeL*mean_kl*"])

    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_exact_match=1.0, max_mean_kl=0)"))
    result = run("-k", "test_quality")
    result.assert_outcomes(passed=1, failed=1)  # fp32 against itself passes
    result.stdout.fnmatch_lines(["*quality of nf4 vs fp32 breaks the policy*", "*min_exact_match: exact_match = *",
                                 "*max_mean_kl: mean_kl = *", "*worst samples:*", "*first divergence at token*"])


def test_unknown_quality_key_fails_collection(project):
    pytester, run = project
    pytester.makepyfile(TEST_FILE.format(marker="@pytest.mark.infergate_quality(min_rougel=0.5)"))
    result = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown quality key 'min_rougel'*"])


def test_ini_policy_per_precision(project):
    pytester, run = project
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    nf4: min_exact_match=1.0\n")
    pytester.makepyfile(TEST_FILE.format(marker=""))
    run("-k", "test_quality").assert_outcomes(passed=1, failed=1)


def test_golden_regression_lifecycle(project):
    pytester, run = project
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
    result = run("-k", "test_regression")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1 of 4 golden outputs of nf4 changed*",
                                 f"*{tampered['id']}*first divergence at token 0*"])

    path.write_text(lines[0] + "\n{broken\n")
    result = run("-k", "test_regression")
    result.stdout.fnmatch_lines(["*cpu-nf4.jsonl:2: not valid JSON*"])
