"""The engine checks itself on every model it is given, against the model's own attention implementation (sdpa or
eager), on a short probe (probe.py) that crosses KV block boundaries and every sliding window and attention chunk
the config declares (a config field that may change attention and that the engine does not know is refused:
config.py). Two comparisons, each with a tolerance per dtype: each attention layer's output against the model's
attention function recomputed on exactly the q, k, v the layer handed the engine (naming the first layer that
differs), and every logit against the model's own forward. Beyond a tolerance the model is refused
(UnsupportedModelError: the family, the layer, the features it uses, the largest difference). What each comparison
covers, and the tolerances: docs/explanation/engine.md, 'The self-check'.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from pytest_infergate.engine.attention import UnsupportedModelError, install, uninstall
from pytest_infergate.engine.config import DeclaredPatterns, declared_patterns, unknown_attention_fields
from pytest_infergate.engine.model_reference import HF_ADVICE, family, recompute_layer, reference_logits
from pytest_infergate.engine.probe import (
    PROBE_BLOCK_SIZE,
    PROBE_MAX_REACH,
    LayerSpec,
    LayerWatch,
    Probe,
    one_layer_per_pattern,
    only_layers,
)
from pytest_infergate.errors import OptionError

LOGITS_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # x the largest logit (>= 1)
QUANTIZED_LOGITS_TOLERANCE = 0.25
ATTENTION_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}  # x the layer's largest
CONFIG_FEATURES = ("sliding_window", "use_sliding_window", "attn_logit_softcapping", "query_pre_attn_scalar",
                   "attention_multiplier", "use_bidirectional_attention", "attention_chunk_size", "alibi")


@dataclass
class SelfCheckReport:
    reference: str  # the attention implementation the engine was compared with
    seconds: float
    num_tokens: int  # probe tokens the engine computed
    max_diff: float  # max |engine - reference| over the probe's logits
    logit_scale: float  # max |reference logit| (at least 1)
    tolerance: float  # for max_diff, relative to logit_scale
    attention_diff: float  # the largest per-layer attention difference, relative to the layer's scale
    attention_tolerance: float
    window_crossed: bool | None  # None: the model has no sliding window
    quantized: bool
    # the layers the long probe (past every window and chunk) ran through: one of every distinct attention
    # pattern, or all of them; None: no window or chunk to cross, so no long probe
    long_probe_layers: list[int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None)


def attach(model, runner_factory, dtype: torch.dtype, max_model_len: int | None = None
           ) -> tuple[dict[int, LayerSpec], SelfCheckReport]:
    """Switch the model to the engine's attention, learn its attention layers, and check the engine against the
    model's own attention. On any failure the model's attention is switched back and UnsupportedModelError
    raised. `runner_factory(cache, block_size)` makes a ModelRunner; `max_model_len` is the longest context the
    engine will serve (a window or chunk no request can outgrow needs no crossing)."""
    if model.training:
        raise OptionError(f"{family(model)} is in training mode (dropout active), so no two runs agree: call "
                          "model.eval() before handing it to the engine")
    patterns = declared_patterns(model.config)
    reach = probe_reach(model, patterns, max_model_len)
    with probe_threads(next(model.parameters()).device), without_outlier_columns(model):
        return _install_and_check(model, runner_factory, dtype, patterns, reach, max_model_len)


def probe_reach(model, patterns: DeclaredPatterns, max_model_len: int | None) -> int | None:
    """The longest window or chunk the probe must cross; refuses a config the engine cannot check."""
    unknown = unknown_attention_fields(model.config)
    if unknown:
        raise UnsupportedModelError(
            f"{family(model)} declares attention settings the engine does not implement or check: "
            f"{', '.join(unknown)}. It would compute something it never verified, so it refuses the model. "
            + HF_ADVICE)
    reach = patterns.reach(max_model_len if max_model_len is not None else 1 << 62)
    if reach is not None and reach > PROBE_MAX_REACH:
        spans = ", ".join(name for name, span in patterns.spans.items() if span == reach)
        raise UnsupportedModelError(
            f"{family(model)} declares {spans}: longer than the engine's self-check can probe ({PROBE_MAX_REACH} "
            f"tokens), while max_model_len {max_model_len} lets a request outgrow it, so that pattern would run "
            f"unverified. Set EngineConfig(max_model_len={reach}) or less (no request then reaches past it). "
            + HF_ADVICE)
    return reach


@contextmanager
def probe_threads(device: torch.device):
    """One intra-op thread for the probe on a CPU. Its forwards are a few dozen tokens, thousands of small ops
    that gain little from a second thread; on a busy machine every extra thread waits for a core at each of them
    (the cost of each: docs/explanation/engine.md)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def without_outlier_columns(model):
    """bitsandbytes LLM.int8 layers without their outlier decomposition during the probe (thresholds put back
    after). LLM.int8 runs in fp16 every input column that any token of the forward reaches the threshold (6) in, so
    a token's result depends on the other tokens of its batch: the engine's packed forward and the model's forward
    of each sequence alone ran different matmuls on the same weights. With the threshold at 0 each row is quantized
    alone (its own scale, integer products): the logit check is about what surrounds attention in the engine
    (position ids, packing, per-sequence state), which the threshold does not touch, so it then compares like with
    like. The quantized tolerance stays: int8's rounding now and then turns the engine's attention (about 1e-6 of
    its scale from the model's own) into a flipped quantization step that grows through the layers. Measured on the
    embedded model's int8 with its norm weights x (1 + s·N(0, 1)) (benchmarks/quality_power.py; docs/measurements.md):
    with the outlier columns 0.07-1.05 of the logit scale over 20 changes, 7 beyond 0.25 (refused), the model's own
    forward batched vs alone as far apart; without them 84 of 100 changes exactly equal, the others 0.03-0.12."""
    states = [m.state for m in model.modules()
              if type(getattr(m, "state", None)).__name__ == "MatmulLtState" and m.state.threshold > 0]
    thresholds = [state.threshold for state in states]
    for state in states:
        state.threshold = 0.0
    try:
        yield
    finally:
        for state, threshold in zip(states, thresholds):
            state.threshold = threshold


