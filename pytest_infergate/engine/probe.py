"""The self-check's probe: three short sequences through the engine's attention, watched layer by layer. Two forwards,
as the engine would schedule them: the first chunk of A with all of B and C, then A's next chunk after its cached
context with one decode each of B and C, crossing KV block boundaries and every sliding window and attention chunk
the config declares (config.py), up to PROBE_MAX_REACH tokens (beyond, the engine refuses the model). A short
probe goes through every layer, a long one through one layer of each distinct attention pattern
(one_layer_per_pattern, only_layers), its logits at the rows LogitRows keeps; a LayerWatch keeps what each layer was
handed and returned, for the self-check to recompute. How the probe is sized, and why: docs/explanation/engine.md,
'The self-check'.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.runner import KVCache
from pytest_infergate.engine.scheduler import Chunk, StepPlan
from pytest_infergate.engine.sequence import Sequence
from pytest_infergate.workloads.request import Request

PROBE_BLOCK_SIZE = 4  # small blocks: a short probe crosses several boundaries
PROBE_MAX_REACH = 4096  # Mistral's and Gemma 2's windows; a longer one is refused unless max_model_len keeps under it
FIRST_CHUNK = PROBE_BLOCK_SIZE + 1  # A's first chunk, prefilled before the windows are known

# keyword arguments some families pass that change the result and that the engine's attention does not implement
UNSUPPORTED_KWARGS = {"position_bias": "a learned position bias", "alibi": "ALiBi position biases",
                      "attention_chunk_size": "chunked attention", "head_mask": "a head mask"}
# ...and those that do not change it (or that it handles), left out of messages
QUIET_KWARGS = {"scaling", "dropout", "sliding_window", "softcap", "s_aux", "infergate_batch", "is_causal",
                "position_ids", "use_cache", "cache_position", "output_attentions", "output_router_logits",
                "output_hidden_states", "return_dict", "position_embeddings"}


@dataclass
class LayerSpec:
    """One attention layer as the probe saw it."""

    layer_idx: int
    module_type: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    value_head_dim: int
    scaling: float | None = None
    sliding_window: int | None = None
    softcap: float | None = None
    has_sinks: bool = False
    other_kwargs: list[str] = field(default_factory=list)  # further non-None kwargs it passed (for messages)

    @property
    def geometry(self) -> tuple[int, int, int]:
        """(kv heads, key head dim, value head dim): the shape of this layer's KV cache per token."""
        return self.num_kv_heads, self.head_dim, self.value_head_dim

    def features(self) -> list[str]:
        found = []
        if self.sliding_window is not None:
            found.append(f"sliding window of {self.sliding_window}")
        if self.softcap is not None:
            found.append(f"attention logit softcapping at {self.softcap:g}")
        if self.has_sinks:
            found.append("attention sinks (s_aux)")
        if self.scaling is not None and abs(self.scaling * self.head_dim ** 0.5 - 1) > 1e-6:
            found.append(f"scaling {self.scaling:.4g} (not 1/sqrt(head_dim))")
        return found + [f"kwarg {name}" for name in self.other_kwargs]


@dataclass
class LayerCall:
    """What one attention layer was handed in one forward, and what the engine's attention returned."""

    query: torch.Tensor  # [H, T, D]
    key: torch.Tensor  # [KvH, T, D]
    value: torch.Tensor  # [KvH, T, Dv]
    kwargs: dict
    output: torch.Tensor | None = None  # [T, H, Dv]


