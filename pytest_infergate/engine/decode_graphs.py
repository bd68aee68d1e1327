"""CUDA graphs for decode steps: a small model on a GPU spends a decode step launching kernels, not running them, so
every decode-only step is replayed from a graph captured once. A step is padded to a bucket (`batch_buckets`,
`context_buckets`) and its inputs copied into the buffers its graph was captured on; padding rows write their K/V
to a scratch slot no sequence owns. Every graph is captured when the engine is built (graph_build.py) and checked
against the eager forward within the engine's logit tolerance; a capture that fails (LLM.int8 picks outlier columns
at run time) or a graph that disagrees turns graphs off for that engine, saying why (`Engine.cuda_graphs`). Prefill
and mixed steps always run eagerly. The buckets, buffers and checks: docs/explanation/engine.md, 'CUDA graphs'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pytest_infergate.engine.attention import AttentionBatch, DecodeGroup, DecodeRows, Layout, decode_keys

MIN_CONTEXT_BUCKET = 256  # keys per query of the shortest context bucket (tests lower it)


def batch_buckets(max_batch: int) -> list[int]:
    """Batch sizes a graph is captured for: 1, 2, 4, 8, multiples of 16, and max_batch itself."""
    sizes = {s for s in (1, 2, 4, 8) if s < max_batch} | set(range(16, max_batch, 16)) | {max_batch}
    return sorted(sizes)


def context_buckets(max_len: int) -> list[int]:
    """Keys per query a graph is captured for: MIN_CONTEXT_BUCKET doubled up to max_len, and max_len itself."""
    sizes, size = [], MIN_CONTEXT_BUCKET
    while size < max_len:
        sizes.append(size)
        size *= 2
    return sizes + [max_len]


def bucket(value: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= value)


@dataclass(frozen=True)
class GraphStatus:
    """Whether decode steps replay CUDA graphs in this engine, and why not where they do not."""

    enabled: bool
    reason: str = ""  # why they are off ("" when on)
    num_graphs: int = 0
    batch_sizes: tuple[int, ...] = ()
    context_lengths: tuple[int, ...] = ()
    capture_s: float = 0.0  # capturing and checking them all
    pool_bytes: int = 0  # GPU memory the allocator reserved while capturing (the graphs' pool, kept while on)
    max_diff: float = 0.0  # the largest |graph - eager| logit seen by the check, relative to the logit scale

    def describe(self) -> str:
        if not self.enabled:
            return f"off: {self.reason}" if self.reason else "off"
        return (f"on: {self.num_graphs} graphs (batch {self.batch_sizes[0]}-{self.batch_sizes[-1]} x context "
                f"{self.context_lengths[0]}-{self.context_lengths[-1]}), captured and checked against the eager "
                f"forward in {self.capture_s:.1f} s (largest difference {self.max_diff:.1e} x the logit scale"
                + (f"; pool {self.pool_bytes / 2**20:.0f} MiB)" if self.pool_bytes else ")"))



class CudaCapture:
    """torch.cuda.CUDAGraph, captured on a side stream into one shared pool. `capture(forward)` first runs it
    eagerly on that stream (lazy initialisation such as cuBLAS workspaces must not happen inside a capture), then
    captures it and returns the graph's replay. What torch.cuda.graph does before every capture (synchronize,
    gc.collect, empty_cache) is done once, in `begin`: a full collection per graph would cost the 36 graphs of a
    default engine seconds in a large test process."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = None
        self.stream: torch.cuda.Stream | None = None

    def begin(self) -> None:
        import gc

        torch.cuda.synchronize(self.device)
        gc.collect()
        torch.cuda.empty_cache()
        self.stream = torch.cuda.Stream(self.device)

    def capture(self, forward: Callable[[], None]) -> Callable[[], None]:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            forward()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool)
            try:
                forward()
            except BaseException:
                try:
                    graph.capture_end()
                except Exception:  # noqa: BLE001 - the capture is invalid anyway; the first error says why
                    pass
                raise
            graph.capture_end()
        torch.cuda.synchronize(self.device)
        if self.pool is None:
            self.pool = graph.pool()
        return graph.replay


