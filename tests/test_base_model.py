"""A base model, as teams bring them (issue #44): a tokenizer without a chat template. The built-in workloads and
the golden samples reach it as plain text built from the same content, and the run says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_infergate.workloads.request import Request, plain_text, render_prompt

BASE_RUN = """
import pytest

from pytest_infergate.engine import EngineConfig

def test_speed(infergate_bench):
    m = infergate_bench(config=EngineConfig(max_model_len=512), repeats=1, warmup=0)
    assert m.num_requests > 0 and m.num_failed == 0

# tiny-random-llama's random weights: int8 agrees with fp32 at top-1 ~0.88, below the 8-bit default (0.9)
@pytest.mark.infergate_quality(min_top1=0.5, max_mean_kl=0.5)
def test_quality(infergate_golden):
    infergate_golden.check(limit=4)
"""


def test_chat_messages_reach_a_base_model_as_a_plain_transcript():
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": " Capital of France? "},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    assert plain_text(messages) == ("Answer briefly.\n\nUser: Capital of France?\n\nAssistant: Paris.\n\n"
                                    "User: And of Italy?\n\nAssistant:")

    class BaseTokenizer:  # what transformers gives for a tokenizer without a chat template
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(c) for c in text]}

    ids = render_prompt(BaseTokenizer(), Request(messages=messages[1:2]))
    assert "".join(map(chr, ids)) == "User: Capital of France?\n\nAssistant:"


@pytest.fixture
def base_model(tiny_source, tmp_path) -> Path:
    """tiny-random-llama saved without its chat template: a base model of our own (seeded)."""
    own = tmp_path / "tiny-base"
    shutil.copytree(tiny_source.path, own, ignore=shutil.ignore_patterns("chat_template.jinja", "infergate-meta.json"))
    config = json.loads((own / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (own / "tokenizer_config.json").write_text(json.dumps(config))
    return own


@pytest.mark.slow
def test_a_base_model_runs_the_default_workload_and_the_golden_samples_as_plain_text(pytester, base_model,
                                                                                   cache_dir):
    pytester.makepyfile(BASE_RUN)
    result = pytester.runpytest_subprocess(f"--infergate-model={base_model}", f"--infergate-cache-dir={cache_dir}",
                                           "--infergate-precisions=fp32,int8", "-p", "no:cacheprovider",
                                           "--infergate-json=out.json")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert "base model: prompts sent as plain text (the tokenizer has no chat template)" in out
    assert "golden samples: using the built-in 48-sample set" in out + result.stderr.str()
    records = json.loads((pytester.path / "out.json").read_text())
    assert all(m["plain_text_prompts"] for m in records["models"].values())
    decided = {(r["kind"], r["precision"]) for r in records["records"] if r["status"] in ("pass", "fail")}
    assert {("perf", "fp32"), ("perf", "int8"), ("quality", "int8")} <= decided


CHAT_ONLY = """
import pytest

@pytest.mark.infergate_chat
def test_tool_calls(infergate_bench):
    pass

def test_transcript_is_fine():
    pass
"""


def test_a_test_that_needs_chat_fails_at_collection_on_a_base_model_naming_it(pytester, base_model, cache_dir):
    """Issue #44: a workload marked as needing the chat template is refused before any model loads on a base
    model (its tokenizer has none), naming the test and the way out; on a chat model it is collected as usual."""
    pytester.makepyfile(CHAT_ONLY)
    result = pytester.runpytest_subprocess(f"--infergate-model={base_model}", f"--infergate-cache-dir={cache_dir}",
                                           "-p", "no:cacheprovider")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + err
    assert ("test_a_test_that_needs_chat_fails_at_collection_on_a_base_model_naming_it.py::test_tool_calls: marked "
            "infergate_chat (its workload needs the model's chat template), but the tokenizer of ") in err
    assert "has no chat template (a base model)" in err and "drop the marker to accept the transcript" in err
    assert "test_transcript_is_fine" not in err
    chat = pytester.runpytest_subprocess("--infergate-model=tiny-random-llama", f"--infergate-cache-dir={cache_dir}",
                                         "-p", "no:cacheprovider", "--collect-only", "-q")
    assert chat.ret == pytest.ExitCode.OK and "test_tool_calls" in chat.stdout.str()


SPEED_GATE = """
import pytest
from pytest_infergate.engine import EngineConfig

@pytest.mark.infergate_budget(max_regression=5.0)
def test_speed(infergate_bench):
    infergate_bench(config=EngineConfig(max_model_len=512), repeats=3, warmup=0)
"""


def test_a_baseline_of_another_model_is_a_model_change_in_the_verdict(pytester, base_model, cache_dir):
    """Issue #45: a baseline saved on tiny-random-llama, run against another model (our base model's folder): the
    run's verdict says the model changed, on a pass; under --infergate-strict the comparison is made only with
    --infergate-allow-model-change."""
    pytester.makepyfile(SPEED_GATE)
    common = [f"--infergate-cache-dir={cache_dir}", "--infergate-precisions=fp32", "-p", "no:cacheprovider"]
    saved = pytester.runpytest_subprocess("--infergate-model=tiny-random-llama", "--infergate-save-baseline=b.json",
                                          *common)
    assert saved.ret == 0, saved.stdout.str()[-2000:]
    changed = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json", *common)
    out = changed.stdout.str()
    assert changed.ret == 0, out[-3000:]
    # said in the verdict's reasons: as its own line on a pass, inside the gate's line when a busy runner (this
    # machine under a test run) left the comparison inconclusive
    verdict = out[out.index("gates: perf:"):]
    said = ("PASS model change test_a_baseline_of_another_model_is_a_model_change_in_the_verdict.py::test_speed"
            "[fp32]: compared with a baseline of another model: model_name tiny-random-llama → tiny-base")
    assert said in verdict or "against a baseline of another model: model_name tiny-random-llama → tiny-base" in \
        verdict, verdict
    strict = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json",
                                           "--infergate-strict", *common)
    assert strict.ret == 1 and "compared only with --infergate-allow-model-change" in strict.stdout.str()
    assert "tokens_per_s baseline" not in strict.stdout.str()  # not compared
    allowed = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json",
                                            "--infergate-strict", "--infergate-allow-model-change", *common)
    shown = allowed.stdout.str()
    assert "tokens_per_s baseline" in shown and "compared only with" not in shown, shown[-3000:]
