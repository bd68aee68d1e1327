"""CUDA graphs for decode steps (engine/decode_graphs.py), on the CPU: the capture is replaced by EagerReplay, which
runs the captured function itself at every replay, so everything but torch.cuda.CUDAGraph is exercised: the
buckets, the fixed buffers and the copy of each step's inputs into them, padding rows and padded keys, sliding
windows, the check against the eager forward, and the fallback to eager steps when a capture fails or disagrees.
On a GPU, tests/test_gpu.py runs the real capture."""

import pytest
import torch
from zoo_models import cached_zoo, prompts

from pytest_infergate.engine import Engine, EngineConfig, Request, decode_graphs, graph_build
from pytest_infergate.engine.attention import AttentionBatch
from pytest_infergate.engine.decode_graphs import DecodeGraphs, EagerReplay, batch_buckets, context_buckets
from pytest_infergate.errors import OptionError
from pytest_infergate.perf.fingerprint import diff_fingerprints

MAX_NEW = 16
PROMPTS = prompts()  # 6 prompts of 5..60 tokens: contexts up to 76, across the context buckets 32, 64, 96
BASE = dict(block_size=4, max_model_len=96, kv_budget_blocks=160, max_batch_size=6, cuda_graphs=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_source):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_source.path)


@pytest.fixture(scope="module")
def zoo():
    return cached_zoo(PROMPTS, MAX_NEW)


@pytest.fixture
def replays(monkeypatch):
    """Graphs on the CPU with EagerReplay, context buckets from 32; yields the (batch, context) of every replay."""
    seen = []
    monkeypatch.setattr(decode_graphs, "capture_backend", EagerReplay)
    monkeypatch.setattr(decode_graphs, "MIN_CONTEXT_BUCKET", 32)
    run = DecodeGraphs.run

    def recording(self, inputs):
        logits = run(self, inputs)
        seen.append(self.last_bucket)
        return logits

    monkeypatch.setattr(DecodeGraphs, "run", recording)
    return seen


LIMITS = [MAX_NEW - 3 * i for i in range(len(PROMPTS))]  # sequences leave one by one: batches 6, 5, 4, ... padded


def generate(engine):
    return [r.token_ids for r in engine.generate([Request(prompt_token_ids=p, max_new_tokens=n)
                                                  for p, n in zip(PROMPTS, LIMITS)])]


