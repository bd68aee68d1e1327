"""What one forward's attention needs: which cached keys each query token attends to. The runner describes the
sequences (block tables, context lengths); one forward's query tokens are flattened (batch dimension 1) as
    [ decode tokens (one per sequence, by context length) | prefill chunks ... | padding tokens (static batching) ]
and each attention layer asks for the key layout of its own window or chunk, `batch.layout(window, chunk)`, built
once per forward and (window, chunk) and shared by every layer with them. Decoding sequences are attended in groups
of similar length: on a CPU decode attention is bound by reading the cached K/V, and padding a group to its longest
member costs far less than padding the whole batch. Which keys a window or chunk sees, and the measured gain:
docs/explanation/engine.md, 'Which keys each query reads' and 'Decode attention'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    chunk_sizes: dict = field(default_factory=dict)  # layer index -> attention chunk size (patterns.py)
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
