"""The configuration the engine runs under: `EngineConfig`, every knob of the reference engine, validated on
construction; and what the model's config declares about attention (`declared_patterns`: its sliding windows, and the
attention chunks Llama 4's chunked layers express only in the mask transformers builds, which the engine does not
use), with the config fields that may change attention and that the engine does not know (`unknown_attention_fields`:
such a model would run unverified, so it is refused, naming them). Why: docs/explanation/engine.md, 'Chunked
attention' and 'What the engine does not know, it refuses'.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from pytest_infergate.errors import OptionError, check_bool, check_int, check_number

CACHE_MODES = ("paged", "contiguous", "none")
BATCHING_MODES = ("sequential", "static", "dynamic", "continuous")
# what runs a model's workloads (engine.backends.choose_backend): the engine's names, which --infergate-backend offers
BACKENDS = ("auto", "engine", "hf")


@dataclass
class EngineConfig:
    """
    cache_mode: `paged` grows each sequence's KV cache block by block; `contiguous` reserves a sequence's whole
        maximum length (prompt + max_new_tokens) when it is admitted, as a per-batch contiguous cache does;
        `none` keeps no cache and recomputes the whole prefix at every step (the use_cache=False experiment).
    batching: `sequential` one request at a time; `static` batches of `max_batch_size`, padded, run until the
        longest finishes; `dynamic` collects requests for up to `window_ms` (or `max_batch_size`), then runs them
        as a static batch; `continuous` schedules every step: finished sequences leave, waiting ones join, prefill
        and decode share one forward under `max_batched_tokens`, long prompts are prefilled in chunks.
    kv_budget_bytes / kv_budget_blocks: the KV memory the engine may allocate (one of them). Default: under
        `infergate_bench`, sized from the workload (runner.workload_kv_shape), so the peak memory a test
        reports is its model's and workload's, not a fixed allowance; elsewhere 1 GiB.
    prefix_caching: reuse the KV blocks of prompt prefixes computed before (a shared system prompt, few-shot
        examples, a document asked several questions) instead of computing them again; paged cache with
        continuous or sequential batching. Off by default, so measurements of repeated prompts stay comparable.
    decode_group_size: decoding sequences attended by one attention call per layer, grouped by context length.
        Default (None): 8 on the CPU, where decode attention is bound by reading the cache and padding a group to
        its longest member costs bandwidth; every decoding sequence at once on CUDA, where a small model is bound
        by kernel launches and one call per layer is what the serving engines do. A step replayed from a CUDA graph
        attends all its decoding sequences in one call whatever this is.
    cuda_graphs: replay decode steps from CUDA graphs captured per batch/context bucket (decode_graphs.py).
        Default (None): on for a model on CUDA, where each graph is checked against the eager forward when the
        engine is built (a failed capture or check turns them off, `Engine.cuda_graphs` says why); False: off;
        True on a device other than CUDA is an error.
    """

    cache_mode: str = "paged"
    batching: str = "continuous"
    max_batch_size: int = 32
    max_batched_tokens: int = 2048
    prefill_chunk_size: int = 512
    block_size: int = 16
    kv_budget_bytes: int | None = None
    kv_budget_blocks: int | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings, at most 8192
    max_input_tokens: int | None = None  # default: max_model_len - 1
    truncate_input: bool = False  # over-long prompts: reject (default) or keep the last max_input_tokens
    max_new_tokens_limit: int | None = None  # requests asking for more are clamped to this
    max_queue_len: int | None = None  # waiting requests beyond this are rejected ("queue full")
    window_ms: float = 20.0
    length_bucketing: bool = False  # static/dynamic: group requests of similar prompt length
    max_length_spread: int | None = None  # static/dynamic: max prompt-length difference inside one batch
    schedule_by_tokens: bool = False  # static/dynamic: cap a batch by prompt tokens (max_batched_tokens) too
    prefix_caching: bool = False
    record_steps: bool = True
    decode_group_size: int | None = None
    cuda_graphs: bool | None = None
    # set by the bench when it sized kv_budget_blocks from the workload: the budget may then hold less than
    # max_model_len (a request beyond it is rejected saying so); not a user's setting, so not in to_dict()
    kv_sized_for_workload: bool = field(default=False, repr=False)

    def __post_init__(self):
        if self.cache_mode not in CACHE_MODES:
            raise OptionError(f"EngineConfig.cache_mode {self.cache_mode!r}: choose from {', '.join(CACHE_MODES)}")
        if self.batching not in BATCHING_MODES:
            raise OptionError(f"EngineConfig.batching {self.batching!r}: choose from {', '.join(BATCHING_MODES)}")
        for name in ("max_batch_size", "max_batched_tokens", "prefill_chunk_size", "block_size"):
            setattr(self, name, check_int(OptionError, f"EngineConfig.{name}", getattr(self, name), 1,
                                          rule="positive (an int >= 1)"))
        for name in ("kv_budget_bytes", "kv_budget_blocks", "max_model_len", "max_input_tokens",
                     "max_new_tokens_limit", "max_queue_len", "max_length_spread", "decode_group_size"):
            setattr(self, name, check_int(OptionError, f"EngineConfig.{name}", getattr(self, name), 1, optional=True,
                                          rule="positive (an int >= 1) or None"))
        self.window_ms = check_number(OptionError, "EngineConfig.window_ms", self.window_ms, minimum=0)
        for name in ("truncate_input", "length_bucketing", "schedule_by_tokens", "prefix_caching", "record_steps"):
            check_bool(OptionError, f"EngineConfig.{name}", getattr(self, name))
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise OptionError(f"EngineConfig.cuda_graphs must be True, False or None (on with CUDA), got "
                              f"{self.cuda_graphs!r}")
        if self.kv_budget_bytes is not None and self.kv_budget_blocks is not None:
            raise OptionError("EngineConfig: give kv_budget_bytes or kv_budget_blocks, not both")
        if self.prefix_caching and (self.cache_mode != "paged" or self.batching not in ("continuous", "sequential")):
            raise OptionError("EngineConfig.prefix_caching needs cache_mode='paged' and continuous or sequential "
                              f"batching, got cache_mode={self.cache_mode!r}, batching={self.batching!r}")
        if self.batching == "sequential":
            self.max_batch_size = 1

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["kv_sized_for_workload"]
        return data


# ---- what the model's config declares about attention -----------------------------------------------------------
# the layer types transformers' mask functions know and the engine implements
KNOWN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
# a config field whose name says it may change which keys a query sees, or how it weighs them
ATTENTION_FIELD = re.compile(r"window|chunk|alibi|sink|softcap|bidirect|causal|local_att|global_att|attn_type|"
                             r"attention_type|position_bias|relative_att|attention_pattern|swa_|attn_config")
# ...those the engine implements, or that do not touch attention (checked by the self-check all the same)
KNOWN_FIELDS = frozenset({
    "sliding_window", "use_sliding_window", "max_window_layers", "sliding_window_pattern", "_sliding_window_pattern",
    "attention_chunk_size",
    "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention",  # non-causal: refused
    "chunk_size_feed_forward", "mamba_chunk_size",  # feed-forward chunking, state-space kernels: no attention
})


@dataclass(frozen=True)
class DeclaredPatterns:
    """What the config declares: the attention chunk of each chunked layer, and the sliding windows in use."""

    chunks: dict[int, int] = field(default_factory=dict)  # layer index -> attention chunk size
    windows: tuple[int, ...] = ()

    @property
    def spans(self) -> dict[str, int]:
        """Each declared window and chunk, named by its config field (for messages)."""
        out = {f"sliding_window={w}": w for w in self.windows}
        out.update({f"attention_chunk_size={c}": c for c in set(self.chunks.values())})
        return out

    def reach(self, max_model_len: int) -> int | None:
        """The longest window or chunk a request the engine accepts can outgrow (None: none can)."""
        effective = [span for span in self.spans.values() if span < max_model_len]
        return max(effective) if effective else None


def declared_patterns(config) -> DeclaredPatterns:
    """A layer hands the engine's attention its sliding window at run time, but not an attention chunk: so chunks are
    read from the config here, and the self-check's probe is sized from every window and chunk it declares."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or []
    chunk = getattr(text, "attention_chunk_size", None)
    chunks = {}
    if isinstance(chunk, int) and chunk > 0:
        chunks = {i: chunk for i, kind in enumerate(layer_types) if kind == "chunked_attention"}
    window = getattr(text, "sliding_window", None)
    uses_window = getattr(text, "use_sliding_window", True) is not False
    windows = (window,) if isinstance(window, int) and window > 0 and uses_window else ()
    return DeclaredPatterns(chunks, windows)


def unknown_attention_fields(config) -> list[str]:
    """Config fields, set to something, that may change attention and that the engine does not know; and
    `layer_types` entries of attention kinds it does not implement. Empty for every family the engine runs."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    values = text.to_dict() if hasattr(text, "to_dict") else dict(vars(text))
    unknown = [f"{name}={value!r}" for name, value in sorted(values.items())
               if ATTENTION_FIELD.search(name) and name not in KNOWN_FIELDS and value not in (None, False, 0, [], {})]
    layer_types = values.get("layer_types") or []
    kinds = sorted({kind for kind in layer_types if isinstance(kind, str) and "attention" in kind} - KNOWN_LAYER_TYPES)
    unknown += [f"layer_types entry {kind!r}" for kind in kinds]
    chunk = values.get("attention_chunk_size")
    if isinstance(chunk, int) and chunk > 0 and "chunked_attention" not in layer_types:
        # a chunk with no layer said to use it: which layers are chunked is not known, so nothing is assumed
        unknown.append(f"attention_chunk_size={chunk} without a 'chunked_attention' entry in layer_types")
    return unknown