def cut(reference):
    return [tokens[:n] for tokens, n in zip(reference, LIMITS)]


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert batch_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert context_buckets(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert context_buckets(300) == [256, 300]
    assert context_buckets(100) == [100]


@pytest.mark.parametrize("family", ["llama", "mistral-sliding", "gemma2", "gpt-oss", "qwen2-sliding"])
@pytest.mark.parametrize("mode", [{}, dict(kv_budget_blocks=24, prefill_chunk_size=8), dict(prefix_caching=True)],
                         ids=["continuous", "preemption", "prefix-caching"])
def test_graphs_are_exact(zoo, tokenizer, replays, family, mode):
    model, reference = zoo(family)
    with Engine(model, tokenizer, EngineConfig(**{**BASE, **mode})) as engine:
        status = engine.cuda_graphs
        assert status.enabled, status.reason
        assert status.batch_sizes == (1, 2, 4, 6) and status.context_lengths == (32, 64, 96)
        assert status.num_graphs == 12 and status.max_diff <= engine.self_check.tolerance
        assert status.pool_bytes == 0 and "pool" not in status.describe()  # no CUDA pool on the CPU
        checked = len(replays)
        assert checked == 12  # each graph checked against the eager forward once, when the engine was built
        assert generate(engine) == cut(reference)
        engine.check_drained()
    assert engine.runner.graphs is None  # closing let go of the graphs (on a GPU: their memory pool)
    served = replays[checked:]
    decode_steps = [s for s in engine.steps if s.num_prefill_tokens == 0]
    assert len(served) == len(decode_steps) > 0  # every decode-only step replayed a graph, no other step did
    assert len({keys for _, keys in served}) >= 2  # contexts grew across a context bucket
    if not mode:  # sequences left one by one: some steps ran a larger batch's graph, with padding rows
        assert any(rows > batch for (rows, _), batch in zip(served, (s.batch_size for s in decode_steps)))


def test_static_batching_pads_eagerly_and_stays_exact(zoo, tokenizer, replays):
    model, reference = zoo("llama")
    with Engine(model, tokenizer, EngineConfig(**{**BASE, "batching": "static", "max_batch_size": 3})) as engine:
        assert generate(engine) == cut(reference)
    padded = [s for s in engine.steps if s.num_padding_tokens]
    assert padded and len(replays) - engine.cuda_graphs.num_graphs == sum(1 for s in engine.steps
                                              if not s.num_prefill_tokens and not s.num_padding_tokens)


def test_graphs_need_cuda(zoo, tokenizer):
    model, _ = zoo("llama")
    with pytest.raises(OptionError, match=r"cuda_graphs=True\) needs a model on a CUDA device, this one is on cpu"):
        Engine(model, tokenizer, EngineConfig(**BASE))
    with Engine(model, tokenizer, EngineConfig(**{**BASE, "cuda_graphs": None})) as engine:  # default: off here
        assert not engine.cuda_graphs.enabled and "on cpu" in engine.cuda_graphs.describe()
        assert engine.runner.graphs is None
    with pytest.raises(OptionError, match="cuda_graphs must be True, False or None"):
        EngineConfig(cuda_graphs="yes")


def test_a_graph_that_disagrees_turns_graphs_off(zoo, tokenizer, replays, monkeypatch):
    model, reference = zoo("mistral-sliding")
    build = graph_build.build
    monkeypatch.setattr(graph_build, "build", lambda graphs, run_eager, tolerance: build(graphs, run_eager, -1.0))
    with Engine(model, tokenizer, EngineConfig(**BASE)) as engine:
        assert not engine.cuda_graphs.enabled
        assert "the graph for batch 6 x context 96 differs from the eager forward" in engine.cuda_graphs.reason
        assert engine.runner.graphs is None
        checked = len(replays)
        assert generate(engine) == cut(reference)
    assert len(replays) == checked  # every step ran eagerly


class FailingCapture(EagerReplay):
    def capture(self, forward):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")


def test_a_failed_capture_turns_graphs_off(zoo, tokenizer, monkeypatch):
    model, reference = zoo("llama")
    monkeypatch.setattr(decode_graphs, "capture_backend", FailingCapture)
    with Engine(model, tokenizer, EngineConfig(**BASE)) as engine:
        assert engine.cuda_graphs.describe() == ("off: capture failed: RuntimeError: operation not permitted when "
                                                 "stream is capturing")
        assert generate(engine) == cut(reference)


def test_no_graphs_without_a_cache_or_with_llm_int8(zoo, tokenizer, replays):
    model, reference = zoo("llama")
    with Engine(model, tokenizer, EngineConfig(**{**BASE, "cache_mode": "none"})) as engine:
        assert "no KV cache" in engine.cuda_graphs.reason
        assert generate(engine) == cut(reference)

    class Int8:
        class hf_quantizer:
            class quantization_config:
                load_in_8bit = True

    assert "LLM.int8 picks its outlier columns at run time" in graph_build.why_not(Int8(), cache=object())
    assert graph_build.why_not(model, cache=object()) == ""


def test_a_frozen_layout_refuses_a_window_it_was_not_built_for():
    batch = AttentionBatch(None, 4, torch.device("cpu"), max_context=64, frozen=True)
    with pytest.raises(RuntimeError, match=r"sliding window of 16 tokens.*cuda_graphs=False"):
        batch.layout(16)


def test_a_baseline_saved_before_a_new_engine_field_still_matches():
    current = {"engine_config": {"batching": "continuous", "cuda_graphs": None}}
    assert diff_fingerprints(current, {"engine_config": {"batching": "continuous"}}).under_test == []
    changed = {"engine_config": {"batching": "continuous", "cuda_graphs": False}}
    (change,) = diff_fingerprints(changed, {"engine_config": {"batching": "continuous"}}).under_test
    assert change.describe() == "engine_config.cuda_graphs – → False"


def test_a_graph_pool_counts_in_the_models_memory(tiny_fp32):
    """The pool is reserved when the engine is built, before any measured region, and replays allocate nothing:
    the perf record adds it to what the model holds."""
    from pytest_infergate.engine.decode_graphs import GraphStatus
    from pytest_infergate.measurement import Measurement
    from pytest_infergate.perf.local_bench import Bench

    bench = Bench(tiny_fp32, calibrate=False)
    config = EngineConfig(max_model_len=128, kv_budget_blocks=16)
    try:
        engine = bench.engine(config)
        engine.cuda_graphs = GraphStatus(True, num_graphs=1, batch_sizes=(1,), context_lengths=(128,),
                                         pool_bytes=64 << 20)
        measurement = Measurement()
        bench.run_once([Request(prompt_token_ids=[5, 6, 7], max_new_tokens=2)], config, 0, measurement)
    finally:
        bench.close()
    memory = measurement.memory
    assert memory["cuda_graphs_mb"] == 64
    assert memory["peak_mb"] == pytest.approx(memory["weights_mb"] + memory["kv_allocated_mb"] + memory["other_mb"]
                                              + 64)
    assert "pool 64 MiB" in measurement.engine["cuda_graphs"]


def test_no_graphs_for_chunked_attention(zoo):
    """A chunked layer's keys are its own chunk's (llama4), a layout the graphs' fixed buffers do not hold."""
    model, _ = zoo("llama4")
    assert "chunked attention layers" in graph_build.why_not(model, cache=object())
