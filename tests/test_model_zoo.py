"""The model zoo: tiny random models of many families (seeded, built in the test, no download). Each is
token-exact against `model.generate` in every engine mode, or refused at construction with a clear error and
served by the HF generate backend instead.

Modes: sequential and continuous batching; chunked prefill whose chunks split the sliding window (16); prefix
caching with a shared prompt prefix several blocks long; a KV budget so small that requests are preempted and
recomputed. Two families have windows shorter than the prompts on every other layer, one on every layer
(mistral), one has softcapping (gemma2), one attention sinks (gpt-oss).
"""

import pytest
import torch
from zoo_models import FAMILIES, WINDOW, cached_zoo, prompts

from pytest_infergate.engine import (
    Engine,
    EngineConfig,
    Request,
    UnsupportedModelError,
    attention,
    attention_batch,
    make_backend,
)

MAX_NEW = 16  # prompts of 5..60 tokens + 16: every sequence outgrows the window of 16
PROMPTS = prompts()  # 6 prompts of 5..60 tokens, the 4 longest sharing a 20-token prefix
EXACT = [name for name, (_, _, expected) in FAMILIES.items() if expected == "exact"]
REFUSED = [name for name, (_, _, expected) in FAMILIES.items() if expected == "refused"]
BASE = dict(block_size=4, max_model_len=96, kv_budget_blocks=160)
MODES = {
    "sequential": dict(batching="sequential"),
    "continuous": dict(batching="continuous", max_batch_size=6),
    # chunks of 7 tokens: the one covering positions 14..20 splits the window boundary at 16
    "chunked-prefill": dict(prefill_chunk_size=7, max_batched_tokens=10),
    # two at a time, so the later requests find the shared prefix computed by the earlier ones
    "prefix-caching": dict(prefix_caching=True, max_batch_size=2),
    # 24 blocks of 4 tokens for 6 sequences of up to 76 tokens, prefilled 8 tokens at a time side by side: the
    # newest are preempted and recomputed (also where every layer slides and blocks behind the window go back)
    "preemption": dict(kv_budget_blocks=24, prefill_chunk_size=8),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models are all overhead: a second intra-op thread only adds synchronisation (and on a busy machine,
    waiting for a core), so the zoo runs on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(tiny_source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_source.path)  # tiny-random-llama's: byte-level, 259 ids


@pytest.fixture(scope="module")
def zoo():
    return cached_zoo(PROMPTS, MAX_NEW)


def has_window(name: str) -> bool:
    return FAMILIES[name][1].get("sliding_window") is not None


def every_layer_slides(name: str) -> bool:
    return has_window(name) and "layer_types" not in FAMILIES[name][1]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", EXACT)
def test_engine_is_exact(zoo, tokenizer, family, mode):
    model, reference = zoo(family)
    with Engine(model, tokenizer, EngineConfig(**{**BASE, **MODES[mode]})) as engine:
        results = engine.generate([Request(prompt_token_ids=p, max_new_tokens=MAX_NEW) for p in PROMPTS])
        assert [r.token_ids for r in results] == reference
        assert all(r.ok for r in results)
        engine.check_drained()
        assert engine.self_check.max_diff <= engine.self_check.tolerance * engine.self_check.logit_scale
        assert engine.self_check.window_crossed is (True if has_window(family) else None)
        if mode == "chunked-prefill":
            assert max(s.num_prefill_tokens + s.num_decode_tokens for s in engine.steps) <= 10
        if mode == "prefix-caching":
            assert sum(r.num_cached_tokens for r in results) >= 2 * 20  # the last two reuse the whole prefix
        if mode == "preemption":
            assert sum(r.num_preemptions for r in results) > 0
        if mode == "sequential" and every_layer_slides(family):
            # blocks behind the window are given back: 60 + 16 tokens would need 19 blocks of 4
            assert engine.peak_kv_blocks <= WINDOW // 4 + 2


@pytest.mark.parametrize("family", REFUSED)
def test_refused_clearly_and_served_by_hf_generate(zoo, tokenizer, family):
    model, reference = zoo(family)
    model_type = FAMILIES[family][0]
    with pytest.raises(UnsupportedModelError, match=f"model family '{model_type}'.*HF backend") as refused:
        Engine(model, tokenizer, EngineConfig(**BASE))
    assert model.config._attn_implementation != "infergate_paged"  # switched back
    backend, reason = make_backend(model, tokenizer, EngineConfig(**BASE, max_batch_size=3))
    assert backend.name == "hf-generate" and reason == str(refused.value)
    with backend:
        results = backend.generate([Request(prompt_token_ids=p, max_new_tokens=MAX_NEW) for p in PROMPTS])
    assert [r.token_ids for r in results] == reference
    assert all(r.ok and r.timings.ttft_s > 0 for r in results)


def ignore_softcap(monkeypatch):
    monkeypatch.setattr(attention, "softcap_scores", lambda scores, cap: scores)


def ignore_windows(monkeypatch):
    layout = attention_batch.AttentionBatch.layout
    monkeypatch.setattr(attention_batch.AttentionBatch, "layout", lambda self, window: layout(self, None))


def ignore_sinks(monkeypatch):
    real = attention.masked_softmax_attention
    monkeypatch.setattr(attention, "masked_softmax_attention",
                        lambda q, k, v, mask, causal, scale, softcap, sinks: real(q, k, v, mask, causal, scale,
                                                                                  softcap, None))


@pytest.mark.parametrize("family,breakage,feature", [
    ("gemma2", ignore_softcap, "attention logit softcapping at 50"),
    ("mistral-sliding", ignore_windows, f"sliding window of {WINDOW}"),
    ("gemma3", ignore_windows, f"sliding window of {WINDOW}"),
    ("gpt-oss", ignore_sinks, r"attention sinks \(s_aux\)"),
])
def test_a_broken_attention_feature_is_refused_by_the_self_check(zoo, tokenizer, monkeypatch, family, breakage,
                                                                  feature):
    model, _ = zoo(family)
    breakage(monkeypatch)
    model_type = FAMILIES[family][0]
    pattern = (f"model family '{model_type}' .* fails the engine's self-check: at layer 0 .* differs from the "
               f"model's own .* by up to [0-9.e+-]+ .*Suspected feature: .*{feature}")
    with pytest.raises(UnsupportedModelError, match=pattern):
        Engine(model, tokenizer, EngineConfig(**BASE))
    assert model.config._attn_implementation != "infergate_paged"
