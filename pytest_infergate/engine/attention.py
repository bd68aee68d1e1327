"""The engine's attention function, registered with transformers' `AttentionInterface`, and its installation.

Any model family whose attention layers call that interface (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...) runs
on the engine's paged KV cache without per-model code: the function writes the new tokens' K/V into the cache
and attends each query token to the keys its layer lets it see. What the layer hands over is honoured:
`scaling`, `sliding_window` (per layer: Gemma 2/3, Mistral, Qwen2, Cohere2, gpt-oss interleave local and global
layers), `softcap` (attention logit softcapping, Gemma 2) and `s_aux` (attention sinks, gpt-oss). Layers
without softcap or sinks run on `scaled_dot_product_attention`; the others on an explicit masked softmax that
follows transformers' eager implementations step by step.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from pytest_infergate.engine.attention_batch import AttentionBatch
from pytest_infergate.errors import InfergateError

ATTENTION_NAME = "infergate_paged"


class UnsupportedModelError(InfergateError):
    """The engine cannot run this model exactly: its attention does not go through transformers' attention
    interface, hands over something the engine does not implement, or fails the engine's self-check."""


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
