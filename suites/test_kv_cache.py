"""KV cache on vs off (guide, example 1 and pitfall 1): is `use_cache=True` faster than recomputing the prefix,
does the gap grow with the generation length and with the prompt length, and does the cache cost the memory
the config says (2 x layers x kv_heads x head_dim x bytes per token)?"""

import torch

from pytest_infergate.engine import Engine, Request
from pytest_infergate.workloads import chat_prompt_with_length


def _one_request(tokenizer, prompt_tokens: int, max_new: int) -> list[Request]:
    text = chat_prompt_with_length(tokenizer, prompt_tokens, "Continue the text above.")
    return [Request(messages=[{"role": "user", "content": text}], max_new_tokens=max_new, ignore_eos=True)]


def _speedups(infergate_bench, engine_config, tokenizer, points, experiment):
    speedups = {}
    for prompt_tokens, max_new in points:
        requests = _one_request(tokenizer, prompt_tokens, max_new)
        tags = {"experiment": experiment, "max_new_tokens": max_new, "prompt_tokens": prompt_tokens}
        measured = {}
        for mode in ("paged", "none"):
            m = infergate_bench(requests, engine_config(cache_mode=mode, batching="sequential"), warmup=1, repeats=1,
                                label=f"{experiment}-{mode}-p{prompt_tokens}-n{max_new}", tags=tags)
            measured[mode] = m.value("tokens_per_s")
        speedups[(prompt_tokens, max_new)] = measured["paged"] / measured["none"]
    return speedups


CACHE_MODES = "the KV cache on/off experiment (cache_mode 'paged' against 'none')"


def test_cache_speedup_grows_with_generation_length(reference_only, needs_engine, infergate_bench, infergate_tokenizer,
                                                     engine_config, kv_lengths, record_property):
    needs_engine(CACHE_MODES)
    lengths = kv_lengths
    speedups = _speedups(infergate_bench, engine_config, infergate_tokenizer, [(32, n) for n in lengths],
                         "kv-cache-length")
    for (_, n), s in speedups.items():
        record_property(f"kv_speedup_max_new_{n}", round(s, 2))
    ordered = [speedups[(32, n)] for n in lengths]
    assert all(s > 1.0 for s in ordered), f"use_cache=True was not faster than recomputing: {ordered}"
    assert ordered[-1] > ordered[0], f"the KV cache gain did not grow with max_new_tokens: {ordered}"


def test_cache_speedup_grows_with_prompt_length(reference_only, needs_engine, infergate_bench, infergate_tokenizer,
                                                engine_config, record_property):
    needs_engine(CACHE_MODES)
    prompts, max_new = (32, 128, 256), 8  # 8 new tokens: recomputing a 256-token prompt for each is the cost
    speedups = _speedups(infergate_bench, engine_config, infergate_tokenizer, [(p, max_new) for p in prompts],
                         "kv-cache-prompt")
    ordered = [speedups[(p, max_new)] for p in prompts]
    for p, s in zip(prompts, ordered):
        record_property(f"kv_speedup_prompt_{p}", round(s, 2))
    assert ordered[-1] > ordered[0], f"the KV cache gain did not grow with the prompt length: {ordered}"


def test_kv_bytes_per_token_measured_vs_config(infergate_model, infergate_tokenizer, needs_engine, record_property):
    """Measured from the model's own transformers cache after a forward, against the formula and the engine."""
    needs_engine("the engine's KV cache sizing")
    model = infergate_model.model
    tokens = 64
    ids = torch.full((1, tokens), infergate_tokenizer.eos_token_id or 1, device=model.device)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    measured_per_token = measured / tokens
    with Engine(model, infergate_tokenizer) as engine:
        computed = engine.kv_bytes_per_token
    record_property("kv_bytes_per_token_measured", measured_per_token)
    record_property("kv_bytes_per_token_config", computed)
    assert measured_per_token == computed, (measured_per_token, computed)
