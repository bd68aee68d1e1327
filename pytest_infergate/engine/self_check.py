"""The engine checks itself on every model it is given: a short probe through the engine's attention, compared
with the model's own attention implementation (eager or sdpa) on the same tokens.

The probe runs three sequences of fixed random tokens in five forwards, as the engine would schedule them:
chunked prefill (a chunk after cached context), a whole prefill, decodes of different context lengths in one
group, prefill and decode in one forward. It is long enough to cross a KV block boundary and, where the model
has one, its smallest sliding window (capped at PROBE_MAX_SPAN tokens: a huge window is not crossed). Every
logit the engine computes is compared with the model's own forward over the whole sequence. Beyond a tolerance
set per dtype, the check names the first attention layer whose output differs and the features that layer
uses, and the engine refuses the model (UnsupportedModelError) instead of computing something else.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from pytest_infergate.engine.attention import (ATTENTION_NAME, LayerSpec, ShapeProbe, UnsupportedModelError, install,
                                               original_attention, uninstall)
from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.kv_cache import KVCache
from pytest_infergate.engine.request import Request, Sequence
from pytest_infergate.engine.scheduler import Chunk, StepPlan

# max |engine - reference| over the probe's logits, relative to the largest reference logit (at least 1)
TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
PROBE_BLOCK_SIZE = 8
PROBE_MAX_SPAN = 48
NUM_DECODES = 3
CONFIG_FEATURES = ("sliding_window", "use_sliding_window", "attn_logit_softcapping", "query_pre_attn_scalar",
                   "attention_multiplier", "use_bidirectional_attention", "attention_chunk_size", "alibi",
                   "position_embedding_type", "rope_scaling")
HF_ADVICE = ("The gates still run on it through transformers' own generate: choose the HF backend "
             "(--infergate-backend hf; `auto` falls back to it), or run the engine on another family.")


@dataclass
class SelfCheckReport:
    reference: str  # the attention implementation the engine was compared with
    seconds: float
    num_tokens: int  # probe tokens the engine computed
    max_diff: float  # max |engine - reference| over the probe's logits
    logit_scale: float  # max |reference logit|
    tolerance: float  # the relative tolerance for this dtype
    window_crossed: bool | None  # None: the model has no sliding window

    def to_dict(self) -> dict:
        return asdict(self)


def family(model) -> str:
    return f"model family {getattr(model.config, 'model_type', '?')!r}"


def probe_sequences(specs: dict[int, LayerSpec], vocab_size: int) -> tuple[list[list[int]], list[int], bool | None]:
    """Token ids of the three probe sequences, the length each is prefilled to, and whether they cross the
    smallest sliding window."""
    windows = [s.sliding_window for s in specs.values() if s.sliding_window is not None]
    window = min(windows) if windows else None
    span = min(max(PROBE_BLOCK_SIZE, window or 0) + 4, PROBE_MAX_SPAN)  # past a block and the window
    prefill = [span, PROBE_BLOCK_SIZE // 2 + 1, min((window or 1) + 2, PROBE_MAX_SPAN)]
    generator = torch.Generator().manual_seed(1234)
    total = [prefill[0] + NUM_DECODES, prefill[1] + NUM_DECODES + 1, prefill[2] + NUM_DECODES]
    ids = [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in total]
    return ids, prefill, None if window is None else span > window


def _chunk(seq: Sequence, ids: list[int], blocks: BlockManager, count: int) -> Chunk:
    """The next `count` tokens of `seq`, its blocks grown to hold them."""
    seq.prompt_token_ids = ids[:seq.num_computed_tokens + count]
    blocks.grow(seq.seq_id, seq.block_table, seq.num_computed_tokens + count)
    return Chunk(seq, count)


def probe_plans(seqs: list[Sequence], ids: list[list[int]], prefill: list[int], blocks: BlockManager):
    """Yield the probe's five step plans (each advanced once the caller has run it)."""
    a, b, c = seqs
    half = prefill[0] // 2 + 1
    steps = [([], [(a, half), (b, prefill[1])]),
             ([b], [(a, prefill[0] - half), (c, prefill[2])])]
    steps += [([a, b, c], [])] * NUM_DECODES
    for decodes, prefills in steps:
        plan = StepPlan(decodes=[_chunk(s, ids[seqs.index(s)], blocks, 1) for s in decodes],
                        prefills=[_chunk(s, ids[seqs.index(s)], blocks, n) for s, n in prefills])
        yield plan
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens


class LayerRecorder:
    """Forward hooks on the attention modules: each call's output [1, T, hidden], per layer."""

    def __init__(self, modules: dict[int, torch.nn.Module]):
        self.outputs: dict[int, list[torch.Tensor]] = {layer: [] for layer in modules}
        self.handles = [m.register_forward_hook(self._hook(layer)) for layer, m in modules.items()]

    def _hook(self, layer):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[layer].append(out.detach()[0].float())
        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


@torch.inference_mode()
def reference_outputs(model, ids: list[list[int]], modules, device) -> tuple[str, list, dict]:
    """The model's own logits [L, vocab] per probe sequence, and its attention layers' outputs, with its own
    attention implementation (sdpa or eager; eager when the other refuses, e.g. sdpa with softcapping)."""
    own = original_attention(model)
    candidates = [own] if own and own != ATTENTION_NAME else []
    candidates += [name for name in ("sdpa", "eager") if name not in candidates]
    error = None
    for name in candidates:
        recorder = LayerRecorder(modules)
        try:
            model.set_attn_implementation(name)
            logits = [model(input_ids=torch.tensor([row], device=device), use_cache=False).logits[0].float()
                      for row in ids]
            return name, logits, recorder.outputs
        except Exception as exc:  # the next implementation may support what this one refused
            error = exc
        finally:
            recorder.close()
            model.set_attn_implementation(ATTENTION_NAME)
    raise UnsupportedModelError(f"{family(model)}: its own attention implementations {candidates} all failed on the "
                                f"engine's self-check probe ({error}), so the engine cannot be checked against it. "
                                + HF_ADVICE) from error


def suspects(model, spec: LayerSpec | None) -> str:
    """The features of a layer (from what it passed to attention, and from the config) that may be the cause."""
    config = model.config
    found = spec.features() if spec is not None else []
    for key in CONFIG_FEATURES:
        value = getattr(config, key, None)
        if value not in (None, False):
            found.append(f"config {key}={value}")
    layer_types = getattr(config, "layer_types", None)
    if spec is not None and layer_types and spec.layer_idx < len(layer_types):
        found.append(f"config layer_types[{spec.layer_idx}]={layer_types[spec.layer_idx]!r}")
    return ", ".join(found) or "nothing the engine knows of (an attention variant it does not recognise)"


