"""The HF generate backend (static batches through `model.generate`) and the choice between it and the engine."""

import time

import pytest
import torch
from engine_helpers import PROMPTS, hf_greedy, messages

from pytest_infergate.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    HFGenerateBackend,
    Request,
    UnsupportedModelError,
    engine_only,
    hf_config,
    make_backend,
)
from pytest_infergate.engine.backends import ASKED_FOR_HF, choice_for, choose_backend
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import RequestError

MAX_NEW = 12
STATIC = dict(batching="static", cache_mode="contiguous", max_model_len=256)


@pytest.fixture(scope="module")
def reference(tiny_fp32):
    return hf_greedy(tiny_fp32, PROMPTS[:6], MAX_NEW)


def requests(prompts=PROMPTS[:6], **kw):
    return [Request(messages=messages(p), max_new_tokens=MAX_NEW, **kw) for p in prompts]


@pytest.mark.parametrize("batching,batch", [("static", 4), ("sequential", 1)])
def test_greedy_equals_generate_and_timings_are_recorded(tiny_fp32, reference, batching, batch):
    config = EngineConfig(**{**STATIC, "batching": batching, "max_batch_size": batch})
    with HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, config) as backend:
        results = backend.generate(requests())
        assert [r.token_ids for r in results] == reference
        for r in results:
            t = r.timings
            assert 0 <= t.queue_wait_s <= t.ttft_s <= t.e2e_s
            assert len(t.token_times) == r.num_output_tokens and len(t.itl_s) == r.num_output_tokens - 1
        assert {s.batch_size for s in backend.steps} == ({4, 2} if batch == 4 else {1})
        assert sum(s.num_prefill_tokens for s in backend.steps) == sum(r.num_prompt_tokens for r in results)
        assert backend.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # measured on the model: as the engine counts
        assert backend.peak_kv_blocks > 0 and backend.kv_allocated_bytes > 0
        backend.check_drained()


def test_stop_reasons_match_the_engine(tiny_fp32, reference):
    stop = reference[0][2]
    reqs = [Request(messages=messages(PROMPTS[0]), max_new_tokens=MAX_NEW, stop_token_ids=(stop,)),
            Request(messages=messages(PROMPTS[1]), max_new_tokens=3),
            Request(prompt_token_ids=[5] * 10, max_new_tokens=30, ignore_eos=True)]
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=256)) as engine:
        expected = [(r.finish_reason, r.token_ids) for r in engine.generate(reqs)]
    backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(**STATIC, max_batch_size=3))
    got = [(r.finish_reason, r.token_ids) for r in backend.generate(reqs)]
    assert got == expected
    assert got[0][0] is FinishReason.STOP and got[1][0] is FinishReason.LENGTH


def test_limits_and_arrivals(tiny_fp32):
    config = EngineConfig(**STATIC, max_batch_size=2, max_input_tokens=20, max_new_tokens_limit=4)
    backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, config)
    long, late = Request(prompt_token_ids=[5] * 30, max_new_tokens=3), Request(prompt="late", arrival_s=0.05)
    start = time.perf_counter()
    results = backend.generate([long, Request(prompt="x", max_new_tokens=50, ignore_eos=True), late])
    assert results[0].finish_reason is FinishReason.REJECTED and "max_input_tokens is 20" in results[0].reason
    assert results[1].num_output_tokens == 4
    assert results[1].timings.first_scheduled >= start + 0.05  # the batch waited for its last request
    with pytest.raises(RequestError, match="over the context window of 256"):
        backend.generate([Request(prompt_token_ids=[5] * 300)])


def test_a_failing_generate_fails_its_requests_not_the_backend(tiny_fp32, monkeypatch):
    backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(**STATIC))
    real = tiny_fp32.model.generate
    monkeypatch.setattr(tiny_fp32.model, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("nan")))
    failed = backend.generate(requests(PROMPTS[:2]))
    assert [r.finish_reason for r in failed] == [FinishReason.FAILED] * 2 and "RuntimeError: nan" in failed[0].reason
    monkeypatch.setattr(tiny_fp32.model, "generate", real)
    assert all(r.ok for r in backend.generate(requests(PROMPTS[:2])))


