"""The engine's attention: the function registered with transformers' `AttentionInterface`, what one forward hands
it (`AttentionBatch`: which cached keys each query token reads) and its installation on a model. Any model family
whose attention layers call that interface (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...) runs on the engine's paged
KV cache without per-model code. What a layer hands over is honoured: `scaling`, `sliding_window` (per layer: Gemma
2/3, Mistral, Qwen2, Cohere2, gpt-oss interleave local and global layers), `softcap` (Gemma 2) and `s_aux`
(attention sinks, gpt-oss). Layers without softcap or sinks run on `scaled_dot_product_attention`; the others on an
explicit masked softmax that follows transformers' eager implementations step by step.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pytest_infergate.errors import InfergateError

ATTENTION_NAME = "infergate_paged"


class UnsupportedModelError(InfergateError):
    """The engine cannot run this model exactly: its attention does not go through transformers' attention
    interface, hands over something the engine does not implement, or fails the engine's self-check."""


# ---- what one forward's attention needs -------------------------------------------------------------------------
@dataclass
class DecodeRows:
    """Decoding sequences attended together; each feeds one query token."""

    start: int  # first of their query tokens in the flattened forward
    tables: torch.Tensor  # [count, max blocks] block ids (CPU; short tables padded with block 0)
    lengths: torch.Tensor  # [count] context lengths, the new token included (CPU)


@dataclass
class PrefillRows:
    """A prefill chunk of one sequence: `q_len` tokens after `ctx_len` already cached ones."""

    q_start: int  # first query token of this chunk in the flattened forward
    q_len: int
    ctx_len: int
    table: torch.Tensor | None  # [blocks] block ids (CPU); None without a cache


@dataclass
class DecodeGroup:
    start: int
    count: int
    slots: torch.Tensor  # [count * length] cache slots of the keys each query reads
    length: int  # keys per query, padded to the group's longest
    mask: torch.Tensor | None  # [count, 1, 1, length] bool; None when no query has padding


@dataclass
class PrefillSegment:
    q_start: int
    q_len: int
    slots: torch.Tensor | None  # cache slots of the keys; None: the keys are this chunk's own new keys
    mask: torch.Tensor | None  # [q_len, num keys] bool; None with is_causal (or a single query)
    is_causal: bool


@dataclass
class Layout:
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSegment]