class LayerWatch:
    """The observer the probe hands the engine's attention (see AttentionBatch.observer); it sees every attention
    call. On the first forward it learns the layers (which call the interface, with what tensors and features; the
    probe's cache gets each layer as it appears); on every forward it keeps what each layer was handed and what the
    engine's attention returned, for the self-check to recompute."""

    def __init__(self, cache: KVCache | None):
        self.cache = cache  # gets each layer as it appears
        self.specs: dict[int, LayerSpec] = {}
        self.modules: dict[int, torch.nn.Module] = {}
        self.calls: dict[int, list[LayerCall]] = {}  # per layer, one per forward
        self.problems: list[str] = []

    def before(self, module, query, key, value, scaling, kwargs) -> None:
        layer = getattr(module, "layer_idx", None)
        name = type(module).__name__
        if not isinstance(layer, int):
            self.problems.append(f"its attention module {name} has no integer layer_idx to key a KV cache by")
            return
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.shape[0] != 1 \
                or query.shape[-1] != key.shape[-1] or key.shape[1] != value.shape[1] or query.shape[1] % key.shape[1]:
            self.problems.append(f"{name} passes query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                                 f"{tuple(value.shape)}: not the [batch, heads, tokens, head_dim] layout of "
                                 "transformers' attention interface")
            return
        for kwarg, feature in UNSUPPORTED_KWARGS.items():
            if kwargs.get(kwarg) is not None:
                self.problems.append(f"layer {layer} ({name}) passes `{kwarg}`: {feature}, which the engine's "
                                     "attention does not implement")
        if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
            self.problems.append(f"layer {layer} ({name}) is not causal (bidirectional attention)")
        if layer not in self.specs:
            others = sorted(k for k, v in kwargs.items() if v is not None and k not in QUIET_KWARGS)
            window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
            self.specs[layer] = LayerSpec(layer, name, query.shape[1], key.shape[1], key.shape[-1], value.shape[-1],
                                          scaling, None if window is None else int(window),
                                          None if softcap is None else float(softcap), kwargs.get("s_aux") is not None,
                                          others)
            self.modules[layer] = module
            if self.cache is not None:
                self.cache.add_layer(layer, self.specs[layer].geometry)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("infergate_batch", "position_ids")}
        call = LayerCall(query[0].detach().clone(), key[0].detach().clone(), value[0].detach().clone(),
                         dict(kwargs, scaling=scaling))
        self.calls.setdefault(layer, []).append(call)

    def after(self, module, output: torch.Tensor) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer in self.calls:
            self.calls[layer][-1].output = output.detach().clone()


