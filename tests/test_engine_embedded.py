"""The engine against `model.generate` on the real embedded model (fp32): token-identical greedy outputs."""

import pytest
from engine_helpers import PROMPTS, hf_greedy, messages

from pytest_infergate.engine import Engine, EngineConfig, Request

pytestmark = pytest.mark.embedded
MAX_NEW = 32


@pytest.fixture(scope="module")
def reference(smollm2_fp32):
    return hf_greedy(smollm2_fp32, PROMPTS, MAX_NEW)


@pytest.mark.parametrize("cache_mode,batching,prefix_caching", [
    ("paged", "continuous", False), ("paged", "static", False), ("paged", "dynamic", False),
    ("paged", "sequential", False), ("contiguous", "continuous", False), ("none", "continuous", False),
    ("paged", "continuous", True),
])
def test_embedded_greedy_equals_generate(smollm2_fp32, reference, cache_mode, batching, prefix_caching):
    config = EngineConfig(cache_mode=cache_mode, batching=batching, max_batch_size=8, prefill_chunk_size=32,
                          max_model_len=1024, kv_budget_bytes=256 << 20, prefix_caching=prefix_caching)
    # without a KV cache every step recomputes the whole sequence: a quarter of the prompts shows it token-identical
    prompts = PROMPTS[:len(PROMPTS) // 4] if cache_mode == "none" else PROMPTS
    with Engine(smollm2_fp32.model, smollm2_fp32.tokenizer, config) as engine:
        results = engine.generate([Request(messages=messages(p), max_new_tokens=MAX_NEW) for p in prompts])
        mismatches = [(p, r.text) for p, r, ref in zip(prompts, results, reference) if r.token_ids != ref]
        assert not mismatches
        if prefix_caching:  # the chat template's system prompt is shared by every request
            assert sum(r.num_cached_tokens > 0 for r in results) >= len(PROMPTS) - 8
        engine.check_drained()
    assert "Paris" in results[0].text


def test_embedded_int8_quality_against_fp32(smollm2_fp32):
    """A few golden samples: int8 drifts from fp32 a little, measurably, and keeps the answers' gist."""

    from pytest_infergate.models import load_model
    from pytest_infergate.quality.golden_files import BUILTIN_SAMPLE_SET, load_samples
    from pytest_infergate.quality.golden_generation import generate_golden_outputs as generate
    from pytest_infergate.quality.scoring import compare_precision

    samples = load_samples(BUILTIN_SAMPLE_SET)[:6]
    int8 = load_model(smollm2_fp32.source, "int8", tokenizer=smollm2_fp32.tokenizer)
    result = compare_precision(smollm2_fp32, int8, samples, generate(smollm2_fp32, samples),
                                    generate(int8, samples))
    summary = result.summary
    assert 0 < summary["mean_kl"] < 0.2
    assert summary["top1"] > 0.8
    assert summary["task_ratio"] >= 0.8
    assert not result.flags


def test_embedded_int8_with_changed_norms_is_not_refused_by_the_self_check(smollm2_fp32):
    """benchmarks/quality_power.py's change (every input_layernorm weight x (1 + 0.01·N(0, 1)), seed 2) moves
    LLM.int8's outlier columns so that the engine's packed probe and the model's own forward differed by 0.62 of
    the logit scale (tolerance 0.25): the engine refused the model. The self-check compares them without the
    outlier columns (self_check.without_outlier_columns): equal."""
    import torch

    from pytest_infergate.engine.backends import choose_backend
    from pytest_infergate.models import load_model

    int8 = load_model(smollm2_fp32.source, "int8", tokenizer=smollm2_fp32.tokenizer)
    generator = torch.Generator().manual_seed(2)
    for layer in int8.model.model.layers:
        weight = layer.input_layernorm.weight
        weight.data = weight.data * (1 + 0.01 * torch.randn(weight.shape, generator=generator))
    choice = choose_backend(int8.model, int8.tokenizer)
    assert (choice.name, choice.reason) == ("engine", "")
    with Engine(int8.model, int8.tokenizer, EngineConfig(cache_mode="none", batching="sequential")) as engine:
        assert engine.self_check.max_diff <= 1e-3 * engine.self_check.logit_scale
