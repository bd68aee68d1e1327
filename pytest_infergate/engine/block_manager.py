"""KV cache blocks: a free list, and a block table per sequence. No torch here. A block holds `block_size` consecutive
token positions of one sequence; the contiguous cache mode is the same manager with one block per sequence, sized
to the longest sequence the engine accepts. Prefix caching (vLLM's automatic prefix caching, nano-vllm's block
hashes): a full, computed block is registered under a hash of its tokens chained to the hash of the block before
it, so the key names the whole prefix; a new sequence takes the registered blocks its prompt starts with. Blocks are
reference-counted; one nobody holds goes back to the free list still registered, reusable until it is allocated
anew, and a sequence writes only past its shared blocks. Design: docs/explanation/engine.md, 'Prefix caching'.
"""

from __future__ import annotations

from collections import deque

RELEASED = -1  # a block-table entry whose block was given back (out of every sliding window)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(num_blocks))
        self._holders: dict[int, set[int]] = {}  # block id -> sequence ids holding it, for accounting checks
        self._by_key: dict[tuple, int] = {}  # (parent key, tokens) -> block
        self._key_of: dict[int, tuple] = {}  # block -> its key while registered
        self.num_reused_blocks = 0  # prefix-cache hits, counted per block taken

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
            self._unregister(block)  # its old contents are about to be overwritten
            self._holders[block] = {seq_id}
            block_table.append(block)

    def free(self, seq_id: int, block_table: list[int]) -> None:
        for block in block_table:
            if block != RELEASED:
                self._release(seq_id, block)
        block_table.clear()

    def release_before(self, seq_id: int, block_table: list[int], num_blocks: int) -> None:
        """Give back the sequence's first `num_blocks` blocks (no query will read them again: they fell out of
        every sliding window); their places in the table keep the positions of the rest."""
        for index in range(min(num_blocks, len(block_table))):
            if block_table[index] != RELEASED:
                self._release(seq_id, block_table[index])
                block_table[index] = RELEASED

    def _release(self, seq_id: int, block: int) -> None:
        holders = self._holders.get(block)
        if holders is None or seq_id not in holders:
            raise RuntimeError(f"block {block} freed by sequence {seq_id}, which does not hold it")
        holders.discard(seq_id)
        if not holders:
            del self._holders[block]
            self._free.append(block)  # still registered: reusable until allocated anew

    def slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size

    # ---- prefix caching -----------------------------------------------------------------------------------
    def register(self, block: int, parent_key: tuple | None, tokens: tuple[int, ...]) -> tuple:
        """Record that `block` holds the computed K/V of `tokens` after the prefix named by `parent_key`.
        Returns the block's key (the parent of the next block). A prefix registered already keeps its block."""
        key = (parent_key, tokens)
        if self.prefix_caching and key not in self._by_key and block not in self._key_of:
            self._by_key[key] = block
            self._key_of[block] = key
        return key

    def take_prefix(self, seq_id: int, token_ids: list[int], max_tokens: int) -> tuple[list[int], list[tuple]]:
        """The registered blocks that hold the longest prefix of `token_ids` (at most `max_tokens` positions, in
        whole blocks), taken for `seq_id`; and their keys."""
        blocks: list[int] = []
        keys: list[tuple] = []
        parent = None
        size = self.block_size
        for start in range(0, max_tokens - size + 1, size):
            key = (parent, tuple(token_ids[start:start + size]))
            block = self._by_key.get(key)
            if block is None:
                break
            if block not in self._holders:  # cached but free: take it off the free list
                self._free.remove(block)
                self._holders[block] = set()
            self._holders[block].add(seq_id)
            blocks.append(block)
            keys.append(key)
            parent = key
        self.num_reused_blocks += len(blocks)
        return blocks, keys

    def reset_prefix_cache(self) -> None:
        """Forget every registered prefix (e.g. between repetitions of a measured workload)."""
        self._by_key.clear()
        self._key_of.clear()

    def _unregister(self, block: int) -> None:
        key = self._key_of.pop(block, None)
        if key is not None and self._by_key.get(key) == block:
            del self._by_key[key]
