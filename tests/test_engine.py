import pytest
import torch
from engine_helpers import PROMPTS, hf_greedy, messages

from pytest_infergate.engine import Engine, EngineConfig, FinishReason, Request
from pytest_infergate.engine.config import BATCHING_MODES, CACHE_MODES
from pytest_infergate.engine.engine import UnsupportedModelError
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import RequestError

MAX_NEW = 20


@pytest.fixture(scope="module")
def tiny_reference(tiny_fp32):
    return hf_greedy(tiny_fp32, PROMPTS, MAX_NEW)


def requests(prompts=PROMPTS, max_new=MAX_NEW, **kw):
    return [Request(messages=messages(p), max_new_tokens=max_new, **kw) for p in prompts]


def make_engine(loaded, **kw):
    kw.setdefault("max_model_len", 1024)
    if "kv_budget_blocks" not in kw:
        kw.setdefault("kv_budget_bytes", 64 << 20)
    return Engine(loaded.model, loaded.tokenizer, EngineConfig(**kw))


@pytest.mark.parametrize("cache_mode", CACHE_MODES)
@pytest.mark.parametrize("batching", BATCHING_MODES)
def test_greedy_equals_generate(tiny_fp32, tiny_reference, cache_mode, batching):
    with make_engine(tiny_fp32, cache_mode=cache_mode, batching=batching, max_batch_size=5,
                     prefill_chunk_size=8) as engine:
        results = engine.generate(requests())
        assert [r.token_ids for r in results] == tiny_reference
        engine.check_drained()


@pytest.mark.parametrize("decode_group_size", [1, 3, 64])
def test_decode_groups_of_any_size_are_exact(tiny_fp32, tiny_reference, decode_group_size):
    """64: every decoding sequence in one attention call per layer (the CUDA default), padded to the longest."""
    with make_engine(tiny_fp32, decode_group_size=decode_group_size, prefill_chunk_size=8) as engine:
        assert engine.runner.decode_group_size == decode_group_size
        assert [r.token_ids for r in engine.generate(requests())] == tiny_reference


def test_output_does_not_depend_on_batch_neighbours(tiny_fp32):
    target = Request(messages=messages(PROMPTS[3]), max_new_tokens=MAX_NEW)
    with make_engine(tiny_fp32) as engine:
        alone = engine.generate([target])[0].token_ids
        for others in (PROMPTS[:2], PROMPTS[5:12]):
            batch = requests(others, max_new=7) + [Request(messages=messages(PROMPTS[3]), max_new_tokens=MAX_NEW)]
            assert engine.generate(batch)[-1].token_ids == alone


def test_chunked_prefill_is_exact_and_respects_token_budget(tiny_fp32, tiny_reference):
    with make_engine(tiny_fp32, prefill_chunk_size=4, max_batched_tokens=16) as engine:
        results = engine.generate(requests())
        assert [r.token_ids for r in results] == tiny_reference
        assert max(s.num_prefill_tokens + s.num_decode_tokens for s in engine.steps) <= 16
        assert any(s.num_prefill_tokens and s.num_decode_tokens for s in engine.steps), "prefill and decode never mixed"


