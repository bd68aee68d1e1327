"""Golden verdicts decided by quality against what was accepted (quality.travel), through pytest on tiny-random-llama:
the accepted file records nf4's figures against fp32. On this machine, and with every accepted file claiming another
machine, nf4's changed tokens are listed and its figures against fp32, compared with the accepted ones, decide."""

import json
import re

import pytest

CHAT = ["capital?", "def f():", "春天", "hello there", "count to ten", "what is 2+2", "tell me a story", "json please",
        "name a fruit", "why is the sky blue", "say hi", "one two three"]
CATEGORIES = ["chat", "code", "factual"]

TEST_FILE = """
import os

import torch


def test_regression(infergate_golden, infergate_model, infergate_precision):
    change = os.environ.get("INFERGATE_TEST_CHANGE", "")
    if change and infergate_precision != "fp32":  # only the candidate changes; the reference stays as it was
        mlp = infergate_model.model.model.layers[0].mlp
        generator = torch.Generator().manual_seed(1)
        if change == "numerics":  # last-bit-sized noise on one layer's output, as another CPU's kernels give
            mlp.register_forward_hook(lambda module, args, out: out * (1 + 1e-4 * torch.randn(
                out.shape, generator=generator)))
        else:  # a broken quantization: the first layer's MLP contributes nothing
            mlp.register_forward_hook(lambda module, args, out: torch.zeros_like(out))
    infergate_golden.check_regression()
"""


@pytest.fixture
def travel_project(pytester, cache_dir):
    golden = pytester.mkdir("golden")
    samples = [{"id": f"q{i}", "category": CATEGORIES[i % 3], "messages": [{"role": "user", "content": text}],
                "max_new_tokens": 16} for i, text in enumerate(CHAT)]
    (golden / "chat.jsonl").write_text("\n".join(json.dumps(s, ensure_ascii=False) for s in samples) + "\n")
    pytester.makepyfile(test_gate=TEST_FILE)

    def run(*args):
        return pytester.runpytest("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                  "--infergate-precisions=fp32,nf4", "-p", "no:cacheprovider",
                                  "--infergate-json=out.json", *args)

    run("--infergate-update-golden").assert_outcomes(passed=2)
    (fp32,) = golden.rglob("cpu-fp32.jsonl")
    (nf4,) = golden.rglob("cpu-nf4.jsonl")
    return pytester, run, fp32, nf4


def golden_records(pytester) -> dict[str, dict]:
    results = json.loads((pytester.path / "out.json").read_text())
    return {r["precision"]: r for r in results["records"] if r["kind"] == "golden"}


def claim_another_machine(path) -> None:
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["key"]["machine"]["cpu"] = "Another CPU model"
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")


def test_quality_decides_on_a_machine_the_outputs_were_not_accepted_on(travel_project, monkeypatch):
    pytester, run, fp32, nf4 = travel_project
    header, *lines = [json.loads(line) for line in nf4.read_text().splitlines()]
    assert header["schema_version"] == 3 and header["figures_against"] == "fp32"
    assert all(set(line["figures"]) == {"top1", "mean_kl", "task", "reference_task"} for line in lines)
    assert "figures" not in json.loads(fp32.read_text().splitlines()[1])  # the reference has none
    for path in (fp32, nf4):
        claim_another_machine(path)

    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "numerics")
    numerics = run()
    numerics.assert_outcomes(passed=2)
    records = golden_records(pytester)
    assert records["nf4"]["status"] == "pass", records["nf4"]
    assert records["nf4"]["decided_by"].startswith("quality against the reference, this machine's vs as accepted in "
                                                   "cpu-nf4.jsonl (tokens compared with another machine's: Another "
                                                   "CPU model")
    assert "top1 " in records["nf4"]["travel"] and "mean_kl " in records["nf4"]["travel"]
    assert records["fp32"]["decided_by"].startswith("token for token against another machine")
    numerics.stdout.fnmatch_lines(["*golden PASS*nf4: * of 12 outputs changed*; judged quality against the "
                                   "reference, this machine's vs as accepted in cpu-nf4.jsonl*"])

    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "broken")
    broken = run()
    broken.assert_outcomes(passed=1, failed=1)
    (why,) = golden_records(pytester)["nf4"]["problems"]
    assert "quality against the reference fell beyond the margins" in why
    assert "categories that fell most: " in why and "samples: q" in why
    broken.stdout.fnmatch_lines(["*quality against the reference fell beyond the margins*"])


