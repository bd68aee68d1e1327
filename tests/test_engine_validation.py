"""Every Request and EngineConfig field is checked where it is given (type, finite, range), and a request that
cannot be served ends with its reason without stopping the engine."""

import math

import pytest
from engine_helpers import PROMPTS, messages

from pytest_infergate.engine import Engine, EngineConfig, FinishReason, Request, runner
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import RequestError


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_new_tokens=2.5), r"Request.max_new_tokens must be at least 1 \(an int\), got 2.5 \(float\)"),
    (dict(max_new_tokens="5"), r"Request.max_new_tokens must be at least 1 \(an int\), got '5' \(str\)"),
    (dict(max_new_tokens=True), r"Request.max_new_tokens .* got True \(bool\)"),
    (dict(max_new_tokens=0), r"Request.max_new_tokens must be at least 1 \(an int\), got 0"),
    (dict(temperature=math.nan), r"Request.temperature \(0 is greedy\) must be a finite number >= 0, got nan"),
    (dict(temperature=math.inf), r"Request.temperature .* finite number >= 0, got inf"),
    (dict(temperature=-0.5), r"Request.temperature .* got -0.5"),
    (dict(temperature="hot"), r"Request.temperature .* got 'hot' \(str\)"),
    (dict(top_p=0), r"Request.top_p must be a finite number > 0 and <= 1, got 0"),
    (dict(top_p=1.5), r"Request.top_p must be a finite number > 0 and <= 1, got 1.5"),
    (dict(top_p=math.nan), r"Request.top_p .* got nan"),
    (dict(top_k=-1), r"Request.top_k \(0 disables it\) must be an int >= 0, got -1"),
    (dict(top_k=2.0), r"Request.top_k .* got 2.0 \(float\)"),
    (dict(seed=-3), r"Request.seed must be an int >= 0 or None, got -3"),
    (dict(seed="7"), r"Request.seed .* got '7' \(str\)"),
    (dict(deadline_s=0), r"Request.deadline_s must be a finite number > 0 or None, got 0"),
    (dict(deadline_s=math.inf), r"Request.deadline_s .* got inf"),
    (dict(arrival_s=-1), r"Request.arrival_s must be a finite number >= 0, got -1"),
    (dict(arrival_s=math.nan), r"Request.arrival_s .* got nan"),
    (dict(stop_token_ids=(1, "2")), r"Request.stop_token_ids must hold token ids \(ints\), got '2' \(str\)"),
    (dict(stop_token_ids=5), r"Request.stop_token_ids must be a list of token ids"),
    (dict(stop_strings="\n"), r"Request.stop_strings must be a list of strings, got the string"),
    (dict(stop_strings=("",)), r"Request.stop_strings must hold non-empty strings"),
    (dict(ignore_eos=1), r"Request.ignore_eos must be True or False, got 1 \(int\)"),
    (dict(request_id=7), r"Request.request_id must be a string or None, got 7 \(int\)"),
    (dict(metadata=[]), r"Request.metadata must be a dict"),
    (dict(prompt=None, prompt_token_ids=[1, 2.0]), r"Request.prompt_token_ids must hold token ids"),
    (dict(prompt=None, messages=[{"role": "user", "content": "hi"}, {"content": "no role"}]),
     r"Request.messages\[1\] has no 'role': each chat message needs 'role' and 'content'"),
    (dict(prompt=None, messages=[{"role": "user"}]), r"Request.messages\[0\] has no 'content'"),
    (dict(prompt=None, messages=["hello"]), r"Request.messages\[0\] must be a dict with 'role' and 'content'"),
    (dict(prompt=None, messages={"role": "user"}), r"Request.messages must be a list of chat messages"),
])
def test_bad_request_fields_name_the_field_value_and_range(kwargs, message):
    with pytest.raises(RequestError, match=message):
        Request(**{"prompt": "x", **kwargs})


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_size=3.5), r"EngineConfig.block_size must be positive \(an int >= 1\), got 3.5 \(float\)"),
    (dict(max_batch_size="8"), r"EngineConfig.max_batch_size must be positive \(an int >= 1\), got '8' \(str\)"),
    (dict(max_batch_size=0), r"EngineConfig.max_batch_size must be positive \(an int >= 1\), got 0"),
    (dict(max_batched_tokens=True), r"EngineConfig.max_batched_tokens .* got True \(bool\)"),
    (dict(prefill_chunk_size=-4), r"EngineConfig.prefill_chunk_size must be positive"),
    (dict(kv_budget_bytes=1.5e9), r"EngineConfig.kv_budget_bytes must be positive \(an int >= 1\) or None, got"),
    (dict(kv_budget_blocks=0), r"EngineConfig.kv_budget_blocks must be positive .* or None, got 0"),
    (dict(max_model_len="2048"), r"EngineConfig.max_model_len .* got '2048' \(str\)"),
    (dict(max_input_tokens=-1), r"EngineConfig.max_input_tokens .* got -1"),
    (dict(max_new_tokens_limit=2.5), r"EngineConfig.max_new_tokens_limit .* got 2.5 \(float\)"),
    (dict(max_queue_len=0), r"EngineConfig.max_queue_len .* got 0"),
    (dict(max_length_spread=1.0), r"EngineConfig.max_length_spread .* got 1.0 \(float\)"),
    (dict(window_ms=math.nan), r"EngineConfig.window_ms must be a finite number >= 0, got nan"),
    (dict(window_ms=-1), r"EngineConfig.window_ms must be a finite number >= 0, got -1"),
    (dict(window_ms="20"), r"EngineConfig.window_ms .* got '20' \(str\)"),
    (dict(truncate_input="yes"), r"EngineConfig.truncate_input must be True or False, got 'yes' \(str\)"),
    (dict(prefix_caching=1), r"EngineConfig.prefix_caching must be True or False, got 1 \(int\)"),
    (dict(length_bucketing=None), r"EngineConfig.length_bucketing must be True or False"),
    (dict(record_steps=0), r"EngineConfig.record_steps must be True or False"),
    (dict(schedule_by_tokens="no"), r"EngineConfig.schedule_by_tokens must be True or False"),
    (dict(cache_mode="flat"), r"EngineConfig.cache_mode 'flat': choose from paged, contiguous, none"),
])
def test_bad_engine_config_fields_name_the_field_value_and_range(kwargs, message):
    with pytest.raises(OptionError, match=message):
        EngineConfig(**kwargs)


