"""The only place that builds model inputs and calls the model's forward (nano-vllm's model_runner: inputs are
prepared per phase, then one forward runs them all)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pytest_infergate.engine.attention import AttentionBatch, DecodeRows, PrefillRows, cache_slots
from pytest_infergate.engine.config import declared_patterns
from pytest_infergate.engine.scheduler import Chunk, StepPlan
from pytest_infergate.engine.sequence import Sequence

CPU_DECODE_GROUP_SIZE = 8  # decoding sequences attended together on the CPU (see EngineConfig.decode_group_size)


@dataclass
class ForwardInputs:
    """One forward's flattened tokens, what attention needs to know about them, and where to read logits."""

    batch: AttentionBatch
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sample_at: list[int] = field(default_factory=list)  # token index of each sampling chunk's last token
    slot_parts: list[torch.Tensor] = field(default_factory=list)  # cache slots of the real tokens, in order (host)


class ModelRunner:
    def __init__(self, model, cache, block_size: int, device: torch.device, pad_token_id: int,
                 decode_group_size: int | None = None):
        self.model = model
        self.cache = cache  # KVCache, or None (cache_mode 'none'; the shape probe)
        self.block_size = block_size
        self.device = device
        self.pad_token_id = pad_token_id
        self.is_cuda = device.type == "cuda"
        # None on CUDA: all decoding sequences in one group, one attention call per layer
        self.decode_group_size = decode_group_size or (None if self.is_cuda else CPU_DECODE_GROUP_SIZE)
        self.graphs = None  # DecodeGraphs once the engine captured and checked them
        self.chunk_sizes = declared_patterns(model.config).chunks  # chunked layers: their mask is the config's
        # the device's time in this runner's forwards so far, by CUDA events (None off CUDA): what the gate compares
        # on a busy runner, since CPU co-tenants slow the host's launches, not the kernels (perf.local_bench)
        self.device_s: float | None = 0.0 if self.is_cuda else None
        self.last_device_s: float | None = None  # the last forward's

    def _block_tables(self, seqs: list[Sequence], num_tokens: int) -> torch.Tensor:
        """[len(seqs), blocks covering num_tokens] block ids (short tables padded with block 0)."""
        width = -(-num_tokens // self.block_size)
        return torch.tensor([(s.block_table + [0] * width)[:width] for s in seqs], dtype=torch.long)

    # ---- inputs, per phase ------------------------------------------------------------------------------------
    def prepare_decode(self, decodes: list[Chunk], inputs: ForwardInputs) -> None:
        """One token per decoding sequence, in groups of similar context length (sampling follows plan order)."""
        decodes.sort(key=lambda c: c.seq.num_computed_tokens)
        for chunk in decodes:
            inputs.input_ids.append(chunk.seq.all_token_ids[-1])
            inputs.positions.append(chunk.seq.num_computed_tokens)
            inputs.sample_at.append(len(inputs.input_ids) - 1)
        size = self.decode_group_size or max(len(decodes), 1)
        for first in range(0, len(decodes), size):
            seqs = [c.seq for c in decodes[first:first + size]]
            lengths = torch.tensor([s.num_computed_tokens + 1 for s in seqs])  # the new token included
            tables = self._block_tables(seqs, int(lengths.max()))
            new_token = (lengths - 1).unsqueeze(1)
            inputs.slot_parts.append(cache_slots(tables, new_token, self.block_size).squeeze(1))
            inputs.batch.decode_rows.append(DecodeRows(first, tables, lengths))
            inputs.batch.max_context = max(inputs.batch.max_context, int(lengths.max()))

    def prepare_prefill(self, prefills: list[Chunk], inputs: ForwardInputs) -> None:
        """The next chunk of each prefilling sequence, after what is cached already."""
        for chunk in prefills:
            seq, start, n = chunk.seq, chunk.seq.num_computed_tokens, chunk.num_tokens
            table = None
            if self.cache is not None:
                table = self._block_tables([seq], start + n)
                positions = torch.arange(start, start + n).unsqueeze(0)
                inputs.slot_parts.append(cache_slots(table, positions, self.block_size)[0])
                table = table[0]
            inputs.batch.prefill_rows.append(PrefillRows(len(inputs.input_ids), n, start, table))
            inputs.batch.max_context = max(inputs.batch.max_context, start + n)
            inputs.input_ids.extend(seq.all_token_ids[start:start + n])
            inputs.positions.extend(range(start, start + n))
            if chunk.samples:
                inputs.sample_at.append(len(inputs.input_ids) - 1)

    def prepare_padding(self, num_padding: int, inputs: ForwardInputs) -> None:
        """Static batching's wasted rows, as tokens the forward computes and nothing reads."""
        if num_padding:
            inputs.batch.num_padding = num_padding
            inputs.input_ids.extend([self.pad_token_id] * num_padding)
            inputs.positions.extend(range(num_padding))

    def prepare(self, plan: StepPlan, observer=None) -> ForwardInputs:
        inputs = ForwardInputs(AttentionBatch(self.cache, self.block_size, self.device, observer=observer,
                                              chunk_sizes=self.chunk_sizes))
        self.prepare_decode(plan.decodes, inputs)
        self.prepare_prefill(plan.prefills, inputs)
        inputs.batch.num_real_tokens = len(inputs.input_ids)
        self.prepare_padding(plan.num_padding, inputs)
        if self.cache is not None and inputs.slot_parts:
            inputs.batch.slot_mapping = torch.cat(inputs.slot_parts)  # on the host: a CUDA graph copies it itself
        return inputs

    # ---- the forward -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run_model(self, inputs: ForwardInputs, all_logits: bool = False,
                  logit_rows: list[int] | None = None) -> tuple[torch.Tensor, float]:
        """The forward's logits at the sampling positions; with `all_logits` at every token, with `logit_rows` at
        those token indices (the self-check's probe), and its wall time in seconds."""
        ids = torch.tensor([inputs.input_ids], dtype=torch.long, device=self.device)
        pos = torch.tensor([inputs.positions], dtype=torch.long, device=self.device)
        rows = logit_rows if logit_rows is not None else None if all_logits else inputs.sample_at
        keep = 0 if rows is None else torch.tensor(rows, dtype=torch.long, device=self.device)
        if inputs.batch.slot_mapping is not None:
            inputs.batch.slot_mapping = inputs.batch.slot_mapping.to(self.device)
        start = time.perf_counter()
        with self._device_timer():
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep,
                             infergate_batch=inputs.batch)
            logits = out.logits[0].float()
        return logits, time.perf_counter() - start

    def forward(self, plan: StepPlan) -> tuple[torch.Tensor, float]:
        """Logits [num sampling chunks, vocab] (float32) in plan order, and the forward's wall time in seconds."""
        inputs = self.prepare(plan)
        if self.graphs is None or not self.graphs.can_run(inputs):
            return self.run_model(inputs)
        start = time.perf_counter()
        with self._device_timer():
            logits = self.graphs.run(inputs)
        return logits, time.perf_counter() - start

    @contextmanager
    def _device_timer(self) -> Iterator[None]:
        """On CUDA: waits for the forward's kernels (its wall time then covers them) and adds the device's time
        between two CUDA events around them to `device_s`. A CUDA graph's replay is one launch, so its span is the
        kernels' own time; an eager forward's span also holds the gaps while the host launches kernels."""
        if not self.is_cuda:
            yield
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        torch.cuda.synchronize(self.device)
        self.last_device_s = begin.elapsed_time(end) / 1000.0
        self.device_s += self.last_device_s
