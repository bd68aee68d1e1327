"""The only place that builds model inputs and calls the model's forward."""

from __future__ import annotations

import time

import torch

from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.kv_cache import AttentionBatch, DecodeGroup, KVCache, PrefillSegment
from pytest_infergate.engine.request import Sequence
from pytest_infergate.engine.scheduler import StepPlan


DECODE_GROUP_SIZE = 8  # decoding sequences attended together (sorted by context length)


class ModelRunner:
    def __init__(self, model, cache: KVCache | None, blocks: BlockManager | None, device: torch.device,
                 pad_token_id: int):
        self.model = model
        self.cache = cache
        self.blocks = blocks
        self.device = device
        self.pad_token_id = pad_token_id
        self.is_cuda = device.type == "cuda"

    # ---- slots --------------------------------------------------------------------------------------------
    def _slot_table(self, seqs: list[Sequence], length: int) -> torch.Tensor:
        """[len(seqs), length] cache slots of positions 0..length-1 of each sequence (garbage past its end)."""
        bs = self.blocks.block_size
        width = -(-length // bs)
        tables = torch.tensor([(s.block_table + [0] * width)[:width] for s in seqs], dtype=torch.long)
        pos = torch.arange(length)
        return tables[:, pos // bs] * bs + pos % bs

    def _new_token_slots(self, chunk_seq: Sequence, start: int, count: int) -> torch.Tensor:
        return self._slot_table([chunk_seq], start + count)[0, start:]

    # ---- one forward --------------------------------------------------------------------------------------
    def build(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, list[int]]:
        # decodes sorted by context length, so each attention group pads little (sampling follows plan order)
        plan.decodes.sort(key=lambda c: c.seq.num_computed_tokens)
        input_ids: list[int] = []
        positions: list[int] = []
        sample_at: list[int] = []
        slot_parts: list[torch.Tensor] = []
        has_cache = self.cache is not None
        for chunk in plan.decodes:
            seq = chunk.seq
            input_ids.append(seq.all_token_ids[-1])
            positions.append(seq.num_computed_tokens)
            sample_at.append(len(input_ids) - 1)
        batch = AttentionBatch(cache=self.cache, num_real_tokens=0, slot_mapping=None)
        if plan.decodes:
            ctx = [c.seq.num_computed_tokens + 1 for c in plan.decodes]
            for start in range(0, len(plan.decodes), DECODE_GROUP_SIZE):
                group = DecodeGroup(start, 0, None, 0)
                lengths = torch.tensor(ctx[start:start + DECODE_GROUP_SIZE])
                group.count, group.length = len(lengths), int(lengths.max())
                table = self._slot_table([c.seq for c in plan.decodes[start:start + group.count]], group.length)
                slot_parts.append(table.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1))
                group.slots = table.reshape(-1).to(self.device)
                if int(lengths.min()) != group.length:
                    valid = torch.arange(group.length).unsqueeze(0) < lengths.unsqueeze(1)
                    group.mask = valid.view(group.count, 1, 1, group.length).to(self.device)
                batch.decode_groups.append(group)
        for chunk in plan.prefills:
            seq, start, n = chunk.seq, chunk.seq.num_computed_tokens, chunk.num_tokens
            segment = PrefillSegment(q_start=len(input_ids), q_len=n, ctx_len=start)
            input_ids.extend(seq.all_token_ids[start:start + n])
            positions.extend(range(start, start + n))
            if has_cache:
                slots = self._slot_table([seq], start + n)[0]
                slot_parts.append(slots[start:])
                if start:
                    segment.ctx_slots = slots.to(self.device)
                    causal = (torch.arange(n).unsqueeze(1) + start) >= torch.arange(start + n).unsqueeze(0)
                    segment.mask = causal.to(self.device)
            batch.prefills.append(segment)
            if chunk.samples:
                sample_at.append(len(input_ids) - 1)
        batch.num_real_tokens = len(input_ids)
        if has_cache and slot_parts:
            batch.slot_mapping = torch.cat(slot_parts).to(self.device)
        if plan.num_padding:
            batch.num_padding = plan.num_padding
            input_ids.extend([self.pad_token_id] * plan.num_padding)
            positions.extend(range(plan.num_padding))
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        pos = torch.tensor([positions], dtype=torch.long, device=self.device)
        return ids, pos, batch, sample_at

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> tuple[torch.Tensor, float]:
        """Logits [num sampling chunks, vocab] (float32) in plan order, and the forward's wall time in seconds."""
        ids, pos, batch, sample_at = self.build(plan)
        keep = torch.tensor(sample_at, dtype=torch.long, device=self.device)
        start = time.perf_counter()
        out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep,
                         infergate_batch=batch)
        logits = out.logits[0].float()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        return logits, time.perf_counter() - start


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """Greedy rows take argmax; others sample with temperature / top-k / top-p from their own seeded generator."""
    greedy = [i for i, s in enumerate(seqs) if s.request.is_greedy]
    tokens = [0] * len(seqs)
    if greedy:
        picked = logits[greedy].argmax(dim=-1).tolist()
        for i, token in zip(greedy, picked):
            tokens[i] = token
    for i, seq in enumerate(seqs):
        request = seq.request
        if request.is_greedy:
            continue
        row = logits[i] / request.temperature
        if request.top_k:
            kth = torch.topk(row, min(request.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if request.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            cumulative = sorted_probs.cumsum(0)
            drop = cumulative - sorted_probs > request.top_p  # keep the smallest set reaching top_p
            sorted_probs[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if seq.generator is None:
            seq.generator = torch.Generator(device=probs.device)
            seq.generator.manual_seed(request.seed if request.seed is not None else seq.seq_id)
        tokens[i] = int(torch.multinomial(probs, 1, generator=seq.generator))
    return tokens