def _install_and_check(model, runner_factory, dtype: torch.dtype, patterns: DeclaredPatterns, reach: int | None,
                       max_model_len: int | None) -> tuple[dict[int, LayerSpec], SelfCheckReport]:
    """Two probes. A short one (15 tokens) through every layer learns the layers and checks each against the
    model's own attention. Where a window or chunk must be crossed, a long one (2 × reach + 10 tokens) runs through
    one layer of each distinct attention pattern (its window or chunk, softcapping, sinks, scaling, geometry):
    layers of one pattern run the same code of the engine, and the long probe's cost grows with every layer
    (Gemma 3's 18 layers have two patterns). A model the cut probe would refuse, or that cannot be cut, is probed
    whole: only the whole model's check refuses a model."""
    start = time.perf_counter()
    install(model)
    try:
        short = probe_and_check(model, runner_factory, dtype, None, patterns)
        specs = short.probe.watch.specs
        check_windows_reached(model, specs, (reach + 1) if reach else PROBE_BLOCK_SIZE - 2, max_model_len)
        checked, layers = [short], None
        if reach is not None:
            spans = frozenset(s.sliding_window for s in specs.values() if s.sliding_window) | frozenset(
                patterns.chunks.values())
            long, layers = None, one_layer_per_pattern(specs, patterns.chunks)
            if not FULL_LONG_PROBE and len(layers) < len(specs):
                try:
                    with only_layers(model, layers):
                        long = probe_and_check(model, runner_factory, dtype, reach, patterns, spans, layers)
                except Exception:  # noqa: BLE001 - the cut model refused or differed: the whole model decides
                    long = None
            if long is None:
                layers = sorted(specs)
                long = probe_and_check(model, runner_factory, dtype, reach, patterns, spans)
            checked.append(long)
    except BaseException:
        uninstall(model)
        raise
    worst = max(checked, key=lambda c: c.max_diff / (c.tolerance * c.scale))
    report = SelfCheckReport(worst.reference, time.perf_counter() - start,
                             sum(len(c.probe.all_rows) for c in checked), worst.max_diff, worst.scale,
                             worst.tolerance, max(c.attention_diff for c in checked),
                             ATTENTION_TOLERANCE.get(dtype, 1e-2), checked[-1].crossed,
                             is_quantized(model), layers)
    return specs, report


# the long probe through every layer instead of the short one: benchmarks/self_check.py compares the two
FULL_LONG_PROBE = False


@dataclass
class ProbeCheck:
    probe: Probe
    reference: str
    max_diff: float
    scale: float
    tolerance: float
    attention_diff: float
    crossed: bool | None


def probe_and_check(model, runner_factory, dtype: torch.dtype, reach: int | None, patterns: DeclaredPatterns,
                    spans: frozenset[int] = frozenset(), layers: list[int] | None = None) -> ProbeCheck:
    """One probe through the engine's attention, then its every layer and its logits against the model's own.
    `layers`: the model is cut to those (only_layers)."""
    probe = Probe(model, runner_factory, dtype, reach, spans)
    try:
        probe.run_first()
        error = None
    except Exception as exc:
        error = exc
    check_layers(model, probe.watch, error, layers)
    crossed = probe.run_rest(patterns.chunks)
    reference, logits = reference_logits(model, probe.sequences(), probe.all_logit_rows)
    attention_diff = check_attention(model, probe, reference, dtype, patterns.chunks)
    quantized = is_quantized(model)
    tolerance = QUANTIZED_LOGITS_TOLERANCE if quantized else LOGITS_TOLERANCE.get(dtype, 2e-2)
    engine = torch.cat(probe.logits)
    scale = max(1.0, float(logits.abs().max()))
    max_diff = float((engine - logits).abs().max())
    if not max_diff <= tolerance * scale:  # also catches nan
        raise UnsupportedModelError(
            f"{family(model)} ({type(model).__name__}) fails the engine's self-check: its attention matches the "
            f"model's own {reference!r} attention in every layer, but the logits differ by up to {max_diff:.3g} "
            f"(tolerance {tolerance:g} x logit scale {scale:.3g}), so the difference comes from around attention: "
            "how the engine packs tokens into one forward (position ids, per-sequence state). " + HF_ADVICE)
    return ProbeCheck(probe, reference, max_diff, scale, tolerance, attention_diff, crossed)


