"""KV cache blocks: a free list, and a block table per sequence. No torch here.

A block holds `block_size` consecutive token positions of one sequence. The contiguous cache mode is the same
manager with one block per sequence, sized to the longest sequence the engine accepts.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: dict[int, int] = {}  # block id -> sequence id, for accounting checks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Blocks a sequence that holds `block_table` must add to cover `num_tokens` positions."""
        return max(0, self.blocks_needed(num_tokens) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_new_blocks(block_table, num_tokens) <= len(self._free)

    def grow(self, seq_id: int, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to `block_table` (in place) until it covers `num_tokens` positions."""
        needed = self.num_new_blocks(block_table, num_tokens)
        if needed > len(self._free):
            raise MemoryError(f"sequence {seq_id} needs {needed} KV blocks, {len(self._free)} free")
        for _ in range(needed):
            block = self._free.popleft()
            self._owner[block] = seq_id
            block_table.append(block)

    def free(self, seq_id: int, block_table: list[int]) -> None:
        for block in block_table:
            if self._owner.pop(block, None) != seq_id:
                raise RuntimeError(f"block {block} freed by sequence {seq_id}, which does not own it")
            self._free.append(block)
        block_table.clear()

    def slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