def test_good_values_are_normalised():
    import numpy as np

    request = Request(prompt_token_ids=np.array([5, 6]), max_new_tokens=np.int64(3), temperature=1, top_p=1)
    assert request.prompt_token_ids == [5, 6] and type(request.max_new_tokens) is int
    assert type(request.temperature) is float
    assert EngineConfig(window_ms=5).window_ms == 5.0


def test_a_request_whose_sampling_fails_ends_failed_and_the_engine_goes_on(tiny_fp32, monkeypatch):
    real = runner.sample_row

    def fails_for_seed_13(logits, request, generator):
        if request.seed == 13:
            raise ValueError("the model's logits are not finite (nan/inf)")
        return real(logits, request, generator)

    monkeypatch.setattr(runner, "sample_row", fails_for_seed_13)
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=256)) as engine:
        bad = Request(prompt="Once", max_new_tokens=8, temperature=1.0, seed=13)
        good = Request(prompt="Once", max_new_tokens=8, temperature=1.0, seed=14, ignore_eos=True)
        greedy = Request(messages=messages(PROMPTS[0]), max_new_tokens=4)
        results = engine.generate([bad, good, greedy])
        assert results[0].finish_reason is FinishReason.FAILED
        assert "sampling failed: the model's logits are not finite" in results[0].reason
        assert results[1].ok and results[1].num_output_tokens == 8 and results[2].ok
        engine.check_drained()
        assert engine.generate([Request(messages=messages(PROMPTS[1]), max_new_tokens=3)])[0].ok


def check_a_bad_request_in_a_batch_leaves_the_engine_as_it_was(tiny_fp32):
    # issue #32 row 15: the good requests before the bad one were queued and ran in the next generate()
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=64)) as engine:
        good = Request(prompt_token_ids=[5] * 8, max_new_tokens=2, request_id="kept")
        too_long = Request(prompt_token_ids=[5] * 80, max_new_tokens=2)
        with pytest.raises(RequestError, match=r"request 1: prompt has 80 tokens.*nothing of this generate\(\) call "
                                               r"was queued"):
            engine.generate([good, too_long])
        assert not engine.has_unfinished and engine.result("kept") is None
        duplicate = Request(prompt_token_ids=[6] * 8, max_new_tokens=2, request_id="kept")
        with pytest.raises(RequestError, match="request 1: request id 'kept' is already in use"):
            engine.generate([good, duplicate])
        (result,) = engine.generate([good])  # the id was never taken: re-sent, it runs once
        assert result.ok and not engine.has_unfinished


def test_automatic_request_ids_never_collide_with_user_ids(tiny_fp32):
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=256)) as engine:
        user = engine.submit(Request(prompt="a", max_new_tokens=1, request_id="req-1"))
        automatic = [engine.submit(Request(prompt="b", max_new_tokens=1)) for _ in range(3)]
        assert user == "req-1" and "req-1" not in automatic and len(set(automatic)) == 3
        engine.run_until_done()
        with pytest.raises(RequestError, match="request id 'req-1' is already in use"):
            engine.submit(Request(prompt="c", max_new_tokens=1, request_id="req-1"))
        assert all(engine.result(i).ok for i in [user, *automatic])


def test_a_prompt_over_the_context_names_max_model_len(tiny_fp32):
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=64)) as engine:
        with pytest.raises(RequestError, match=r"prompt has 80 tokens, over the context window of 64 \(max_model_len"
                                               r".*EngineConfig\(truncate_input=True\)"):
            engine.submit(Request(prompt_token_ids=[5] * 80))