@dataclass
class AttentionBatch:
    """What one forward's attention needs: which cached keys each query token attends to. The runner describes the
    sequences (block tables, context lengths); one forward's query tokens are flattened (batch dimension 1) as
        [ decode tokens (one per sequence, by context length) | prefill chunks ... | padding tokens (static batching) ]
    and each attention layer asks for the key layout of its own window or chunk, `batch.layout(window, chunk)`,
    built once per forward and (window, chunk) and shared by every layer with them. Decoding sequences are attended
    in groups of similar length: on a CPU decode attention is bound by reading the cached K/V, and padding a group to
    its longest member costs far less than padding the whole batch. Which keys a window or chunk sees, and the
    measured gain: docs/explanation/engine.md, 'Which keys each query reads' and 'Decode attention'."""

    cache: object | None  # KVCache, or None (cache_mode 'none', and the engine's shape probe)
    block_size: int
    device: torch.device
    num_real_tokens: int = 0  # tokens whose K/V go to the cache (decode + prefill)
    slot_mapping: torch.Tensor | None = None  # [num_real_tokens] cache slot of each real token
    decode_rows: list[DecodeRows] = field(default_factory=list)
    prefill_rows: list[PrefillRows] = field(default_factory=list)
    num_padding: int = 0
    max_context: int = 0  # longest context of any sequence in this forward
    observer: object | None = None  # called with every attention call's arguments (the engine's shape probe)
    chunk_sizes: dict = field(default_factory=dict)  # layer index -> attention chunk size (config.py)
    # CUDA graphs (decode_graphs.py): every layout made before capture, in fixed buffers; any other is an error
    frozen: bool = False
    _layouts: dict = field(default_factory=dict)

    def layout(self, window: int | None, chunk: int | None = None) -> Layout:
        if window is not None and window >= self.max_context:
            window = None  # no query reaches past the window: the full layout, shared with full-attention layers
        if chunk is not None and chunk >= self.max_context:
            chunk = None  # every position is in the first chunk
        key = window if chunk is None else (window, chunk)  # a window alone keys as before (CUDA graphs' layouts)
        if key not in self._layouts:
            if self.frozen:
                raise RuntimeError(f"a layer asked for a sliding window of {window} tokens (attention chunk {chunk}), "
                                   "which the engine's CUDA graph was not built for: run with "
                                   "EngineConfig(cuda_graphs=False) and report it")
            self._layouts[key] = Layout([self._decode_group(rows, window, chunk) for rows in self.decode_rows],
                                        [self._prefill_segment(rows, window, chunk) for rows in self.prefill_rows])
        return self._layouts[key]

    def _decode_group(self, rows: DecodeRows, window: int | None, chunk: int | None = None) -> DecodeGroup:
        slots, valid = decode_keys(rows, window, self.block_size, chunk=chunk)
        count, length = valid.shape
        mask = None if bool(valid.all()) else valid.view(count, 1, 1, length).to(self.device)
        return DecodeGroup(rows.start, count, slots.reshape(-1).to(self.device), length, mask)

    def _prefill_segment(self, rows: PrefillRows, window: int | None, chunk: int | None = None) -> PrefillSegment:
        start, n = rows.ctx_len, rows.q_len
        if start == 0 and (window is None or n <= window) and (chunk is None or n <= chunk):
            return PrefillSegment(rows.q_start, n, None, None, is_causal=n > 1)
        first_key = 0 if window is None else max(0, start + 1 - window)  # the first query's oldest visible key
        if chunk is not None:
            first_key = max(first_key, start // chunk * chunk)  # ...and the first key of its chunk
        key_pos = torch.arange(first_key, start + n).unsqueeze(0)  # [1, keys]
        query_pos = torch.arange(start, start + n).unsqueeze(1)  # [n, 1]
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        if chunk is not None:
            mask &= key_pos // chunk == query_pos // chunk
        slots = None  # nothing cached before the chunk: its keys are its own
        if start:
            slots = cache_slots(rows.table.unsqueeze(0), key_pos, self.block_size)[0].to(self.device)
        return PrefillSegment(rows.q_start, n, slots, mask.to(self.device), is_causal=False)


def decode_keys(rows: DecodeRows, window: int | None, block_size: int, length: int | None = None,
                chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of the keys each decoding query reads, and which of them it attends to: ([n, length] slots,
    [n, length] bool), on the CPU. `length` defaults to the most keys any query sees; a longer one pads (the CUDA
    graphs' fixed shapes). A padded key reads the query's first key again; the mask hides it."""
    lengths = rows.lengths
    keep = lengths if window is None else lengths.clamp(max=window)  # [n] keys each query sees
    if chunk is not None:  # the query (at position length - 1) sees its own chunk up to itself
        keep = torch.minimum(keep, (lengths - 1) % chunk + 1)
    first = lengths - keep  # [n] position of each query's first key
    length = int(keep.max()) if length is None else length
    offsets = torch.arange(length)
    valid = offsets.unsqueeze(0) < keep.unsqueeze(1)  # [n, length]
    positions = first.unsqueeze(1) + torch.where(valid, offsets.unsqueeze(0), 0)
    return cache_slots(rows.tables, positions, block_size), valid


def cache_slots(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """tables [n, blocks] of block ids, positions [n, L] -> the cache slots [n, L] holding those positions."""
    return tables.gather(1, positions // block_size) * block_size + positions % block_size


# ---- the math ---------------------------------------------------------------------------------------------------
def softcap_scores(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's attention logit softcapping: cap * tanh(scores / cap), applied before the mask."""
    return torch.tanh(scores / cap) * cap


def sdpa(q, k, v, mask, is_causal: bool, scale: float | None) -> torch.Tensor:
    """q: [B, H, T, D]; k, v: [B, KvH, S, D]; mask broadcastable to [B, H, T, S] -> [B, H, T, D]."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)


def masked_softmax_attention(q, k, v, mask, is_causal: bool, scale: float | None, softcap: float | None,
                             sinks: torch.Tensor | None) -> torch.Tensor:
    """The eager path for softcapping and sinks. q: [B, H, T, D]; k: [B, KvH, S, D]; v: [B, KvH, S, Dv]; mask
    [B|1, 1, T|1, S] or [T, S] -> [B, H, T, Dv]. The heads sharing a KV head are folded into the query axis (no
    repeated K/V)."""
    batch, num_heads, length, head_dim = q.shape
    num_kv, keys, value_dim = k.shape[1], k.shape[2], v.shape[-1]
    groups = num_heads // num_kv
    scale = head_dim ** -0.5 if scale is None else scale
    scores = (q.reshape(batch, num_kv, groups * length, head_dim) @ k.transpose(-1, -2)) * scale
    scores = scores.view(batch, num_kv, groups, length, keys)
    if softcap is not None:
        scores = softcap_scores(scores, softcap)
    if is_causal:
        mask = torch.ones(length, keys, dtype=torch.bool, device=q.device).tril(keys - length)
    if mask is not None:
        mask = mask.view(-1, 1, 1, *mask.shape[-2:]) if mask.dim() == 4 else mask
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:  # one more logit per head in the denominator, dropped after the softmax (gpt-oss)
        sink = sinks.view(1, num_kv, groups, 1, 1).expand(batch, -1, -1, length, 1).to(scores.dtype)
        combined = torch.cat([scores, sink], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    out = probs.to(v.dtype).view(batch, num_kv, groups * length, keys) @ v
    return out.view(batch, num_heads, length, value_dim)


# ---- the attention function -------------------------------------------------------------------------------------
def infergate_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                        scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """query: [1, H, T, D]; key, value: [1, KvH, T, D] for the new tokens only. Returns ([1, T, H, D], None)."""
    batch: AttentionBatch | None = kwargs.get("infergate_batch")
    if batch is None:
        raise RuntimeError("infergate attention called without an AttentionBatch: the model was switched to the "
                           "infergate engine's attention but called outside the engine. Restore the previous "
                           "attention implementation (Engine.close()) before using the model directly")
    if batch.observer is not None:
        batch.observer.before(module, query, key, value, scaling, kwargs)
    window, softcap, sinks = kwargs.get("sliding_window"), kwargs.get("softcap"), kwargs.get("s_aux")
    q, k, v = query[0], key[0], value[0]  # [H, T, D], [KvH, T, D]
    num_heads, total, head_dim = q.shape
    num_kv, value_dim = k.shape[0], v.shape[-1]
    out = q.new_empty(total, num_heads, value_dim)
    layer = module.layer_idx
    cache = batch.cache
    real = batch.num_real_tokens
    if cache is not None and batch.slot_mapping is not None:
        cache.write(layer, batch.slot_mapping, k[:, :real].transpose(0, 1), v[:, :real].transpose(0, 1))
    eager = softcap is not None or sinks is not None

    def attend(qs, ks, vs, mask, is_causal):
        if eager:
            return masked_softmax_attention(qs, ks, vs, mask, is_causal, scaling, softcap, sinks)
        return sdpa(qs, ks, vs, mask, is_causal, scaling)

    layout = batch.layout(window, batch.chunk_sizes.get(layer))
    for group in layout.decode_groups:
        n, length = group.count, group.length
        ck = cache.k[layer].index_select(0, group.slots).view(n, length, num_kv, head_dim).transpose(1, 2)
        cv = cache.v[layer].index_select(0, group.slots).view(n, length, num_kv, value_dim).transpose(1, 2)
        qd = q[:, group.start:group.start + n].transpose(0, 1)  # [n, H, D]
        if eager:
            od = attend(qd.unsqueeze(2), ck, cv, group.mask, False)
        else:
            # one query token per sequence: fold the query heads of each KV group into the query-length axis, so
            # attention runs on the KV heads without repeating K/V (transformers' pack_gqa trick)
            od = sdpa(qd.reshape(n, num_kv, num_heads // num_kv, head_dim), ck, cv, group.mask, False, scaling)
        out[group.start:group.start + n] = od.reshape(n, num_heads, value_dim)

    for seg in layout.prefills:
        chunk = slice(seg.q_start, seg.q_start + seg.q_len)
        qs = q[:, chunk].unsqueeze(0)
        if seg.slots is None:  # the chunk's own keys: nothing before it is cached
            ks, vs = k[:, chunk].unsqueeze(0), v[:, chunk].unsqueeze(0)
        else:
            keys = len(seg.slots)
            ks = cache.k[layer].index_select(0, seg.slots).view(1, keys, num_kv, head_dim).transpose(1, 2)
            vs = cache.v[layer].index_select(0, seg.slots).view(1, keys, num_kv, value_dim).transpose(1, 2)
        out[chunk] = attend(qs, ks, vs, seg.mask, seg.is_causal)[0].transpose(0, 1)

    if batch.num_padding:
        # wasted work of padded batches: the padding tokens attend to each other, and nothing reads the result
        pad = slice(total - batch.num_padding, total)
        op = sdpa(q[:, pad].unsqueeze(0), k[:, pad].unsqueeze(0), v[:, pad].unsqueeze(0), None, True, scaling)
        out[pad] = op[0].transpose(0, 1)
    if batch.observer is not None:
        batch.observer.after(module, out)
    return out.unsqueeze(0), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, infergate_attention)


# ---- installing it on a model -----------------------------------------------------------------------------------
def original_attention(model) -> str | None:
    """The model's own attention implementation (the one before any engine switched it)."""
    if getattr(model, "_infergate_engines", 0):
        return model._infergate_original_attention
    return getattr(model.config, "_attn_implementation", None)


def install(model) -> None:
    """Switch the model to the engine's attention. Engines on one model may overlap and close in any order: the
    first one remembers the model's own implementation, the last one to close puts it back (`uninstall`)."""
    users = getattr(model, "_infergate_engines", 0)
    if users == 0:
        model._infergate_original_attention = getattr(model.config, "_attn_implementation", None)
    model._infergate_engines = users + 1
    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)


def uninstall(model) -> None:
    model._infergate_engines -= 1
    original = getattr(model, "_infergate_original_attention", None)
    if model._infergate_engines == 0 and original:
        model.set_attn_implementation(original)


@contextmanager
def own_attention(model):
    """The model's own attention for the duration of the block (an engine on it may have switched it)."""
    switched = getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME
    own = original_attention(model)
    if switched and own:
        model.set_attn_implementation(own)
    try:
        yield
    finally:
        if switched and own:
            model.set_attn_implementation(ATTENTION_NAME)
