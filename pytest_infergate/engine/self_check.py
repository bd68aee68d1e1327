"""The engine checks itself on every model it is given: a short probe through the engine's attention, compared
with the model's own attention implementation (sdpa or eager) on the same tokens.

The probe runs three sequences of fixed random tokens in three forwards, as the engine would schedule them:
(1) the first chunk of A and all of B; (2) A's next chunk after its cached context, all of C, and B's first
decode; (3) one decode each of A, B and C, of different context lengths, in one group. The first forward also
learns the model's attention layers (which call the interface, with what tensors and features); the probe's
cache gets each layer as it appears. A is long enough to cross KV block boundaries and, where the model has one,
its smallest sliding window (up to PROBE_MAX_SPAN tokens: a larger window is not crossed). Every logit the
engine computes is compared with the model's own forward over the whole sequences (one batched forward).

Beyond a tolerance set per dtype the engine refuses the model (UnsupportedModelError): the probe runs again
with hooks on the attention layers to name the first layer whose output differs, and the message names the
family, that layer, the features it uses (from what it passed and from the config) and the difference seen.
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
PROBE_BLOCK_SIZE = 4  # small blocks: a short probe crosses several boundaries
PROBE_MAX_SPAN = 48
FIRST_CHUNK = PROBE_BLOCK_SIZE + 1  # A's first chunk, prefilled before the windows are known
CONFIG_FEATURES = ("sliding_window", "use_sliding_window", "attn_logit_softcapping", "query_pre_attn_scalar",
                   "attention_multiplier", "use_bidirectional_attention", "attention_chunk_size", "alibi")
HF_ADVICE = ("The gates still run on it through transformers' own generate: choose the HF backend "
             "(--infergate-backend hf; `auto` falls back to it), or run the engine on another family.")


@dataclass
class SelfCheckReport:
    reference: str  # the attention implementation the engine was compared with
    seconds: float
    num_tokens: int  # probe tokens the engine computed
    max_diff: float  # max |engine - reference| over the probe's logits
    logit_scale: float  # max |reference logit|
    tolerance: float  # relative, for this dtype
    window_crossed: bool | None  # None: the model has no sliding window

    def to_dict(self) -> dict:
        return asdict(self)


def family(model) -> str:
    return f"model family {getattr(model.config, 'model_type', '?')!r}"


class LayerRecorder:
    """Forward hooks on the attention modules: each call's output [batch, T, hidden], per layer."""

    def __init__(self, modules: dict[int, torch.nn.Module]):
        self.outputs: dict[int, list[torch.Tensor]] = {layer: [] for layer in modules}
        self.handles = [m.register_forward_hook(self._hook(layer)) for layer, m in modules.items()]

    def _hook(self, layer):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[layer].append(out.detach().float())
        return hook

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class Probe:
    """The probe's sequences and their state: a small paged cache, blocks, and what each forward computed."""

    def __init__(self, model, runner_factory, dtype: torch.dtype, specs: dict[int, LayerSpec] | None = None):
        vocab = model.config.get_text_config().vocab_size
        generator = torch.Generator().manual_seed(1234)
        lengths = [PROBE_MAX_SPAN + 2, PROBE_BLOCK_SIZE + 1, PROBE_MAX_SPAN + 1]  # the longest each may need
        self.ids = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]
        self.blocks = BlockManager(sum(-(-n // PROBE_BLOCK_SIZE) for n in lengths), PROBE_BLOCK_SIZE)
        geometry = {layer: spec.geometry for layer, spec in (specs or {}).items()}
        self.cache = KVCache(geometry, self.blocks.num_blocks * PROBE_BLOCK_SIZE, dtype, next(model.parameters()).device)
        self.runner = runner_factory(self.cache, PROBE_BLOCK_SIZE)
        self.seqs = [Sequence(Request(prompt_token_ids=row[:1], max_new_tokens=1), row[:1], 0.0, f"probe-{i}")
                     for i, row in enumerate(self.ids)]
        self.rows: list[tuple[int, int]] = []  # (sequence, position) of every logit computed, in order
        self.logits: list[torch.Tensor] = []

    def chunk(self, index: int, count: int) -> Chunk:
        """The next `count` tokens of sequence `index`, its blocks grown to hold them."""
        seq = self.seqs[index]
        seq.prompt_token_ids = self.ids[index][:seq.num_computed_tokens + count]
        self.blocks.grow(seq.seq_id, seq.block_table, seq.num_computed_tokens + count)
        return Chunk(seq, count)

    def run(self, decodes: list[int], prefills: list[tuple[int, int]], observer=None) -> None:
        plan = StepPlan(decodes=[self.chunk(i, 1) for i in decodes], prefills=[self.chunk(i, n) for i, n in prefills])
        inputs = self.runner.prepare(plan, observer=observer)  # sorts the decodes: plan order is forward order
        self.logits.append(self.runner.run_model(inputs, all_logits=True)[0])
        for chunk in plan.chunks:
            seq = chunk.seq
            self.rows += [(self.seqs.index(seq), seq.num_computed_tokens + i) for i in range(chunk.num_tokens)]
            seq.num_computed_tokens += chunk.num_tokens

    def run_rest(self, span: int, c_len: int) -> None:
        self.run([1], [(0, span - FIRST_CHUNK), (2, c_len)])
        self.run([0, 1, 2], [])

    def sequences(self) -> list[list[int]]:
        """Each sequence's tokens as far as the probe runs them."""
        return [ids[:seq.num_computed_tokens] for ids, seq in zip(self.ids, self.seqs)]


def probe_lengths(specs: dict[int, LayerSpec]) -> tuple[int, int, bool | None]:
    """How far A is prefilled, how long C is, and whether A crosses the smallest sliding window (None: none)."""
    windows = [s.sliding_window for s in specs.values() if s.sliding_window is not None]
    window = min(windows) if windows else None
    crosses = window is not None and window + 4 <= PROBE_MAX_SPAN
    span = window + 4 if crosses else 2 * PROBE_BLOCK_SIZE
    return span, window + 2 if crosses else 3, None if window is None else crosses


def check_shapes(model, shapes: ShapeProbe, error: Exception | None) -> None:
    if shapes.problems:
        raise UnsupportedModelError(f"{family(model)} cannot run on the infergate engine: "
                                    f"{'; '.join(dict.fromkeys(shapes.problems))}. " + HF_ADVICE) from error
    if error is not None:
        raise UnsupportedModelError(
            f"{family(model)} cannot run on the infergate engine: its forward failed on the engine's attention "
            f"({type(error).__name__}: {error}). " + HF_ADVICE) from error
    if not shapes.specs:
        raise UnsupportedModelError(
            f"{family(model)} does not call transformers' attention interface (AttentionInterface): "
            f"{type(model).__name__} computes attention its own way (or has none, as a state-space model), so the "
            "engine's KV cache cannot plug in. " + HF_ADVICE)
    num_layers = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    if isinstance(num_layers, int) and len(shapes.specs) < num_layers:
        raise UnsupportedModelError(
            f"{family(model)} cannot run on the infergate engine: only {len(shapes.specs)} of its {num_layers} "
            "layers attend through transformers' attention interface; the others (state-space, recurrent or "
            "convolution blocks) carry state from token to token that the engine's KV cache does not hold. "
            + HF_ADVICE)


@torch.inference_mode()
def reference_logits(model, sequences: list[list[int]], recorder_modules=None):
    """The model's own logits [batch, L, vocab] over the sequences (right-padded, one forward), with its own
    attention implementation (sdpa or eager; eager when the other refuses, e.g. sdpa with softcapping). Returns
    (implementation name, logits, per-layer outputs when `recorder_modules` are given)."""
    own = original_attention(model)
    candidates = [own] if own and own != ATTENTION_NAME else []
    candidates += [name for name in ("sdpa", "eager") if name not in candidates]
    device = next(model.parameters()).device
    width = max(map(len, sequences))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in sequences], device=device)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in sequences], device=device)
    positions = torch.arange(width, device=device).expand(len(sequences), -1)
    error = None
    for name in candidates:
        recorder = LayerRecorder(recorder_modules or {})
        try:
            model.set_attn_implementation(name)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            return name, out.logits.float(), {k: v[0] for k, v in recorder.outputs.items() if v}
        except Exception as exc:  # the next implementation may support what this one refused
            error = exc
        finally:
            recorder.close()
            model.set_attn_implementation(ATTENTION_NAME)
    raise UnsupportedModelError(f"{family(model)}: its own attention implementations {candidates} all failed on the "
                                f"engine's self-check probe ({error}), so the engine cannot be checked against it. "
                                + HF_ADVICE) from error