def run_self_check(model, runner, specs: dict[int, LayerSpec], modules, dtype: torch.dtype) -> SelfCheckReport:
    """Compare the engine's logits with the model's own on the probe; raise UnsupportedModelError beyond the
    tolerance. `runner` is a ModelRunner of its own: this function gives it the probe's cache."""
    start = time.perf_counter()
    device = runner.device
    ids, prefill, crossed = probe_sequences(specs, model.config.get_text_config().vocab_size)
    reference, ref_logits, ref_layers = reference_outputs(model, ids, modules, device)
    blocks = BlockManager(sum(-(-len(row) // PROBE_BLOCK_SIZE) for row in ids), PROBE_BLOCK_SIZE)
    runner.cache = KVCache({layer: (s.num_kv_heads, s.head_dim) for layer, s in specs.items()}, blocks.num_blocks *
                           PROBE_BLOCK_SIZE, dtype, device)
    runner.block_size = PROBE_BLOCK_SIZE
    seqs = [Sequence(Request(prompt_token_ids=row[:1], max_new_tokens=1), row[:1], 0.0, f"probe-{i}")
            for i, row in enumerate(ids)]
    recorder = LayerRecorder(modules)
    rows: list[tuple[int, int]] = []  # (probe sequence, position) of every engine logit, in order
    logits = []
    try:
        for plan in probe_plans(seqs, ids, prefill, blocks):
            inputs = runner.prepare(plan)  # sorts the decodes: rows follow plan order afterwards
            rows += [(seqs.index(c.seq), c.seq.num_computed_tokens + i)
                     for c in plan.chunks for i in range(c.num_tokens)]
            logits.append(runner.run_model(inputs, all_logits=True)[0])
    finally:
        recorder.close()
    engine = torch.cat(logits)
    expected = torch.stack([ref_logits[s][p] for s, p in rows])
    scale = max(1.0, float(expected.abs().max()))
    max_diff = float((engine - expected).abs().max())
    tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float16])
    report = SelfCheckReport(reference, time.perf_counter() - start, len(rows), max_diff, scale, tolerance, crossed)
    if not max_diff <= tolerance * scale:  # also catches nan
        layer, detail = first_diverging_layer(recorder.outputs, ref_layers, rows, tolerance)
        spec = specs.get(layer)
        where = f"first at layer {layer} ({spec.module_type if spec else '?'}; {detail})" if layer is not None \
            else "in no attention layer's output (so after them: the engine's inputs or the model's head)"
        raise UnsupportedModelError(
            f"{family(model)} ({type(model).__name__}) fails the engine's self-check: the engine's logits differ from the model's own "
            f"{reference!r} attention by up to {max_diff:.3g} (tolerance {tolerance:g} x logit scale {scale:.3g} "
            f"for {str(dtype).replace('torch.', '')}), {where}. Suspected feature: {suspects(model, spec)}. "
            "The engine would compute something other than this model, so it refuses to run it. " + HF_ADVICE)
    return report


def first_diverging_layer(engine_layers: dict, ref_layers: dict, rows: list[tuple[int, int]],
                          tolerance: float) -> tuple[int | None, str]:
    """The first attention layer whose outputs differ beyond the tolerance (relative to that layer's scale); the
    one that differs most when none does on its own."""
    worst = (None, -1.0, "")
    for layer in sorted(engine_layers):
        engine = torch.cat(engine_layers[layer])  # [rows, hidden], one tensor per engine step
        expected = torch.stack([ref_layers[layer][s][p] for s, p in rows])
        diff = float((engine - expected).abs().max())
        relative = diff / max(float(expected.abs().max()), 1e-6)
        detail = f"max diff {diff:.3g}, {relative:.2g} of its scale"
        if not relative <= tolerance:
            return layer, detail
        if relative > worst[1]:
            worst = (layer, relative, detail)
    return worst[0], worst[2]


def probe_shapes(model, runner) -> tuple[dict[int, LayerSpec], dict[int, torch.nn.Module]]:
    """One token through the model on the engine's attention (no cache): which layers call it, with what."""
    probe = ShapeProbe()
    seq = Sequence(Request(prompt_token_ids=[runner.pad_token_id], max_new_tokens=1), [runner.pad_token_id], 0.0,
                   "shape-probe")
    try:
        runner.run_model(runner.prepare(StepPlan(prefills=[Chunk(seq, 1)]), observer=probe))
    except Exception as exc:
        raise UnsupportedModelError(
            f"{family(model)} cannot run on the infergate engine: its forward failed on the engine's attention "
            f"({type(exc).__name__}: {exc}). " + HF_ADVICE) from exc
    if probe.problems:
        raise UnsupportedModelError(f"{family(model)} cannot run on the infergate engine: "
                                    f"{'; '.join(dict.fromkeys(probe.problems))}. " + HF_ADVICE)
    if not probe.specs:
        raise UnsupportedModelError(
            f"{family(model)} does not call transformers' attention interface (AttentionInterface): "
            f"{type(model).__name__} computes attention its own way, so the engine's KV cache cannot plug in. "
            + HF_ADVICE)
    return probe.specs, probe.modules


def attach(model, runner_factory, dtype: torch.dtype) -> tuple[dict[int, LayerSpec], SelfCheckReport]:
    """Switch the model to the engine's attention, learn its layers, and check the engine against the model's own
    attention. On any failure the model's attention is switched back and UnsupportedModelError raised.
    `runner_factory(cache, block_size)` makes a ModelRunner for the probes."""
    install(model)
    try:
        specs, modules = probe_shapes(model, runner_factory(None, PROBE_BLOCK_SIZE))
        report = run_self_check(model, runner_factory(None, PROBE_BLOCK_SIZE), specs, modules, dtype)
    except BaseException:
        uninstall(model)
        raise
    return specs, report