def test_an_inconclusive_golden_check_names_the_action_that_decides_it(travel_project, monkeypatch):
    """Accepted on another machine by an older pytest-infergate (no figures) and drifted: inconclusive, naming
    --infergate-update-golden; taking the action and rerunning decides (this machine's file, token for token)."""
    pytester, run, fp32, nf4 = travel_project
    header, *lines = nf4.read_text().splitlines()
    header = json.loads(header)
    header.pop("figures_against")
    header["schema_version"] = 2
    header["key"]["machine"]["cpu"] = "Another CPU model"
    stripped = [json.dumps({k: v for k, v in json.loads(line).items() if k != "figures"}) for line in lines]
    nf4.write_text("\n".join([json.dumps(header)] + stripped) + "\n")
    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "broken")
    undecided = run("-k", "nf4")
    undecided.assert_outcomes(passed=1)
    (why,) = golden_records(pytester)["nf4"]["undecided"]
    assert "records no quality figures" in why and "--infergate-update-golden" in why
    undecided.stdout.fnmatch_lines(["*infergate verdict: INCONCLUSIVE*"])

    run("-k", "nf4", "--infergate-update-golden").assert_outcomes(passed=1)  # the action
    decided = run("-k", "nf4")
    decided.assert_outcomes(passed=1)
    record = golden_records(pytester)["nf4"]
    assert record["status"] == "pass" and record["undecided"] == []
    assert re.fullmatch(r"quality against the reference, this run's vs as accepted in cpu-nf4\.[\w-]+\.jsonl "
                        r"\(changed tokens listed\)", record["decided_by"]), record["decided_by"]  # this machine's
    decided.stdout.fnmatch_lines(["*infergate verdict: PASS*"])


def test_on_this_machine_quality_decides_and_exact_restores_the_token_rule(travel_project, monkeypatch):
    """Issue #55 point 3, on the machine that accepted the outputs: last-bit noise that changes nf4's tokens passes
    with the changes listed (quality against fp32 as accepted); a broken first MLP fails naming the figures; under
    `exact=1` the same noise fails token for token. fp32, the reference, keeps its tokens deciding."""
    pytester, run, fp32, nf4 = travel_project
    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "numerics")
    numerics = run()
    numerics.assert_outcomes(passed=2)
    records = golden_records(pytester)
    changed = records["nf4"]["changed"]
    assert changed, "the noise changed no nf4 output: the test would prove nothing"
    assert records["nf4"]["status"] == "pass" and records["nf4"]["problems"] == []
    assert records["nf4"]["decided_by"] == ("quality against the reference, this run's vs as accepted in "
                                            "cpu-nf4.jsonl (changed tokens listed)")
    assert "top1 " in records["nf4"]["travel"] and "≤ margin" in records["nf4"]["travel"]
    assert records["fp32"]["decided_by"] == "token for token against this machine's accepted outputs"
    numerics.stdout.fnmatch_lines([f"*golden PASS*nf4: {len(changed)} of 12 outputs changed*; judged quality against "
                                   "the reference, this run's vs as accepted in cpu-nf4.jsonl*"])

    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "broken")
    broken = run("-k", "nf4")
    broken.assert_outcomes(failed=1)
    (why,) = golden_records(pytester)["nf4"]["problems"]
    assert why.startswith("quality against the reference fell beyond the margins compared with those accepted with "
                          "the outputs: top1 ")
    assert "> margin 0.05" in why and "categories that fell most: " in why
    broken.stdout.fnmatch_lines(["*golden outputs of nf4 changed*", "*quality against the reference fell beyond the "
                                 "margins compared with those accepted with the outputs: top1 *"])

    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "numerics")
    pytester.makeini("[pytest]\ninfergate_quality_policy =\n    nf4: exact=1\n")
    exact = run("-k", "nf4")
    exact.assert_outcomes(failed=1)
    record = golden_records(pytester)["nf4"]
    assert record["decided_by"] == "token for token against this machine's accepted outputs"
    assert record["problems"][0].startswith(f"exact=1: {len(changed)} of 12 outputs changed")


def test_a_file_accepted_before_figures_were_stored_keeps_the_token_rule_and_says_so(travel_project, monkeypatch):
    pytester, run, fp32, nf4 = travel_project
    header, *lines = nf4.read_text().splitlines()
    header = json.loads(header)
    header.pop("figures_against")
    stripped = [json.dumps({k: v for k, v in json.loads(line).items() if k != "figures"}) for line in lines]
    nf4.write_text("\n".join([json.dumps(header)] + stripped) + "\n")
    monkeypatch.setenv("INFERGATE_TEST_CHANGE", "broken")
    result = run("-k", "nf4")
    result.assert_outcomes(failed=1)
    record = golden_records(pytester)["nf4"]
    said = "cpu-nf4.jsonl was accepted before quality figures were stored: its tokens decide until its outputs are " \
           "accepted again with --infergate-update-golden"
    assert record["decided_by"] == f"token for token against this machine's accepted outputs ({said})"
    assert record["problems"][0].startswith("drift in ") and record["problems"][0].endswith(said)
    result.stdout.fnmatch_lines([f"*{said}*"])