class EagerReplay:
    """Replays by running the captured function itself: the graphs' fixed-buffer path without a GPU (tests)."""

    def __init__(self, device: torch.device):
        self.replays = 0

    def begin(self) -> None:
        pass

    def capture(self, forward: Callable[[], None]) -> Callable[[], None]:
        def replay():
            self.replays += 1
            forward()
        return replay


def capture_backend(device: torch.device):
    """How graphs are captured on `device`; None where they cannot be (tests substitute EagerReplay)."""
    return CudaCapture(device) if device.type == "cuda" else None


class DecodeGraphs:
    """The fixed buffers, the captured graphs and the copy of each decode step's inputs into them."""

    def __init__(self, model, cache, block_size: int, pad_token_id: int, windows: set[int | None], max_batch: int,
                 max_len: int, scratch_slot: int, capture):
        self.model, self.cache, self.block_size = model, cache, block_size
        self.device = cache.device
        self.scratch_slot, self.pad_token_id = scratch_slot, pad_token_id
        self.capturer = capture
        self.batch_sizes, self.context_lengths = batch_buckets(max_batch), context_buckets(max_len)
        self.windows = sorted(w for w in windows if w is not None)
        rows, keys = self.batch_sizes[-1], self.context_lengths[-1]
        pinned = self.device.type == "cuda"
        self.host = _Buffers(rows, keys, self.windows, torch.device("cpu"), pinned)
        self.on_device = _Buffers(rows, keys, self.windows, self.device, False)
        for buffers in (self.host, self.on_device):  # what a warm-up forward reads before any step filled them
            buffers.clear(pad_token_id, scratch_slot)
        self.keep = torch.arange(rows, device=self.device)
        self.logits: torch.Tensor | None = None  # [max batch, vocab] float32, made by the first forward
        self.graphs: dict[tuple[int, int], Callable[[], None]] = {}
        self.last_bucket: tuple[int, int] | None = None  # (batch, context) of the graph replayed last

    # ---- capture ------------------------------------------------------------------------------------------
    def key_lengths(self, keys: int) -> list[tuple[int | None, int]]:
        """(window, keys per query) of each layout a forward with `keys` keys per query uses: a window at least as
        long as the context reads like full attention (AttentionBatch.layout)."""
        return [(None, keys)] + [(w, w) for w in self.windows if w < keys]

    def _batch(self, rows: int, keys: int) -> AttentionBatch:
        layouts = {}
        for window, length in self.key_lengths(keys):
            slots = self.on_device.key_slots[window][:rows * length]
            mask = self.on_device.key_mask[window][:rows * length].view(rows, 1, 1, length)
            layouts[window] = Layout([DecodeGroup(0, rows, slots, length, mask)], [])
        return AttentionBatch(self.cache, self.block_size, self.device, num_real_tokens=rows,
                              slot_mapping=self.on_device.slot_mapping[:rows], max_context=keys, frozen=True,
                              _layouts=layouts)

    def _forward(self, rows: int, keys: int) -> Callable[[], None]:
        batch = self._batch(rows, keys)
        buffers = self.on_device

        def forward():
            out = self.model(input_ids=buffers.input_ids[:rows].view(1, rows),
                             position_ids=buffers.positions[:rows].view(1, rows), use_cache=False,
                             logits_to_keep=self.keep[:rows], infergate_batch=batch)
            logits = out.logits[0]
            if self.logits is None:
                self.logits = torch.empty((self.batch_sizes[-1], logits.shape[-1]), dtype=torch.float32,
                                          device=self.device)
            self.logits[:rows].copy_(logits)
        return forward

    @torch.inference_mode()
    def capture_all(self) -> None:
        self.capturer.begin()
        for keys in reversed(self.context_lengths):  # largest first: the smaller ones reuse its pool memory
            for rows in reversed(self.batch_sizes):
                self.graphs[(rows, keys)] = self.capturer.capture(self._forward(rows, keys))

    # ---- replay -------------------------------------------------------------------------------------------
    def can_run(self, inputs) -> bool:
        """A decode-only step (no prefill, no static-batching padding) that fits the largest bucket."""
        batch = inputs.batch
        return (bool(batch.decode_rows) and not batch.prefill_rows and not batch.num_padding
                and batch.observer is None and len(inputs.input_ids) <= self.batch_sizes[-1]
                and batch.max_context <= self.context_lengths[-1])

    @torch.inference_mode()
    def run(self, inputs) -> torch.Tensor:
        """Logits [decoding sequences, vocab] (float32) of a step `can_run` accepted, from its graph."""
        count = len(inputs.input_ids)
        rows, keys = bucket(count, self.batch_sizes), bucket(inputs.batch.max_context, self.context_lengths)
        decoding = merged(inputs.batch.decode_rows)
        host = self.host
        host.input_ids[:count] = torch.tensor(inputs.input_ids)
        host.input_ids[count:rows] = self.pad_token_id
        host.positions[:count] = torch.tensor(inputs.positions)
        host.positions[count:rows] = 0
        host.slot_mapping[:count] = inputs.batch.slot_mapping
        host.slot_mapping[count:rows] = self.scratch_slot
        key_lengths = self.key_lengths(keys)
        for window, length in key_lengths:
            slots, valid = decode_keys(decoding, window, self.block_size, length)
            host.key_slots[window][:count * length] = slots.reshape(-1)
            host.key_slots[window][count * length:rows * length] = self.scratch_slot
            mask = host.key_mask[window][:rows * length].view(rows, length)
            mask[:count] = valid
            mask[count:] = False
            mask[count:, 0] = True  # a padding row attends to the scratch slot alone (no empty softmax)
        self.on_device.copy_from(host, rows, key_lengths)
        self.last_bucket = (rows, keys)
        self.graphs[(rows, keys)]()
        return self.logits[:count].clone()


