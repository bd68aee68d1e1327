"""Which keys each attention layer lets a query see, as the model's config declares it, and the config fields the
engine does not know. A layer hands the engine's attention its sliding window at run time, but not an attention
chunk: Llama 4's chunked layers express theirs only in the mask transformers builds from the config, which the
engine does not use. So chunks are read from the config here, and the self-check's probe is sized from every window
and chunk the config declares (probe.py). A config field that changes attention and that the engine does not know
would run unverified: it is refused, named (`unknown_attention_fields`). Why: docs/explanation/engine.md, 'Chunked
attention' and 'What the engine does not know, it refuses'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
