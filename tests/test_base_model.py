"""A base model, as teams bring them (issue #44): a tokenizer without a chat template. The built-in workloads and
the golden samples reach it as plain text built from the same content, and the run says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_infergate.workloads.request import Request, render_prompt
from pytest_infergate.workloads.transcript import (
    answer_end,
    answer_tokens,
    next_turn_markers,
    plain_text,
    transcript_stops,
)

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


class CharTokenizer:
    """A base model's tokenizer (no chat template), one token per character."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


RUN_ON = " Paris.\n\nUser: And of Italy?\n\nAssistant: Rome."  # a base model writing the next turns itself


def test_a_base_models_answer_ends_at_the_next_turn_marker():
    """Issue #55 point 6c: the transcript's next speaker label at the start of a line ends the answer; the tokens
    kept are the longest prefix whose text ends before it."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    assert next_turn_markers(messages) == ("\nAssistant:", "\nUser:")
    assert next_turn_markers([{"role": "tool", "content": "42"}]) == ("\nAssistant:", "\nTool:", "\nUser:")
    assert answer_end(RUN_ON, next_turn_markers(messages)) == len(" Paris.")
    assert answer_end(" Paris. User: not at a line's start", ("\nUser:",)) is None
    decode = CharTokenizer().decode
    ids = [ord(c) for c in RUN_ON]
    assert decode(ids[:answer_tokens(ids, decode, ("\nUser:",))]) == " Paris."
    assert answer_tokens(ids, decode, ()) == len(ids)  # a chat model's answer: its own end of turn ends it
    assert transcript_stops(CharTokenizer(), messages) == next_turn_markers(messages)
    assert transcript_stops(CharTokenizer(), None) == ()

    class ChatTokenizer(CharTokenizer):
        chat_template = "{{ messages }}"

    assert transcript_stops(ChatTokenizer(), messages) == ()


def test_golden_answers_of_a_base_model_stop_at_the_next_turn(monkeypatch):
    """The golden run asks the backend to stop at the markers and cuts what came back before them, tokens and
    log-probabilities too (HF generate, which does not stop, ran on); a chat model's requests carry no stop."""
    from pytest_infergate.quality.golden_files import GoldenSample
    from pytest_infergate.quality.golden_generation import golden_method, golden_requests, run_samples

    sample = GoldenSample("q0", "factual", ({"role": "user", "content": "Capital of France?"},), None, 64)
    asked = []

    class Backend:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def generate(self, requests):
            asked.extend(requests)
            ids = [ord(c) for c in RUN_ON]
            return [SimpleNamespace(prompt_token_ids=[1], token_ids=ids, text=RUN_ON,
                                    top_logprobs=[([i], [0.0]) for i in ids]) for _ in requests]

    loaded = SimpleNamespace(tokenizer=CharTokenizer(), model=None, record=None,
                             backend=SimpleNamespace(build=lambda model, tokenizer, config: Backend()))
    (answer,) = run_samples(loaded, [sample]).outputs
    assert asked[0].stop_strings == ("\nAssistant:", "\nUser:")
    assert answer.text == " Paris." and len(answer.token_ids) == len(answer.top_logprobs) == len(" Paris.")

    class ChatTokenizer(CharTokenizer):
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
            return [1, 2, 3]

    (chat,) = golden_requests([sample], ChatTokenizer(), 2048)
    assert chat.stop_strings == ()
    assert golden_method(plain_text=True)["answer"].startswith("plain-text transcript")
    assert "answer" not in golden_method()  # a chat model's accepted files keep their method


def test_a_base_models_served_answer_is_cut_at_the_next_turn():
    from pytest_infergate.endpoint.client import EndpointResult
    from pytest_infergate.gates.golden_candidates import until_next_turn

    pieces = [" Paris", ".", "\n\n", "User", ":", " And"]
    served = EndpointResult("q0", text="".join(pieces), logprobs=[{"token": p, "logprob": -0.1, "top": {}}
                                                                 for p in pieces])
    cut = until_next_turn(served, ("\nUser:",))
    assert cut.text == " Paris." and [e["token"] for e in cut.logprobs] == [" Paris", "."]
    assert until_next_turn(served, ()) is served


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
    # without the stored comparison's time floor, as the `run` fixture's runs: what the verdict says is checked here
    common = [f"--infergate-cache-dir={cache_dir}", "--infergate-precisions=fp32", "--infergate-min-time=0", "-p",
              "no:cacheprovider"]
    saved = pytester.runpytest_subprocess("--infergate-model=tiny-random-llama", "--infergate-save-baseline=b.json",
                                          *common)
    assert saved.ret == 0, saved.stdout.str()[-2000:]
    changed = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json", *common)
    out = changed.stdout.str()
    assert changed.ret == 0, out[-3000:]
    # said in the verdict's reasons: as its own line on a pass, in the gate's reason ("… since model_name …") when a
    # busy runner (this machine under a test run) left the comparison inconclusive
    verdict = out[out.index("gates: perf:"):]
    said = ("PASS model change test_a_baseline_of_another_model_is_a_model_change_in_the_verdict.py::test_speed"
            "[fp32]: compared with a baseline of another model: model_name tiny-random-llama → tiny-base")
    assert said in verdict or "since model_name tiny-random-llama → tiny-base" in verdict, verdict
    strict = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json",
                                           "--infergate-strict", *common)
    assert strict.ret == 1 and "compared under --infergate-strict only with --infergate-allow-model-change" in \
        strict.stdout.str()
    assert "tokens_per_s baseline" not in strict.stdout.str()  # not compared
    allowed = pytester.runpytest_subprocess(f"--infergate-model={base_model}", "--infergate-baseline=b.json",
                                            "--infergate-strict", "--infergate-allow-model-change", *common)
    shown = allowed.stdout.str()
    assert "tokens_per_s baseline" in shown and "only with --infergate-allow" not in shown, shown[-3000:]