def check_layers(model, watch: LayerWatch, error: Exception | None, layers: list[int] | None = None) -> None:
    """The first forward went through the attention interface, every layer of it (of `layers` on a cut model),
    with tensors the engine takes."""
    if layers is not None:
        if error is not None or watch.problems or sorted(watch.specs) != layers:
            raise UnsupportedModelError(f"the model cut to layers {layers} did not run them as the whole model did")
        return
    if watch.problems:
        raise UnsupportedModelError(f"{family(model)} cannot run on the infergate engine: "
                                    f"{'; '.join(dict.fromkeys(watch.problems))}. " + HF_ADVICE) from error
    if error is not None:
        raise UnsupportedModelError(
            f"{family(model)} cannot run on the infergate engine: its forward failed on the engine's attention "
            f"({type(error).__name__}: {error}). " + HF_ADVICE) from error
    if not watch.specs:
        raise UnsupportedModelError(
            f"{family(model)} does not call transformers' attention interface (AttentionInterface): "
            f"{type(model).__name__} computes attention its own way (or has none, as a state-space model), so the "
            "engine's KV cache cannot plug in. " + HF_ADVICE)
    num_layers = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    if isinstance(num_layers, int) and len(watch.specs) < num_layers:
        raise UnsupportedModelError(
            f"{family(model)} cannot run on the infergate engine: only {len(watch.specs)} of its {num_layers} "
            "layers attend through transformers' attention interface; the others (state-space, recurrent or "
            "convolution blocks) carry state from token to token that the engine's KV cache does not hold. "
            + HF_ADVICE)


def check_windows_reached(model, specs: dict[int, LayerSpec], longest: int, max_model_len: int | None) -> None:
    """Every sliding window a layer passed is one the probe crosses (up to `longest`), or one no request can
    outgrow: a window the config does not declare (under another field's name) would otherwise run unchecked."""
    for spec in specs.values():
        window = spec.sliding_window
        if window is not None and window > longest and (max_model_len is None or window < max_model_len):
            raise UnsupportedModelError(
                f"{family(model)}: layer {spec.layer_idx} ({spec.module_type}) passes a sliding window of {window} "
                "tokens that its config does not declare as `sliding_window`, so the self-check's probe did not "
                "cross it and the engine refuses to run it unverified. " + HF_ADVICE)


def check_attention(model, probe: Probe, reference: str, dtype: torch.dtype, chunks: dict[int, int] | None = None
                    ) -> float:
    """Each layer's attention output against the model's own; raises at the first layer beyond the tolerance.
    Returns the largest difference seen, relative to the layers' scales."""
    tolerance = ATTENTION_TOLERANCE.get(dtype, 1e-2)
    rows = probe.all_rows
    worst = 0.0
    for layer in sorted(probe.watch.calls):
        calls, module = probe.watch.calls[layer], probe.watch.modules[layer]
        q, k, v = (torch.cat([getattr(c, part) for c in calls], dim=1) for part in ("query", "key", "value"))
        engine = torch.cat([c.output for c in calls])  # [tokens, H, Dv] in probe row order
        for s in range(len(probe.seqs)):
            order = sorted((i for i, row in enumerate(rows) if row[0] == s), key=lambda i: rows[i][1])
            expected = recompute_layer(module, reference, q[:, order], k[:, order], v[:, order], calls[0].kwargs,
                                       (chunks or {}).get(layer))
            diff = float((engine[order].float() - expected.float()).abs().max())
            relative = diff / max(float(expected.abs().max()), 1e-6)
            worst = max(worst, relative)
            if not relative <= tolerance:
                spec = probe.watch.specs[layer]
                raise UnsupportedModelError(
                    f"{family(model)} ({type(model).__name__}) fails the engine's self-check: at layer {layer} "
                    f"({spec.module_type}) the engine's attention differs from the model's own {reference!r} "
                    f"attention by up to {diff:.3g} ({relative:.2g} of the layer's scale; tolerance {tolerance:g} for "
                    f"{str(dtype).replace('torch.', '')}). Suspected feature: {suspects(model, spec)}. The engine "
                    "would compute something other than this model, so it refuses to run it. " + HF_ADVICE)
    return worst


def suspects(model, spec: LayerSpec) -> str:
    """The features of a layer (from what it passed to attention, and from the config) that may be the cause."""
    config = model.config
    found = spec.features()
    for key in CONFIG_FEATURES:
        value = getattr(config, key, None)
        if value not in (None, False):
            found.append(f"config {key}={value}")
    layer_types = getattr(config, "layer_types", None)
    if layer_types and spec.layer_idx < len(layer_types):
        found.append(f"config layer_types[{spec.layer_idx}]={layer_types[spec.layer_idx]!r}")
    return ", ".join(found) or "nothing the engine knows of (an attention variant it does not recognise)"