def test_prefix_caching_reuses_shared_prompts_exactly(tiny_fp32):
    shared = "You are a careful assistant who answers briefly. " * 4
    prompts = [shared + p for p in PROMPTS[:10]]
    reference = hf_greedy(tiny_fp32, prompts, MAX_NEW)
    with make_engine(tiny_fp32, prefix_caching=True, max_batch_size=3, prefill_chunk_size=32) as engine:
        results = engine.generate(requests(prompts))
        assert [r.token_ids for r in results] == reference
        assert results[0].num_cached_tokens == 0
        assert all(r.num_cached_tokens >= 16 * (len(shared) // 16 - 2) for r in results[3:]), \
            [r.num_cached_tokens for r in results]
        engine.check_drained()
        again = engine.generate(requests(prompts[:2]))  # the whole prompts are cached now, but for the last block
        assert [r.token_ids for r in again] == reference[:2]
        assert all(r.num_cached_tokens > r.num_prompt_tokens - 2 * 16 for r in again)
        engine.reset_prefix_cache()
        assert engine.generate(requests(prompts[:1]))[0].num_cached_tokens == 0
        engine.check_drained()


def test_prefix_caching_needs_the_paged_cache_and_continuous_batching():
    with pytest.raises(OptionError, match="prefix_caching needs cache_mode='paged' and continuous or sequential"):
        EngineConfig(prefix_caching=True, batching="static")
    with pytest.raises(OptionError, match="prefix_caching needs"):
        EngineConfig(prefix_caching=True, cache_mode="contiguous")


def test_kv_exhaustion_preempts_and_loses_nothing(tiny_fp32, tiny_reference):
    # 16 blocks of 16 tokens: far less than 16 requests need at once
    with make_engine(tiny_fp32, kv_budget_blocks=16, block_size=16, max_model_len=256) as engine:
        results = engine.generate(requests())
        assert [r.token_ids for r in results] == tiny_reference
        assert sum(r.num_preemptions for r in results) > 0
        assert max(s.kv_blocks_used for s in engine.steps) <= 16
        engine.check_drained()


def test_prefills_that_exhaust_the_blocks_preempt_instead_of_stalling(tiny_fp32, tiny_reference):
    # chunks of 8 prompt tokens side by side take every block before any sequence decodes: the newest must give
    # its blocks back (and be recomputed), or no sequence could ever move again
    with make_engine(tiny_fp32, kv_budget_blocks=16, block_size=16, max_model_len=256, prefill_chunk_size=8,
                     max_batch_size=16) as engine:
        results = engine.generate(requests())
        assert [r.token_ids for r in results] == tiny_reference
        assert sum(r.num_preemptions for r in results) > 0
        engine.check_drained()


def test_kv_budget_that_cannot_hold_one_sequence(tiny_fp32):
    with pytest.raises(OptionError, match=r"KV budget holds 32 tokens.*max_model_len = 1024"):
        make_engine(tiny_fp32, kv_budget_blocks=2, block_size=16)


def test_kv_bytes_per_token_from_config(tiny_fp32):
    with make_engine(tiny_fp32) as engine:
        # 2 (K, V) x 2 layers x 2 kv heads x 16 head dim x 4 bytes
        assert engine.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
        assert engine.kv_allocated_bytes == engine.blocks.num_blocks * 16 * engine.kv_bytes_per_token


def test_contiguous_reserves_whole_length_paged_grows(tiny_fp32):
    request = Request(prompt_token_ids=[5] * 10, max_new_tokens=100, ignore_eos=True)
    for mode, expected in (("contiguous", 7), ("paged", 1)):  # ceil(110 / 16) vs ceil(10 / 16)
        with make_engine(tiny_fp32, cache_mode=mode, block_size=16) as engine:
            engine.submit(request)
            engine.step()
            assert engine.blocks.num_used_blocks == expected, mode
            engine.run_until_done()
            engine.check_drained()


def test_stream_yields_the_same_tokens(tiny_fp32, tiny_reference):
    with make_engine(tiny_fp32) as engine:
        stream = engine.stream(Request(messages=messages(PROMPTS[0]), max_new_tokens=MAX_NEW))
        chunks = []
        try:
            while True:
                chunks.append(next(stream))
        except StopIteration as stop:
            result = stop.value
        assert [c.token_id for c in chunks] == tiny_reference[0] == result.token_ids
        assert "".join(c.text for c in chunks) == result.text


def test_sampling_is_reproducible_with_a_seed(tiny_fp32):
    with make_engine(tiny_fp32) as engine:
        def run(seed):
            req = Request(prompt="Once upon a time", max_new_tokens=16, temperature=1.0, top_p=0.9, top_k=50,
                          seed=seed, ignore_eos=True)
            return engine.generate([req])[0].token_ids

        assert run(1) == run(1)
        assert run(1) != run(2)


def test_timings_and_step_metrics(tiny_fp32):
    with make_engine(tiny_fp32) as engine:
        results = engine.generate(requests(PROMPTS[:4], max_new=8, ignore_eos=True))
        for r in results:
            t = r.timings
            assert 0 <= t.queue_wait_s <= t.ttft_s <= t.e2e_s
            assert len(t.token_times) == 8 and len(t.itl_s) == 7 and t.tpot_s > 0
        total_decode = sum(s.num_decode_tokens for s in engine.steps)
        total_prefill = sum(s.num_prefill_tokens for s in engine.steps)
        assert total_decode == 4 * 7
        assert total_prefill == sum(r.num_prompt_tokens for r in results)
        assert all(0 < s.forward_s <= s.step_s for s in engine.steps)


def test_static_batching_counts_padding_and_riders(tiny_fp32):
    reqs = [Request(prompt_token_ids=[7] * 10, max_new_tokens=2, ignore_eos=True),
            Request(prompt_token_ids=[7] * 30, max_new_tokens=10, ignore_eos=True)]
    with make_engine(tiny_fp32, batching="static", max_batch_size=2) as engine:
        engine.generate(reqs)
        assert engine.steps[0].num_padding_tokens == 20  # short prompt padded to the long one
        riders = sum(s.num_padding_tokens for s in engine.steps[1:])
        assert riders == 10 - 2  # the finished row rides along for the remaining decode steps
    with make_engine(tiny_fp32, batching="continuous") as engine:
        engine.generate(reqs)
        assert sum(s.num_padding_tokens for s in engine.steps) == 0


def test_length_bucketing_groups_similar_prompts(tiny_fp32):
    lengths = [10, 200, 12, 190, 11, 210]
    reqs = [Request(prompt_token_ids=[9] * n, max_new_tokens=2, ignore_eos=True) for n in lengths]
    waste = {}
    for bucketing in (False, True):
        with make_engine(tiny_fp32, batching="static", max_batch_size=3, length_bucketing=bucketing) as engine:
            engine.generate(reqs)
            waste[bucketing] = sum(s.num_padding_tokens for s in engine.steps)
    assert waste[True] < waste[False] / 4


def test_limits_reject_truncate_clamp(tiny_fp32):
    with make_engine(tiny_fp32, max_input_tokens=20, max_new_tokens_limit=5, max_queue_len=2) as engine:
        long_id = engine.submit(Request(prompt_token_ids=[5] * 30, max_new_tokens=3))
        assert engine.result(long_id).finish_reason is FinishReason.REJECTED
        assert "max_input_tokens is 20" in engine.result(long_id).reason
        a = engine.submit(Request(prompt_token_ids=[5] * 3, max_new_tokens=50, ignore_eos=True))
        engine.submit(Request(prompt_token_ids=[5] * 3, max_new_tokens=1))
        full = engine.submit(Request(prompt_token_ids=[5] * 3, max_new_tokens=1))
        assert engine.result(full).finish_reason is FinishReason.REJECTED and "queue full" in engine.result(full).reason
        engine.run_until_done()
        assert engine.result(a).num_output_tokens == 5 and engine.result(a).finish_reason is FinishReason.LENGTH
    with make_engine(tiny_fp32, max_input_tokens=20, truncate_input=True) as engine:
        rid = engine.submit(Request(prompt_token_ids=list(range(3, 33)), max_new_tokens=1))
        engine.run_until_done()
        assert engine.result(rid).prompt_token_ids == list(range(13, 33))


def test_deadline_and_cancel(tiny_fp32):
    with make_engine(tiny_fp32, max_batch_size=1) as engine:
        slow = engine.submit(Request(prompt_token_ids=[5] * 3, max_new_tokens=200, ignore_eos=True, deadline_s=0.05))
        victim = engine.submit(Request(prompt_token_ids=[5] * 3, max_new_tokens=200, ignore_eos=True))
        engine.step()
        engine.cancel(victim)
        engine.run_until_done()
        assert engine.result(slow).finish_reason is FinishReason.TIMED_OUT
        assert engine.result(victim).finish_reason is FinishReason.CANCELLED
        engine.check_drained()


def test_stop_strings_and_tokens(tiny_fp32, tiny_reference):
    first = tiny_reference[0]
    with make_engine(tiny_fp32) as engine:
        r = engine.generate([Request(messages=messages(PROMPTS[0]), max_new_tokens=MAX_NEW,
                                     stop_token_ids=(first[2],))])[0]
        assert r.finish_reason is FinishReason.STOP and r.token_ids == first[:first.index(first[2]) + 1]


def test_bad_requests_are_clear_errors_and_engine_keeps_serving(tiny_fp32):
    with make_engine(tiny_fp32) as engine:
        with pytest.raises(RequestError, match="prompt is empty"):
            engine.submit(Request(prompt=""))
        with pytest.raises(RequestError, match="max_new_tokens must be at least 1"):
            Request(prompt="x", max_new_tokens=0)
        with pytest.raises(RequestError, match="outside the vocabulary"):
            engine.submit(Request(prompt="x", stop_token_ids=(10**9,)))
        with pytest.raises(RequestError, match="over the context window of 1024"):
            engine.submit(Request(prompt_token_ids=[5] * 2000))
        with pytest.raises(RequestError, match="exactly one of"):
            Request(prompt="x", prompt_token_ids=[1])
        assert engine.generate(requests(PROMPTS[:1], max_new=3))[0].ok


def test_bad_engine_config_names_the_field():
    with pytest.raises(OptionError, match=r"EngineConfig.batching 'greedy': choose from sequential, static"):
        EngineConfig(batching="greedy")
    with pytest.raises(OptionError, match="EngineConfig.max_batch_size must be positive"):
        EngineConfig(max_batch_size=0)


def test_unsupported_model_family_is_named(tiny_source):
    from pytest_infergate.models.load import load_model

    loaded = load_model(tiny_source, "fp32")
    for layer in loaded.model.model.layers:  # attention that never reaches the attention interface
        layer.self_attn.forward = lambda hidden_states, *a, **k: (torch.zeros_like(hidden_states), None)
    with pytest.raises(UnsupportedModelError, match="model family 'llama' does not call transformers' attention"):
        Engine(loaded.model, loaded.tokenizer, EngineConfig(max_model_len=256))


def test_close_restores_attention(tiny_fp32):
    before = tiny_fp32.model.config._attn_implementation
    with make_engine(tiny_fp32):
        assert tiny_fp32.model.config._attn_implementation == "infergate_paged"
    assert tiny_fp32.model.config._attn_implementation == before


def test_out_of_memory_halves_the_batch_and_continues(tiny_fp32, tiny_reference, monkeypatch):
    with make_engine(tiny_fp32, max_batch_size=8) as engine:
        real = engine.runner.forward
        calls = {"n": 0}

        def flaky(plan):
            calls["n"] += 1
            if calls["n"] == 3 and len(plan.chunks) > 1:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return real(plan)

        monkeypatch.setattr(engine.runner, "forward", flaky)
        results = engine.generate(requests(PROMPTS[:8]))
        assert [r.token_ids for r in results] == tiny_reference[:8]
        assert [e.kind for e in engine.events] == ["oom-halved-batch"]
        assert engine.config.max_batch_size == 4
        engine.check_drained()


def test_overlapping_engines_restore_attention_in_any_order(tiny_fp32):
    before = tiny_fp32.model.config._attn_implementation
    first, second = make_engine(tiny_fp32), make_engine(tiny_fp32, cache_mode="contiguous")
    first.close()
    assert tiny_fp32.model.config._attn_implementation == "infergate_paged"  # the second is still running
    assert second.generate(requests(PROMPTS[:1], max_new=2))[0].ok
    second.close()
    second.close()  # closing twice is harmless
    assert tiny_fp32.model.config._attn_implementation == before
