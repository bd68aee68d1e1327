"""The model zoo: tiny random models of many families (seeded, built in the test, no download). Each is
token-exact against `model.generate` in every engine mode, or refused at construction with a clear error and
served by the HF generate backend instead.

Modes: sequential and continuous batching; chunked prefill whose chunks split the sliding window (16); prefix
caching with a shared prompt prefix several blocks long; a KV budget so small that requests are preempted and
recomputed. Two families have windows shorter than the prompts on every other layer, one on every layer
(mistral), one has softcapping (gemma2), one attention sinks (gpt-oss), one chunked attention (llama4: a query sees
only its own chunk of 16).
"""

import pytest
import torch
from zoo_models import FAMILIES, WINDOW, build_model, cached_zoo, prompts

from pytest_infergate.engine import (
    Engine,
    EngineConfig,
    Request,
    UnsupportedModelError,
    attention,
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
    """A sliding window or an attention chunk shorter than the prompts."""
    overrides = FAMILIES[name][1]
    return overrides.get("sliding_window") is not None or overrides.get("attention_chunk_size") is not None


def every_layer_slides(name: str) -> bool:
    overrides = FAMILIES[name][1]
    return overrides.get("sliding_window") is not None and "layer_types" not in overrides


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
    """A broken mask: every layer attends to the whole causal prefix, whatever its window or chunk."""
    layout = attention.AttentionBatch.layout
    monkeypatch.setattr(attention.AttentionBatch, "layout", lambda self, window, chunk=None: layout(self, None))


def ignore_sinks(monkeypatch):
    real = attention.masked_softmax_attention
    monkeypatch.setattr(attention, "masked_softmax_attention",
                        lambda q, k, v, mask, causal, scale, softcap, sinks: real(q, k, v, mask, causal, scale,
                                                                                  softcap, None))


@pytest.mark.parametrize("family,breakage,feature", [
    ("gemma2", ignore_softcap, "attention logit softcapping at 50"),
    ("mistral-sliding", ignore_windows, f"sliding window of {WINDOW}"),
    ("gemma3", ignore_windows, f"sliding window of {WINDOW}"),
    ("llama4", ignore_windows, f"config attention_chunk_size={WINDOW}, config layer_types\\[0\\]='chunked_attention'"),
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


LONG = 64  # longer than the self-check's probe reached before it was sized from the config (48 tokens)
WINDOWED = [name for name in EXACT if has_window(name)]


@pytest.mark.parametrize("family", WINDOWED)
def test_the_probe_crosses_every_declared_window_and_chunk(tokenizer, monkeypatch, family):
    """Each family's window or chunk made longer than the old probe (and shorter than max_model_len 96): the
    engine is still exact past it, and a mask that ignores it is refused."""
    key = "attention_chunk_size" if "attention_chunk_size" in FAMILIES[family][1] else "sliding_window"
    model = build_model(family, **{key: LONG})
    prompt = prompts(1, seed=5, lengths=(LONG + 8, LONG + 8))[0]  # the answer runs past the window / chunk
    reference = hf_reference(model, prompt)
    with Engine(model, tokenizer, EngineConfig(**BASE)) as engine:
        assert engine.self_check.window_crossed is True
        assert engine.generate([Request(prompt_token_ids=prompt, max_new_tokens=MAX_NEW)])[0].token_ids == reference
    ignore_windows(monkeypatch)
    with pytest.raises(UnsupportedModelError, match=f"fails the engine's self-check: at layer .*{key}={LONG}"):
        Engine(model, tokenizer, EngineConfig(**BASE))


def hf_reference(model, prompt: list[int]) -> list[int]:
    from zoo_models import hf_greedy_ids

    return hf_greedy_ids(model, [prompt], MAX_NEW)[0]


def test_a_window_longer_than_the_probe_can_reach_is_refused_unless_max_model_len_keeps_under_it(tokenizer):
    model = build_model("mistral-sliding", sliding_window=5000, max_position_embeddings=8192)
    long_context = dict(block_size=16, kv_budget_blocks=400)
    with pytest.raises(UnsupportedModelError, match=r"declares sliding_window=5000: longer than the engine's "
                       r"self-check can probe \(4096 tokens\), while max_model_len 6000 .* "
                       r"Set EngineConfig\(max_model_len=5000\) or less"):
        Engine(model, tokenizer, EngineConfig(max_model_len=6000, **long_context))
    with Engine(model, tokenizer, EngineConfig(max_model_len=5000, **long_context)) as engine:
        assert engine.self_check.window_crossed is False  # no request can outgrow the window: nothing to cross


@pytest.mark.parametrize("changes,named", [
    (dict(attention_window=8), "attention_window=8"),
    (dict(layer_types=["linear_attention", "full_attention"]), "layer_types entry 'linear_attention'"),
    (dict(attention_chunk_size=8), "attention_chunk_size=8 without a 'chunked_attention' entry in layer_types"),
])
def test_a_config_field_that_may_change_attention_and_that_the_engine_does_not_know_is_refused(tokenizer, changes,
                                                                                               named):
    model = build_model("llama", **changes)
    with pytest.raises(UnsupportedModelError, match=f"model family 'llama' declares attention settings the engine "
                       f"does not implement or check: {named}"):
        Engine(model, tokenizer, EngineConfig(**BASE))
    assert model.config._attn_implementation != "infergate_paged"  # never switched


# six layers, two attention patterns (sliding window, full), the first of each at layers 0 and 1
SIX_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
              "sliding_attention"]


@pytest.mark.parametrize("family", ["gemma3", "gpt-oss", "cohere2"])
def test_the_long_probe_runs_one_layer_per_attention_pattern_and_still_catches_a_broken_mask(tokenizer, monkeypatch,
                                                                                            family):
    """Issue #44: the probe past the window runs through the first layer of each distinct pattern only (layers 0
    and 1 of six), the engine stays exact past the window on the whole model, and a mask that ignores the window is
    still refused, by the whole model's check."""
    model = build_model(family, num_hidden_layers=6, layer_types=SIX_LAYERS, sliding_window=LONG)
    prompt = prompts(1, seed=5, lengths=(LONG + 8, LONG + 8))[0]
    reference = hf_reference(model, prompt)
    with Engine(model, tokenizer, EngineConfig(**BASE)) as engine:
        report = engine.self_check
        assert report.long_probe_layers == [0, 1] and report.window_crossed is True
        assert len(engine.layers) == 6  # the engine knows every layer, from the short probe through all of them
        assert engine.generate([Request(prompt_token_ids=prompt, max_new_tokens=MAX_NEW)])[0].token_ids == reference
    assert len(model.model.layers) == 6 and model.config.num_hidden_layers == 6  # put back
    assert model.config.layer_types == SIX_LAYERS
    ignore_windows(monkeypatch)
    with pytest.raises(UnsupportedModelError, match=f"fails the engine's self-check: at layer 0 .*{LONG}"):
        Engine(model, tokenizer, EngineConfig(**BASE))
    assert len(model.model.layers) == 6 and model.config._attn_implementation != "infergate_paged"


def test_a_model_the_cut_probe_cannot_run_is_probed_whole(tokenizer, monkeypatch):
    """Only the whole model's check decides: where the cut model differs (here its config's layer types are
    scrambled, so the model's own masks no longer match its layers) the long probe runs through every layer, and
    the model is accepted when that passes."""
    from contextlib import contextmanager

    from pytest_infergate.engine import self_check

    cut = self_check.only_layers  # self_check's own name for probe.only_layers: what it calls

    @contextmanager
    def scrambled(model, layers):
        with cut(model, layers):
            model.config.layer_types = list(reversed(model.config.layer_types))
            yield

    monkeypatch.setattr(self_check, "only_layers", scrambled)
    model = build_model("gemma3", num_hidden_layers=6, layer_types=SIX_LAYERS, sliding_window=LONG)
    with Engine(model, tokenizer, EngineConfig(**BASE)) as engine:
        assert engine.self_check.long_probe_layers == list(range(6)) and engine.self_check.window_crossed is True
    assert model.config.layer_types == SIX_LAYERS and len(model.model.layers) == 6
