"""KV cache on vs off (guide, example 1 and pitfall 1): is `use_cache=True` faster than recomputing the prefix,
does the gap grow with the generation length and with the prompt length, and does the cache cost the memory
the config says (2 x layers x kv_heads x head_dim x bytes per token)?"""

import torch

from pytest_infergate.engine import Engine, Request
from pytest_infergate.perf import Claim, Speedup, faster, grows
from pytest_infergate.workloads import chat_prompt_with_length


def _one_request(tokenizer, prompt_tokens: int, max_new: int) -> list[Request]:
    text = chat_prompt_with_length(tokenizer, prompt_tokens, "Continue the text above.")
    return [Request(messages=[{"role": "user", "content": text}], max_new_tokens=max_new, ignore_eos=True)]


# Rounds of each point, cache on and off step-locked. A single pair of timings swung from 1.5x to 10.5x on a loaded
# 2-core VM, and even step-locked rounds there spread from x2.5 to x13.7 (a stall of seconds hits one side's step):
# only an interval can tell. The no-cache side costs quadratically in max_new_tokens: with 3 rounds of every
# point this file took 15 min of that VM, so the 16/32/64 experiment takes 2 (its interval is then the two
# rounds' range). An interval that cannot decide is a warning, not a failure.
PROMPT_ROUNDS, LENGTH_ROUNDS = 3, 2


def _speedups(infergate_bench, engine_config, tokenizer, points, experiment, rounds: int,
              metric: str = "tokens_per_s") -> dict:
    """The speedup of the paged KV cache over recomputing ('none') at each (prompt_tokens, max_new) point."""
    speedups = {}
    for prompt_tokens, max_new in points:
        tags = {"experiment": experiment, "max_new_tokens": max_new, "prompt_tokens": prompt_tokens}
        name = f"{experiment}-p{prompt_tokens}-n{max_new}"
        speedups[(prompt_tokens, max_new)] = infergate_bench.speedup(
            _one_request(tokenizer, prompt_tokens, max_new), engine_config(cache_mode="paged", batching="sequential"),
            engine_config(cache_mode="none", batching="sequential"), labels=(f"{name}-paged", f"{name}-none"),
            name=f"paged over none at {prompt_tokens}+{max_new} tokens", rounds=rounds, metric=metric, tags=tags)
    return speedups


def _record(record_property, prefix: str, s: Speedup) -> None:
    record_property(prefix, round(s.ratio, 2))
    record_property(f"{prefix}_ci", [round(s.low, 2), round(s.high, 2)])


def _growth(record_property, suite_device: str, ordered: list[Speedup]) -> list[Claim]:
    """The claim that the gap grows, where it is one. On the CPU recomputing the prefix is compute-bound, so its
    cost (and the cache's gain) grows with the context. On a GPU, at these lengths, it is bound by the per-step
    launch overhead instead: on an H200 (random-llama-0.5b, fp16) recomputing took 24-33 ms a token from 32 to 256
    prompt tokens, flat, and the speedup went from x7.84 (95% CI 6.48-8.09) to x6.16 (5.92-6.30). There the growth
    is recorded (`kv_speedup_growth`), not claimed; that the cache is faster at every point still is."""
    growth = grows(ordered[0], ordered[-1])
    record_property("kv_speedup_growth", growth.describe())
    return [growth] if suite_device == "cpu" else []


CACHE_MODES = "the KV cache on/off experiment (cache_mode 'paged' against 'none')"


def test_cache_speedup_grows_with_generation_length(reference_only, needs_engine, infergate_bench, infergate_tokenizer,
                                                     engine_config, kv_lengths, suite_device, record_property):
    needs_engine(CACHE_MODES)
    speedups = _speedups(infergate_bench, engine_config, infergate_tokenizer, [(32, n) for n in kv_lengths],
                         "kv-cache-length", LENGTH_ROUNDS)
    ordered = [speedups[(32, n)] for n in kv_lengths]
    for n, s in zip(kv_lengths, ordered):
        _record(record_property, f"kv_speedup_max_new_{n}", s)
    infergate_bench.conclude("KV cache on vs off over max_new_tokens",
                             [faster(s) for s in ordered] + _growth(record_property, suite_device, ordered))


def test_cache_speedup_grows_with_prompt_length(reference_only, needs_engine, infergate_bench, infergate_tokenizer,
                                                engine_config, suite_device, record_property):
    needs_engine(CACHE_MODES)
    prompts, max_new = (32, 128, 256), 8  # 8 new tokens: recomputing a 256-token prompt for each is the cost
    # decided on the decode steps (TPOT), where the cache acts: tokens/s also counts the prefill, which costs both
    # modes the same. Under a CPU hog the tokens/s speedup fell from x7.6 (95% CI 6.8-7.8) at 32 tokens to x3.6
    # (3.0-5.6) at 256 on the 2-core VM, step-locked: the load reshapes what a prefill costs, not the cache's gain
    speedups = _speedups(infergate_bench, engine_config, infergate_tokenizer, [(p, max_new) for p in prompts],
                         "kv-cache-prompt", PROMPT_ROUNDS, metric="tpot_ms")
    ordered = [speedups[(p, max_new)] for p in prompts]
    for p, s in zip(prompts, ordered):
        _record(record_property, f"kv_speedup_prompt_{p}", s)
    # claimed faster where recomputing the prompt is the cost (x14 and x4 at 128 and 256 tokens on a loaded VM);
    # at 32 tokens the gap is small (x1.75 there) and the claim is its growth
    claimed = ordered if suite_device == "cuda" else ordered[1:]
    infergate_bench.conclude("KV cache on vs off over the prompt length",
                             [faster(s) for s in claimed] + _growth(record_property, suite_device, ordered))


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