def test_out_of_memory_halves_the_batch(tiny_fp32, reference, monkeypatch):
    backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(**STATIC, max_batch_size=4))
    real = tiny_fp32.model.generate

    def small_batches_only(ids, **kw):
        if ids.shape[0] > 2:
            raise torch.OutOfMemoryError("out of memory (simulated)")
        return real(ids, **kw)

    monkeypatch.setattr(tiny_fp32.model, "generate", small_batches_only)
    results = backend.generate(requests())
    assert [r.token_ids for r in results] == reference
    assert [e.kind for e in backend.events] == ["oom-halved-batch"]


def test_other_modes_are_refused_or_converted():
    with pytest.raises(OptionError, match="the hf-generate backend runs static batches .* got batching='continuous'"):
        HFGenerateBackend(None, None, EngineConfig())
    assert engine_only(EngineConfig()) == []
    assert engine_only(EngineConfig(prefix_caching=True, batching="sequential")) == ["prefix caching"]
    assert engine_only(EngineConfig(batching="dynamic", cache_mode="none")) == ["dynamic batching",
                                                                               "cache_mode='none'"]
    with pytest.raises(OptionError, match="cannot run prefix caching: that needs the infergate engine"):
        hf_config(EngineConfig(prefix_caching=True))
    converted = hf_config(EngineConfig(max_batch_size=8))
    assert (converted.batching, converted.cache_mode, converted.max_batch_size) == ("static", "contiguous", 8)
    assert hf_config(EngineConfig(batching="sequential")).batching == "sequential"


@pytest.fixture(scope="module")
def broken(tiny_source):
    """tiny-random-llama whose attention never reaches the attention interface: the engine refuses it."""
    from pytest_infergate.models import load_model

    broken = load_model(tiny_source, "fp32")
    for layer in broken.model.model.layers:
        layer.self_attn.forward = lambda hidden_states, *a, **k: (torch.zeros_like(hidden_states), None)
    return broken


def test_make_backend(tiny_fp32, broken):
    model, tok = tiny_fp32.model, tiny_fp32.tokenizer
    engine, reason = make_backend(model, tok, EngineConfig(max_model_len=256), backend="engine")
    assert isinstance(engine, Engine) and engine.name == "engine" and reason == "" and engine.self_check_s > 0
    engine.close()
    hf, reason = make_backend(model, tok, EngineConfig(max_model_len=256), backend="hf")
    assert isinstance(hf, HFGenerateBackend) and hf.name == "hf-generate" and "asked for" in reason
    assert hf.config.batching == "static"
    with pytest.raises(OptionError, match="backend 'vllm': choose from auto, engine, hf"):
        make_backend(model, tok, backend="vllm")
    with pytest.raises(UnsupportedModelError, match="does not call transformers' attention interface"):
        make_backend(broken.model, tok, EngineConfig(max_model_len=256), backend="engine")
    fallback, reason = make_backend(broken.model, tok, EngineConfig(max_model_len=256))
    assert fallback.name == "hf-generate" and "model family 'llama' does not call" in reason
    assert all(r.ok for r in fallback.generate(requests(PROMPTS[:2])))


def test_the_choice_is_made_once_per_model_and_builds_backends_for_any_config(tiny_fp32, broken):
    model, tok = tiny_fp32.model, tiny_fp32.tokenizer
    threads = torch.get_num_threads()
    engine = choose_backend(model, tok)
    assert torch.get_num_threads() == threads  # the probe ran on one thread, and gave the others back
    assert (engine.name, engine.reason) == ("engine", "") and engine.self_check_s > 0
    assert model.config._attn_implementation != "infergate_paged"  # the probe's engine was closed
    assert engine.refusal("prefix caching") is None and engine.refusal_for(EngineConfig(prefix_caching=True)) is None
    with engine.build(model, tok, EngineConfig(max_model_len=256, batching="dynamic")) as built:
        assert isinstance(built, Engine) and built.config.batching == "dynamic"

    asked = choose_backend(model, tok, "hf")
    assert (asked.name, asked.reason, asked.self_check_s) == ("hf-generate", ASKED_FOR_HF, None)
    assert asked.refusal_for(EngineConfig()) is None  # continuous batching runs as static batches
    assert asked.refusal_for(EngineConfig(batching="dynamic", cache_mode="none")) == (
        "dynamic batching, cache_mode='none' needs the infergate engine; this run uses the hf-generate backend: "
        f"{ASKED_FOR_HF}")
    built = asked.build(model, tok, EngineConfig(max_model_len=256, max_batch_size=4))
    assert isinstance(built, HFGenerateBackend) and (built.config.batching, built.config.max_batch_size) == (
        "static", 4)
    assert asked.run_config(EngineConfig(max_batch_size=4)) == EngineConfig(max_batch_size=4, batching="static",
                                                                            cache_mode="contiguous")

    fallback = choose_backend(broken.model, broken.tokenizer, "auto")
    assert fallback.name == "hf-generate" and "does not call transformers' attention interface" in fallback.reason
    assert fallback.self_check_s > 0  # what the refusal cost
    with pytest.raises(UnsupportedModelError, match="model family 'llama' does not call"):
        choose_backend(broken.model, broken.tokenizer, "engine")
    with pytest.raises(OptionError, match="backend 'gpu': choose from auto, engine, hf"):
        choose_backend(model, tok, "gpu")