def attach(model, runner_factory, dtype: torch.dtype) -> tuple[dict[int, LayerSpec], SelfCheckReport]:
    """Switch the model to the engine's attention, learn its attention layers, and check the engine against the
    model's own attention. On any failure the model's attention is switched back and UnsupportedModelError
    raised. `runner_factory(cache, block_size)` makes a ModelRunner."""
    start = time.perf_counter()
    install(model)
    try:
        probe = Probe(model, runner_factory, dtype)
        shapes = ShapeProbe(probe.cache)
        try:
            probe.run([], [(0, FIRST_CHUNK), (1, PROBE_BLOCK_SIZE - 1)], observer=shapes)
            error = None
        except Exception as exc:
            error = exc
        check_shapes(model, shapes, error)
        span, c_len, crossed = probe_lengths(shapes.specs)
        probe.run_rest(span, c_len)
        reference, logits, _ = reference_logits(model, probe.sequences())
        engine = torch.cat(probe.logits)
        expected = torch.stack([logits[s, p] for s, p in probe.rows])
        scale = max(1.0, float(expected.abs().max()))
        max_diff = float((engine - expected).abs().max())
        tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float16])
        if not max_diff <= tolerance * scale:  # also catches nan
            raise refusal(model, runner_factory, dtype, shapes, (span, c_len), reference, max_diff, tolerance, scale)
    except BaseException:
        uninstall(model)
        raise
    report = SelfCheckReport(reference, time.perf_counter() - start, len(probe.rows), max_diff, scale, tolerance,
                             crossed)
    return shapes.specs, report


