"""The model's own computation, that the engine's self-check compares with (self_check.py): its logits over whole
sequences, and one attention layer recomputed with its own attention function and transformers' own masks."""

from __future__ import annotations

import sys

import torch

from pytest_infergate.engine.attention import ATTENTION_NAME, UnsupportedModelError, original_attention

HF_ADVICE = ("The gates still run on it through transformers' own generate: choose the HF backend "
             "(--infergate-backend hf; `auto` falls back to it), or run the engine on another family.")


def family(model) -> str:
    return f"model family {getattr(model.config, 'model_type', '?')!r}"


@torch.inference_mode()
def reference_logits(model, sequences: list[list[int]], rows: list[tuple[int, int]]) -> tuple[str, torch.Tensor]:
    """The model's own logits [len(rows), vocab] at the (sequence, position) `rows` (one forward per sequence,
    computing logits at its rows only), with its own attention implementation (sdpa or eager; eager when the
    other refuses, e.g. sdpa with softcapping)."""
    own = original_attention(model)
    candidates = [own] if own and own != ATTENTION_NAME else []
    candidates += [name for name in ("sdpa", "eager") if name not in candidates]
    device = next(model.parameters()).device
    wanted = [sorted({p for s, p in rows if s == index}) for index in range(len(sequences))]
    error = None
    for name in candidates:
        try:
            model.set_attn_implementation(name)
            found = {}
            for index, (row, positions) in enumerate(zip(sequences, wanted)):
                if not positions:
                    continue
                out = model(input_ids=torch.tensor([row], device=device),
                            attention_mask=torch.ones(1, len(row), dtype=torch.long, device=device),
                            position_ids=torch.arange(len(row), device=device).unsqueeze(0), use_cache=False,
                            logits_to_keep=torch.tensor(positions, device=device))
                found.update({(index, p): logits for p, logits in zip(positions, out.logits[0].float())})
            return name, torch.stack([found[row] for row in rows])
        except Exception as exc:  # the next implementation may support what this one refused
            error = exc
        finally:
            model.set_attn_implementation(ATTENTION_NAME)
    raise UnsupportedModelError(f"{family(model)}: its own attention implementations {candidates} all failed on the "
                                f"engine's self-check probe ({error}), so the engine cannot be checked against it. "
                                + HF_ADVICE) from error


def attention_functions(module, name: str) -> list:
    """The model's own attention functions to recompute a layer with: `name`'s, then eager (from the layer's
    modeling file) for what `name` refuses (sdpa refuses softcapping)."""
    from transformers import AttentionInterface

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    registry = AttentionInterface()
    named = eager if name == "eager" else (registry[name] if name in registry else registry["sdpa"])
    return [fn for fn in (named, eager) if fn is not None]


def layer_mask(length: int, window: int | None, eager: bool, dtype: torch.dtype, device,
               chunk: int | None = None) -> torch.Tensor:
    """[1, 1, L, L] with transformers' own mask functions: bool (sdpa) or additive (eager)."""
    from transformers.masking_utils import causal_mask_function, chunked_overlay, sliding_window_overlay

    q_idx, kv_idx = torch.arange(length, device=device).unsqueeze(1), torch.arange(length, device=device)
    allowed = causal_mask_function(0, 0, q_idx, kv_idx)
    if window is not None:
        allowed = allowed & sliding_window_overlay(window)(0, 0, q_idx, kv_idx)
    if chunk is not None:
        allowed = allowed & chunked_overlay(chunk, torch.zeros(1, dtype=torch.long, device=device))(0, 0, q_idx,
                                                                                                   kv_idx)
    allowed = allowed.view(1, 1, length, length)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min) \
        if eager else allowed


@torch.inference_mode()
def recompute_layer(module, name: str, q, k, v, kwargs: dict, chunk: int | None = None) -> torch.Tensor:
    """The model's own attention over one whole sequence: q [H, L, D], k/v [KvH, L, D] -> [L, H, Dv]."""
    error = None
    for fn in attention_functions(module, name):
        eager = fn.__name__ == "eager_attention_forward"
        mask = layer_mask(q.shape[1], kwargs.get("sliding_window"), eager, q.dtype, q.device, chunk)
        try:
            out, _ = fn(module, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, **{**kwargs, "dropout": 0.0})
            return out[0]
        except Exception as exc:  # e.g. sdpa refusing softcap: eager next
            error = exc
    raise UnsupportedModelError(f"the model's own attention could not recompute layer {module.layer_idx} for the "
                                f"engine's self-check: {error}") from error