def outlier_thresholds(model) -> list[float]:
    return [m.state.threshold for m in model.modules() if type(m).__name__ == "Linear8bitLt"]


def test_int8_is_checked_without_its_batch_dependent_outlier_columns(tiny_source):
    """LLM.int8 runs in fp16 the input columns that any token of a forward reaches its threshold in, so the engine's
    packed probe and the model's forward of each sequence alone ran different matmuls (tiny-random-llama: 1.5% of
    the logit scale; the embedded model's int8 with its norms changed up to 105%, refused). Checked without the
    outlier columns the two are the same computation; the thresholds are put back, also after a refusal."""
    from pytest_infergate.models import load_model

    int8 = load_model(tiny_source, "int8")
    assert set(outlier_thresholds(int8.model)) == {6.0}
    with Engine(int8.model, int8.tokenizer, EngineConfig(cache_mode="none", batching="sequential")) as engine:
        report = engine.self_check
    assert report.quantized and report.max_diff <= 1e-3 * report.logit_scale
    assert set(outlier_thresholds(int8.model)) == {6.0}
    for layer in int8.model.model.layers:
        layer.self_attn.forward = lambda hidden_states, *a, **k: (torch.zeros_like(hidden_states), None)
    with pytest.raises(UnsupportedModelError, match="does not call transformers' attention interface"):
        Engine(int8.model, int8.tokenizer, EngineConfig(cache_mode="none", batching="sequential"))
    assert set(outlier_thresholds(int8.model)) == {6.0}


def test_a_loaded_model_gets_its_backend_on_first_use_and_its_load_record_says_which(tiny_source, broken):
    from pytest_infergate.models import load_model

    loaded = load_model(tiny_source, "fp32")
    assert loaded.backend is None and loaded.record.backend == ""
    choice = choice_for(loaded)
    assert choice_for(loaded) is choice  # chosen once
    assert (loaded.record.backend, loaded.record.self_check_s) == ("engine", choice.self_check_s)
    assert choice_for(broken).name == "hf-generate" and broken.record.backend_reason == choice_for(broken).reason


def test_hf_backend_runs_alongside_an_engine_on_the_same_model(tiny_fp32, reference):
    with Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=256)) as engine:
        backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(**STATIC, max_batch_size=6))
        assert [r.token_ids for r in backend.generate(requests())] == reference
        assert [r.token_ids for r in engine.generate(requests())] == reference


def test_sampling_is_reproducible_with_a_seed(tiny_fp32):
    backend = HFGenerateBackend(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(**STATIC, max_batch_size=2))

    def run(seed, top_k=0):
        reqs = [Request(prompt="Once upon a time", max_new_tokens=16, temperature=1.0, top_p=0.9, top_k=top_k,
                        seed=seed, ignore_eos=True) for _ in range(2)]
        return [r.token_ids for r in backend.generate(reqs)]

    assert run(1) == run(1) and run(1) != run(2)
    assert run(1, top_k=5) == run(1, top_k=5)
    greedy_and_sampled = backend.generate([Request(prompt="a", max_new_tokens=4),
                                           Request(prompt="a", max_new_tokens=4, temperature=1.0, seed=3)])
    assert all(r.ok for r in greedy_and_sampled)  # different settings: different batches


def test_a_model_in_training_mode_is_a_clear_error(tiny_fp32):
    tiny_fp32.model.train()
    try:
        with pytest.raises(OptionError, match=r"is in training mode .* call model.eval\(\)"):
            Engine(tiny_fp32.model, tiny_fp32.tokenizer, EngineConfig(max_model_len=256))
    finally:
        tiny_fp32.model.eval()
    assert tiny_fp32.model.config._attn_implementation != "infergate_paged"
