"""KV cache tensors: one flat slot tensor per attention layer, `k[layer]: [num_slots, kv_heads, head_dim]`.

The block manager maps a sequence's token positions to slots. Each layer's geometry is what the model's attention
actually hands over (the engine's shape probe records it), not what the config claims: GPT-2 and OPT ignore a
config's `head_dim`, some families give layers different head counts.
"""

from __future__ import annotations

import torch

DEFAULT_KV_BUDGET_BYTES = 1 << 30


class KVCache:
    def __init__(self, geometry: dict[int, tuple[int, int]], num_slots: int, dtype: torch.dtype,
                 device: torch.device | str):
        """geometry: layer index -> (kv heads, head dim)."""
        size = max(geometry) + 1 if geometry else 0
        self.k: list[torch.Tensor | None] = [None] * size
        self.v: list[torch.Tensor | None] = [None] * size
        for layer, (num_kv_heads, head_dim) in geometry.items():
            self.k[layer] = torch.zeros((num_slots, num_kv_heads, head_dim), dtype=dtype, device=device)
            self.v[layer] = torch.zeros((num_slots, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.num_slots = num_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [T]; k, v: [T, kv_heads, head_dim]."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


def kv_geometry(config) -> tuple[int, int]:
    """(kv heads, head dim) as a config states them (the engine itself uses what its shape probe saw)."""
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return num_kv_heads, head_dim


def kv_bytes_per_token(geometry, dtype: torch.dtype) -> int:
    """2 (K and V) x sum over layers of kv_heads x head_dim x bytes per element. `geometry`: layer index ->
    (kv heads, head dim), or a model config (every layer as the config states it)."""
    if not isinstance(geometry, dict):
        geometry = dict.fromkeys(range(geometry.num_hidden_layers), kv_geometry(geometry))
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * element * sum(heads * dim for heads, dim in geometry.values())


def num_blocks_for(config, bytes_per_token: int) -> int:
    """How many KV blocks the engine config's budget buys."""
    if config.kv_budget_blocks is not None:
        return config.kv_budget_blocks
    budget = config.kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES
    return budget // (bytes_per_token * config.block_size)