class _Buffers:
    """The inputs of the largest bucket; a smaller one uses the first rows (and keys) of each."""

    def __init__(self, rows: int, keys: int, windows: list[int], device: torch.device, pinned: bool):
        def tensor(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device, pin_memory=pinned)

        self.input_ids = tensor((rows,), torch.long)
        self.positions = tensor((rows,), torch.long)
        self.slot_mapping = tensor((rows,), torch.long)
        lengths = {None: keys, **{w: min(w, keys) for w in windows}}
        self.key_slots = {w: tensor((rows * n,), torch.long) for w, n in lengths.items()}
        self.key_mask = {w: tensor((rows * n,), torch.bool) for w, n in lengths.items()}

    def clear(self, pad_token_id: int, scratch_slot: int) -> None:
        self.input_ids.fill_(pad_token_id)
        self.positions.zero_()
        self.slot_mapping.fill_(scratch_slot)
        for window in self.key_slots:
            self.key_slots[window].fill_(scratch_slot)
            self.key_mask[window].fill_(True)

    def copy_from(self, other: _Buffers, rows: int, key_lengths: list[tuple[int | None, int]]) -> None:
        """Copy the first `rows` rows of each input and of the layouts in `key_lengths` (non-blocking: from pinned
        host memory on CUDA; the runner synchronizes after the step)."""
        for name in ("input_ids", "positions", "slot_mapping"):
            getattr(self, name)[:rows].copy_(getattr(other, name)[:rows], non_blocking=True)
        for window, length in key_lengths:
            self.key_slots[window][:rows * length].copy_(other.key_slots[window][:rows * length], non_blocking=True)
            self.key_mask[window][:rows * length].copy_(other.key_mask[window][:rows * length], non_blocking=True)


def merged(rows: list[DecodeRows]) -> DecodeRows:
    """The decode groups of one forward as one (the CPU attends in groups of 8; a graph has one group)."""
    if len(rows) == 1:
        return rows[0]
    width = max(r.tables.shape[1] for r in rows)
    tables = torch.cat([torch.nn.functional.pad(r.tables, (0, width - r.tables.shape[1])) for r in rows])
    return DecodeRows(rows[0].start, tables, torch.cat([r.lengths for r in rows]))