def refusal(model, runner_factory, dtype, shapes: ShapeProbe, lengths, reference: str, max_diff: float,
            tolerance: float, scale: float) -> UnsupportedModelError:
    """The self-check's error: the probe again, with hooks on every attention layer, to name the first one whose
    output differs."""
    probe = Probe(model, runner_factory, dtype, shapes.specs)
    recorder = LayerRecorder(shapes.modules)
    try:
        probe.run([], [(0, FIRST_CHUNK), (1, PROBE_BLOCK_SIZE - 1)])
        probe.run_rest(*lengths)
    finally:
        recorder.close()
    _, _, ref_layers = reference_logits(model, probe.sequences(), shapes.modules)
    layer, detail = first_diverging_layer(recorder.outputs, ref_layers, probe.rows, tolerance)
    spec = shapes.specs.get(layer)
    where = (f"first at layer {layer} ({spec.module_type}: {detail})" if spec is not None
             else "in no attention layer's output (so after them: the engine's inputs or the model's head)")
    return UnsupportedModelError(
        f"{family(model)} ({type(model).__name__}) fails the engine's self-check: the engine's logits differ from "
        f"the model's own {reference!r} attention by up to {max_diff:.3g} (tolerance {tolerance:g} x logit scale "
        f"{scale:.3g} for {str(dtype).replace('torch.', '')}), {where}. Suspected feature: {suspects(model, spec)}. "
        "The engine would compute something other than this model, so it refuses to run it. " + HF_ADVICE)


def first_diverging_layer(engine_layers: dict, ref_layers: dict, rows: list[tuple[int, int]],
                          tolerance: float) -> tuple[int | None, str]:
    """The first attention layer whose outputs differ beyond the tolerance (relative to that layer's scale); the
    one that differs most when none does on its own."""
    worst = (None, -1.0, "")
    for layer in sorted(engine_layers):
        engine = torch.cat([out[0] for out in engine_layers[layer]])  # [rows, hidden]: the forwards in order
        expected = torch.stack([ref_layers[layer][s, p] for s, p in rows])
        diff = float((engine - expected).abs().max())
        relative = diff / max(float(expected.abs().max()), 1e-6)
        detail = f"max diff {diff:.3g}, {relative:.2g} of its scale"
        if not relative <= tolerance:
            return layer, detail
        if relative > worst[1]:
            worst = (layer, relative, detail)
    return worst[0], worst[2]


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
