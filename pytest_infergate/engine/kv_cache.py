"""KV cache tensors and the attention function that reads and writes them.

The cache is one flat slot tensor per layer, `k[layer]: [num_slots, kv_heads, head_dim]`; the block manager maps
a sequence's token positions to slots. The attention function is registered with transformers'
`AttentionInterface`, so any model family whose attention layers call that interface (Llama, Qwen2, Mistral,
Gemma, ...) runs on this cache without per-model code. The runner hands it an `AttentionBatch` per forward.

Layout of one forward's query tokens (batch dimension 1, tokens flattened):
    [ decode tokens (one per sequence, by context length) | prefill chunks ... | padding tokens (static batching) ]

Decode attention reads every cached K/V of the batch, so on a CPU it is bound by memory bandwidth. Decoding
sequences are therefore attended in groups of similar length: padding a group to its longest member costs far
less than padding the whole batch to the longest sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTENTION_NAME = "infergate_paged"


@dataclass
class PrefillSegment:
    q_start: int  # first query token of this chunk in the flattened forward
    q_len: int
    ctx_len: int  # tokens of this sequence already cached before this chunk
    ctx_slots: torch.Tensor | None = None  # slots of positions [0, ctx_len + q_len) when ctx_len > 0
    mask: torch.Tensor | None = None  # [q_len, ctx_len + q_len] bool, causal with offset


@dataclass
class DecodeGroup:
    """Decode sequences of similar context length, attended together (padding only to the group's longest)."""

    start: int  # first of their query tokens in the flattened forward
    count: int
    slots: torch.Tensor  # [count * length] flattened slot table
    length: int  # longest context in the group
    mask: torch.Tensor | None = None  # [count, 1, 1, length] bool, None if all have the same length


@dataclass
class AttentionBatch:
    cache: "KVCache | None"
    num_real_tokens: int  # tokens whose K/V go to the cache (decode + prefill)
    slot_mapping: torch.Tensor | None  # [num_real_tokens] cache slot of each real token
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    num_padding: int = 0


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str):
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    num_kv_heads, head_dim = kv_geometry(config)
    return 2 * config.num_hidden_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def kv_geometry(config) -> tuple[int, int]:
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return num_kv_heads, head_dim


def infergate_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                        scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """query: [1, H, T, D]; key, value: [1, KvH, T, D] for the new tokens only. Returns ([1, T, H, D], None)."""
    batch: AttentionBatch | None = kwargs.get("infergate_batch")
    if batch is None:
        raise RuntimeError("infergate attention called without an AttentionBatch: the model was switched to the "
                           "infergate engine's attention but called outside the engine. Restore the previous "
                           "attention implementation (Engine.close()) before using the model directly")
    q, k, v = query[0], key[0], value[0]  # [H, T, D], [KvH, T, D]
    num_heads, total, head_dim = q.shape
    groups = num_heads // k.shape[0]
    out = q.new_empty(total, num_heads, head_dim)
    real = batch.num_real_tokens
    cache = batch.cache
    layer = module.layer_idx
    if cache is not None and batch.slot_mapping is not None:
        cache.k[layer].index_copy_(0, batch.slot_mapping, k[:, :real].transpose(0, 1))
        cache.v[layer].index_copy_(0, batch.slot_mapping, v[:, :real].transpose(0, 1))

    kvh = k.shape[0]
    for group in batch.decode_groups:
        n, length = group.count, group.length
        ck = cache.k[layer].index_select(0, group.slots).view(n, length, kvh, head_dim)
        cv = cache.v[layer].index_select(0, group.slots).view(n, length, kvh, head_dim)
        # one query token per sequence: fold the query heads of each KV group into the query-length axis,
        # so attention runs on the KV heads without repeating K/V (transformers' pack_gqa trick)
        qd = q[:, group.start:group.start + n].transpose(0, 1).reshape(n, kvh, groups, head_dim)
        od = F.scaled_dot_product_attention(qd, ck.transpose(1, 2), cv.transpose(1, 2), attn_mask=group.mask,
                                            scale=scaling)
        out[group.start:group.start + n] = od.reshape(n, num_heads, head_dim)

    for seg in batch.prefills:
        qs = q[:, seg.q_start:seg.q_start + seg.q_len].unsqueeze(0)
        if seg.ctx_len == 0:
            ks = k[:, seg.q_start:seg.q_start + seg.q_len].unsqueeze(0)
            vs = v[:, seg.q_start:seg.q_start + seg.q_len].unsqueeze(0)
            os_ = F.scaled_dot_product_attention(qs, ks, vs, is_causal=seg.q_len > 1, scale=scaling, enable_gqa=True)
        else:
            n = seg.ctx_len + seg.q_len
            ks = cache.k[layer].index_select(0, seg.ctx_slots).view(1, n, kvh, head_dim).transpose(1, 2)
            vs = cache.v[layer].index_select(0, seg.ctx_slots).view(1, n, kvh, head_dim).transpose(1, 2)
            os_ = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seg.mask, scale=scaling, enable_gqa=True)
        out[seg.q_start:seg.q_start + seg.q_len] = os_[0].transpose(0, 1)

    if batch.num_padding:
        # wasted work of padded batches: the padding tokens attend to each other, and nothing reads the result
        pad = slice(total - batch.num_padding, total)
        op = F.scaled_dot_product_attention(q[:, pad].unsqueeze(0), k[:, pad].unsqueeze(0), v[:, pad].unsqueeze(0),
                                            is_causal=True, scale=scaling, enable_gqa=True)
        out[pad] = op[0].transpose(0, 1)
    return out.unsqueeze(0), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, infergate_attention)
