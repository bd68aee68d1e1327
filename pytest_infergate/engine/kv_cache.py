"""KV cache tensors: one flat slot tensor per attention layer, `k[layer]: [num_slots, kv_heads, head_dim]`.

The block manager maps a sequence's token positions to slots. Each layer's geometry is what the model's attention
actually hands over (the engine's shape probe records it), not what the config claims: GPT-2 and OPT ignore a
config's `head_dim`, some families give layers different head counts.
"""

from __future__ import annotations

import torch

DEFAULT_KV_BUDGET_BYTES = 1 << 30


class KVCache:
    def __init__(self, geometry: dict[int, tuple[int, int, int]], num_slots: int, dtype: torch.dtype,
                 device: torch.device | str):
        """geometry: layer index -> (kv heads, key head dim, value head dim)."""
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.k: list[torch.Tensor | None] = []
        self.v: list[torch.Tensor | None] = []
        for layer, shape in geometry.items():
            self.add_layer(layer, shape)

    def add_layer(self, layer: int, geometry: tuple[int, int, int]) -> None:
        num_kv_heads, head_dim, value_head_dim = geometry
        while len(self.k) <= layer:
            self.k.append(None)
            self.v.append(None)
        self.k[layer] = torch.zeros((self.num_slots, num_kv_heads, head_dim), dtype=self.dtype, device=self.device)
        self.v[layer] = torch.zeros((self.num_slots, num_kv_heads, value_head_dim), dtype=self.dtype,
                                    device=self.device)

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
    """Sum over layers of kv_heads x (key + value head dims) x bytes per element. `geometry`: layer index ->
    (kv heads, key head dim, value head dim), or a model config (every layer as the config states it)."""
    if not isinstance(geometry, dict):
        heads, dim = kv_geometry(geometry)
        geometry = dict.fromkeys(range(geometry.num_hidden_layers), (heads, dim, dim))
    element = torch.tensor([], dtype=dtype).element_size()
    return element * sum(heads * (k_dim + v_dim) for heads, k_dim, v_dim in geometry.values())


def workload_kv_shape(token_needs: list[int], config) -> tuple[int, int]:
    """(sequences at once, blocks per sequence) for a known workload (each request's prompt + max_new_tokens): as
    many sequences as the engine runs at once (max_batch_size; one for sequential batching), each as long as the
    longest request, plus one block for a partly filled last block. Every sequence fits at its longest, so the
    scheduler never preempts for want of memory and runs as it would with any larger budget."""
    concurrent = 1 if config.batching == "sequential" else min(config.max_batch_size, max(1, len(token_needs)))
    return concurrent, -(-max(token_needs, default=1) // config.block_size) + 1


def num_blocks_for(config, bytes_per_token: int) -> int:
    """How many KV blocks the engine config's budget buys."""
    if config.kv_budget_blocks is not None:
        return config.kv_budget_blocks
    budget = config.kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES
    return budget // (bytes_per_token * config.block_size)