class Probe:
    """The probe's sequences and their state: a small paged cache, blocks, and what each forward computed."""

    def __init__(self, model, runner_factory, dtype: torch.dtype, reach: int | None = None,
                 spans: frozenset[int] = frozenset()):
        """`spans`: with a reach, the windows and chunks the layers use. Their boundaries are where a mask error
        first shows, so logits are computed there, at each sequence's start and end and every LOGIT_STRIDE-th
        position (LogitRows); every token still goes through every layer's attention check."""
        text_config = model.config.get_text_config()
        self.reach = reach  # the longest window / chunk to cross (config.DeclaredPatterns.reach); None: none
        self.span = reach + 4 if reach else 2 * PROBE_BLOCK_SIZE  # A: past a block (and the reach)
        self.long_prefill = reach + 2 if reach else PROBE_BLOCK_SIZE - 1  # B
        lengths = [self.span, self.long_prefill + 1, 3]
        generator = torch.Generator().manual_seed(1234)
        self.ids = [torch.randint(0, text_config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
        self.blocks = BlockManager(sum(-(-n // PROBE_BLOCK_SIZE) for n in lengths), PROBE_BLOCK_SIZE)
        device = next(model.parameters()).device
        self.cache = KVCache({}, self.blocks.num_blocks * PROBE_BLOCK_SIZE, dtype, device)
        self.runner = runner_factory(self.cache, PROBE_BLOCK_SIZE)
        self.watch = LayerWatch(self.cache)
        self.seqs = [Sequence(Request(prompt_token_ids=row[:1], max_new_tokens=1), row[:1], 0.0, f"probe-{i}")
                     for i, row in enumerate(self.ids)]
        self.rows: list[list[tuple[int, int]]] = []  # per forward: (sequence, position) of each token, in order
        self.logit_rows: list[list[tuple[int, int]]] = []  # per forward: the rows whose logits were computed
        self.logits: list[torch.Tensor] = []  # per forward: [logit rows, vocab]
        self.wanted = LogitRows([len(row) for row in self.ids], spans) if reach else None  # None: every row

    def _chunk(self, index: int, count: int) -> Chunk:
        """The next `count` tokens of sequence `index`, its blocks grown to hold them."""
        seq = self.seqs[index]
        seq.prompt_token_ids = self.ids[index][:seq.num_computed_tokens + count]
        self.blocks.grow(seq.seq_id, seq.block_table, seq.num_computed_tokens + count)
        return Chunk(seq, count)

    def run(self, decodes: list[int], prefills: list[tuple[int, int]]) -> None:
        """One forward: a decode token of each sequence in `decodes`, (sequence, tokens) chunks of `prefills`."""
        plan = StepPlan(decodes=[self._chunk(i, 1) for i in decodes],
                        prefills=[self._chunk(i, n) for i, n in prefills])
        inputs = self.runner.prepare(plan, observer=self.watch)  # sorts the decodes: plan order is forward order
        rows = [(self.seqs.index(chunk.seq), chunk.seq.num_computed_tokens + i)
                for chunk in plan.chunks for i in range(chunk.num_tokens)]
        keep = None if self.wanted is None else [i for i, row in enumerate(rows) if self.wanted.has(*row)]
        self.logits.append(self.runner.run_model(inputs, all_logits=True, logit_rows=keep)[0])
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        self.rows.append(rows)
        self.logit_rows.append(rows if keep is None else [rows[i] for i in keep])

    def run_first(self) -> None:
        self.run([], [(0, FIRST_CHUNK), (1, self.long_prefill), (2, 2)])

    def run_rest(self, chunks: dict[int, int] | None = None) -> bool | None:
        """The second forward; whether the probe crossed the smallest window the layers passed or chunk the
        config declares (None: none)."""
        self.run([1, 2], [(0, self.span - FIRST_CHUNK)])
        spans = [s.sliding_window for s in self.watch.specs.values() if s.sliding_window is not None]
        spans += list((chunks or {}).values())
        return min(spans) < self.long_prefill if spans else None

    def sequences(self) -> list[list[int]]:
        """Each sequence's tokens as far as the probe ran them."""
        return [ids[:seq.num_computed_tokens] for ids, seq in zip(self.ids, self.seqs)]

    @property
    def all_rows(self) -> list[tuple[int, int]]:
        return [row for rows in self.rows for row in rows]

    @property
    def all_logit_rows(self) -> list[tuple[int, int]]:
        return [row for rows in self.logit_rows for row in rows]


LOGIT_STRIDE = 64


@dataclass(frozen=True)
class LogitRows:
    """Which (sequence, position) rows of a long probe get logits: a vocabulary of 262k makes the LM head most of a
    long probe's cost (Gemma 3), while what the logit check is for (position ids, how tokens are packed, state
    around attention) shows at every position alike. Kept: each sequence's first and last tokens, every
    LOGIT_STRIDE-th position, and two positions either side of every window or chunk boundary."""

    lengths: list[int]
    spans: frozenset[int]
    edge: int = 4

    def has(self, seq: int, pos: int) -> bool:
        return (pos < self.edge or pos >= self.lengths[seq] - self.edge or pos % LOGIT_STRIDE == 0
                or any(pos >= span - 2 and min(pos % span, span - pos % span) <= 2 for span in self.spans))


def one_layer_per_pattern(specs: dict[int, LayerSpec], chunks: dict[int, int]) -> list[int]:
    """The first layer of each distinct attention pattern, in order."""
    first: dict[tuple, int] = {}
    for index in sorted(specs):
        spec = specs[index]
        pattern = (spec.module_type, spec.geometry, spec.num_heads, spec.scaling, spec.sliding_window, spec.softcap,
                   spec.has_sinks, tuple(spec.other_kwargs), chunks.get(index))
        first.setdefault(pattern, index)
    return sorted(first.values())


@contextmanager
def only_layers(model, layers: list[int]):
    """The model cut to the decoder layers `layers` inside the block: its one ModuleList of num_hidden_layers
    entries, the config's num_hidden_layers and its per-layer lists (a `*layer*` field of num_hidden_layers
    entries: layer_types, no_rope_layers), put back after. Raises ValueError where the layer list is not found."""
    text = model.config.get_text_config()
    total = getattr(text, "num_hidden_layers", None)
    found = [(owner, name) for owner in model.modules() for name, child in owner.named_children()
             if isinstance(child, torch.nn.ModuleList) and len(child) == total]
    if not isinstance(total, int) or len(found) != 1:
        raise ValueError("the model's decoder layers are not one ModuleList of num_hidden_layers entries")
    owner, name = found[0]
    whole = getattr(owner, name)
    per_layer = {key: value for key, value in vars(text).items()  # layer_types, no_rope_layers: not eos_token_id
                 if "layer" in key and isinstance(value, list | tuple) and len(value) == total}
    try:
        setattr(owner, name, torch.nn.ModuleList([whole[i] for i in layers]))
        text.num_hidden_layers = len(layers)
        for key, value in per_layer.items():
            setattr(text, key, type(value)(value[i] for i in layers))
        yield
    finally:
        setattr(owner, name, whole)
        text.num_hidden_layers = total
        for key, value in per_layer.items():
            setattr(text, key, value)
