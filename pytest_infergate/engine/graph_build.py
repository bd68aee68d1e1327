"""Building an engine's CUDA graphs (decode_graphs.py): whether it gets them, capturing them all, and checking each
against the eager forward before any step replays it."""

from __future__ import annotations

import time

import torch

from pytest_infergate.engine import decode_graphs
from pytest_infergate.engine.attention import AttentionBatch, DecodeRows, cache_slots
from pytest_infergate.engine.config import declared_patterns
from pytest_infergate.engine.decode_graphs import DecodeGraphs, GraphStatus
from pytest_infergate.engine.runner import ForwardInputs
from pytest_infergate.errors import OptionError

CHECK_SEED = 0  # the check's random token ids


def wanted(config, device: torch.device) -> bool:
    """EngineConfig.cuda_graphs: None means on CUDA; True where graphs cannot be captured is an error."""
    if config.cuda_graphs is None:
        return device.type == "cuda"
    if config.cuda_graphs and decode_graphs.capture_backend(device) is None:
        raise OptionError(f"EngineConfig(cuda_graphs=True) needs a model on a CUDA device, this one is on "
                          f"{device}: leave cuda_graphs at None (on with CUDA) or set it to False")
    return config.cuda_graphs


def not_wanted(config, device: torch.device) -> GraphStatus:
    return GraphStatus(False, "EngineConfig(cuda_graphs=False)" if config.cuda_graphs is False
                       else f"the model is on {device.type}, CUDA graphs need CUDA")


def attach(engine, pad_token_id: int) -> GraphStatus:
    """Capture and check `engine`'s decode graphs; its runner replays them only if every one agrees."""
    reason = why_not(engine.model, engine.cache)
    if reason:
        return GraphStatus(False, reason)
    windows = {spec.sliding_window for spec in engine.layers.values()}
    graphs = DecodeGraphs(engine.model, engine.cache, engine.config.block_size, pad_token_id, windows,
                          engine.config.max_batch_size, engine.max_model_len, engine.cache.num_slots - 1,
                          decode_graphs.capture_backend(engine.device))
    status = build(graphs, engine.runner.run_model, engine.self_check.tolerance)
    if status.enabled:
        engine.runner.graphs = graphs
    return status


def check_inputs(graphs: DecodeGraphs, rows: int, keys: int):
    """Synthetic decode inputs that the (rows, keys) graph serves with the most padding: one sequence more than
    the next smaller batch bucket, the longest context one token more than the next smaller context bucket, the
    others shorter; their blocks are the first of the cache (still empty when the engine is built), token ids
    random."""
    generator = torch.Generator().manual_seed(CHECK_SEED)
    block_size = graphs.block_size
    smaller = [b for b in graphs.batch_sizes if b < rows]
    count = (smaller[-1] if smaller else 0) + 1
    shorter = [k for k in graphs.context_lengths if k < keys]
    longest = (shorter[-1] if shorter else 0) + 1
    lengths = torch.linspace(longest, max(1, longest // 2), count).round().long()
    width = -(-longest // block_size)
    num_blocks = graphs.scratch_slot // block_size
    tables = torch.arange(count * width).view(count, width) % num_blocks
    last = (lengths - 1).unsqueeze(1)
    slots = cache_slots(tables, last, block_size).squeeze(1)
    batch = AttentionBatch(graphs.cache, block_size, graphs.device, num_real_tokens=count, slot_mapping=slots,
                           decode_rows=[DecodeRows(0, tables, lengths)], max_context=longest)
    vocab = graphs.model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (count,), generator=generator).tolist()
    return ForwardInputs(batch, ids, (lengths - 1).tolist(), list(range(count)), [slots])


def why_not(model, cache) -> str:
    """Why decode steps of this engine cannot replay graphs ("" if they can)."""
    if cache is None:
        return "no KV cache (cache_mode 'none' recomputes the whole prefix: no decode step to replay)"
    config = getattr(model, "config", None)
    if config is not None and declared_patterns(config).chunks:
        return ("chunked attention layers (attention_chunk_size): the graphs' fixed key layouts are built per "
                "sliding window only; decode steps run eagerly")
    quantizer = getattr(model, "hf_quantizer", None)
    if getattr(getattr(quantizer, "quantization_config", None), "load_in_8bit", False):
        return ("bitsandbytes LLM.int8 picks its outlier columns at run time, a shape a graph cannot hold; "
                "decode steps run eagerly")
    return ""


def _reserved_after_emptying(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


def build(graphs: DecodeGraphs, run_eager, tolerance: float) -> GraphStatus:
    """Capture every graph and check each against the eager forward (`run_eager(inputs) -> (logits, s)`);
    graphs stay on only if every one agrees within `tolerance` x the logit scale."""
    start = time.perf_counter()
    on_cuda = graphs.device.type == "cuda"
    try:
        # cached blocks given back before and after, so the rise in reserved memory is what the graphs hold: their
        # pool and the logits buffer, not the warm-up forwards' freed intermediates
        reserved = _reserved_after_emptying(graphs.device) if on_cuda else 0
        graphs.capture_all()
        pool = _reserved_after_emptying(graphs.device) - reserved if on_cuda else 0
        worst = 0.0
        for rows, keys in graphs.graphs:
            inputs = check_inputs(graphs, rows, keys)
            eager = run_eager(inputs)[0]
            replayed = graphs.run(inputs)
            if graphs.last_bucket != (rows, keys):
                raise RuntimeError(f"the check meant for the graph of batch {rows} x context {keys} replayed "
                                   f"{graphs.last_bucket}")
            scale = max(1.0, float(eager.abs().max()))
            diff = float((replayed - eager).abs().max()) / scale
            worst = max(worst, diff)
            if not diff <= tolerance:
                graphs.graphs.clear()
                return GraphStatus(False, f"the graph for batch {rows} x context {keys} differs from the eager "
                                          f"forward by {diff:.2e} x the logit scale (tolerance {tolerance:.0e})")
    except Exception as exc:  # noqa: BLE001 - any failure to capture means: run eagerly, and say why
        graphs.graphs.clear()
        if graphs.device.type == "cuda":
            torch.cuda.synchronize(graphs.device)
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        return GraphStatus(False, f"capture failed: {type(exc).__name__}: {first_line}")
    return GraphStatus(True, num_graphs=len(graphs.graphs), batch_sizes=tuple(graphs.batch_sizes),
                       context_lengths=tuple(graphs.context_lengths), capture_s=time.perf_counter() - start,
                       max_diff=worst, pool_bytes=pool)
