"""Property tests: whatever arrives, is cancelled or times out, every request ends exactly once and every KV
block comes back."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_infergate.engine import Engine, EngineConfig, FinishReason, Request

request_strategy = st.fixed_dictionaries({
    "prompt_len": st.integers(1, 60),
    "max_new": st.integers(1, 24),
    "deadline_steps": st.one_of(st.none(), st.integers(1, 30)),
    "cancel_at_step": st.one_of(st.none(), st.integers(0, 30)),
    "submit_at_step": st.integers(0, 20),
    "deadline_ms": st.one_of(st.none(), st.floats(0.5, 20.0)),
})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(request_strategy, min_size=1, max_size=12),
       batching=st.sampled_from(["continuous", "static", "dynamic", "sequential"]),
       cache_mode=st.sampled_from(["paged", "contiguous"]),
       kv_blocks=st.integers(6, 24), queue_cap=st.one_of(st.none(), st.integers(1, 6)),
       prefix_caching=st.booleans(), prefill_chunk=st.sampled_from([512, 8]))
def test_every_request_ends_once_and_blocks_return(tiny_fp32, specs, batching, cache_mode, kv_blocks, queue_cap,
                                                   prefix_caching, prefill_chunk):
    # the prompts below share prefixes, so with prefix caching blocks are shared, evicted and preempted too
    prefix_caching = prefix_caching and cache_mode == "paged" and batching in ("continuous", "sequential")
    config = EngineConfig(batching=batching, cache_mode=cache_mode, kv_budget_blocks=kv_blocks, block_size=16,
                          max_model_len=96, max_batch_size=4, max_queue_len=queue_cap, window_ms=0,
                          prefix_caching=prefix_caching, prefill_chunk_size=prefill_chunk)
    engine = Engine(tiny_fp32.model, tiny_fp32.tokenizer, config)
    try:
        submitted: dict[str, dict] = {}
        step = 0
        pending = sorted(range(len(specs)), key=lambda i: specs[i]["submit_at_step"])
        while pending or engine.has_unfinished:
            while pending and specs[pending[0]]["submit_at_step"] <= step:
                spec = specs[pending.pop(0)]
                # "deadline_steps" is a cancellation at a given step; "deadline_ms" a real wall-clock deadline
                rid = engine.submit(Request(prompt_token_ids=[3 + (i % 200) for i in range(spec["prompt_len"])],
                                            max_new_tokens=spec["max_new"], ignore_eos=True,
                                            deadline_s=spec["deadline_ms"] and spec["deadline_ms"] / 1000))
                submitted[rid] = spec
            for rid, spec in submitted.items():
                stop_at = min(x for x in (spec["cancel_at_step"], spec["deadline_steps"], 10**9) if x is not None)
                if step == stop_at and engine.result(rid) is None:
                    engine.cancel(rid)
            engine.step(more_arrivals=bool(pending))
            step += 1
            assert step < 2000, "engine made no progress"
        for rid, spec in submitted.items():
            result = engine.result(rid)
            assert result is not None, f"{rid} never ended"
            assert result.finish_reason in set(FinishReason)
            if result.finish_reason is FinishReason.LENGTH:
                assert result.num_output_tokens == spec["max_new"]
            if result.finish_reason is FinishReason.REJECTED:
                assert "queue full" in result.reason
            if result.finish_reason is FinishReason.TIMED_OUT:
                assert spec["deadline_ms"] is not None
        assert len(engine._results) == len(submitted)
        engine.check_drained()
    finally:
        engine.close()
