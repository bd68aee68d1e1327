"""Which sequences run in the next forward, and how many tokens each feeds. No torch here.

Continuous batching decides every step; static and dynamic batching form a batch only when the previous one has
completely finished, and count the rows that keep riding (finished, or shorter prompts padded to the longest) as
padding tokens, because a padded batch computes them too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.sequence import Sequence, SequenceStatus


@dataclass
class Chunk:
    seq: Sequence
    num_tokens: int  # tokens fed this step, starting at seq.num_computed_tokens

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the sequence, so its last logits give the next token."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    decodes: list[Chunk] = field(default_factory=list)  # one token each
    prefills: list[Chunk] = field(default_factory=list)
    num_padding: int = 0
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def chunks(self) -> list[Chunk]:
        return self.decodes + self.prefills

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences that get a next token from this step, in the order of the forward's logits."""
        return [c.seq for c in self.chunks if c.samples]


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager | None, window: int | None = None):
        self.config = config
        self.blocks = block_manager  # None when cache_mode == "none"
        # every attention layer has a sliding window of at most `window`: blocks behind it can be given back
        self.window = window if config.cache_mode == "paged" else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # static / dynamic: the current batch, and the longest prompt in it (for padding accounting)
        self._batch_riders = 0
        self._batch_open = False

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    # ---- memory -------------------------------------------------------------------------------------------
    def _tokens_to_reserve(self, seq: Sequence, upto: int) -> int:
        # contiguous: the whole maximum length is reserved at once; paged: just what this step writes
        return max(upto, seq.max_total_tokens) if self.config.cache_mode == "contiguous" else upto

    def _try_grow(self, seq: Sequence, upto: int) -> bool:
        if self.blocks is None:
            return True
        tokens = self._tokens_to_reserve(seq, upto)
        if not self.blocks.can_grow(seq.block_table, tokens):
            return False
        self.blocks.grow(seq.seq_id, seq.block_table, tokens)
        return True

    def release(self, seq: Sequence) -> None:
        if self.blocks is not None:
            self.blocks.free(seq.seq_id, seq.block_table)
        seq.block_keys.clear()

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and put it first in line; its tokens are recomputed when it returns."""
        self.running.remove(seq)
        self.release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def halve_running(self) -> None:
        """Out of device memory: the newer half of the running sequences wait again (recomputed later), and the
        batch stays at most that small."""
        for seq in self.running[len(self.running) // 2:][::-1]:
            self.preempt(seq)
        self.config.max_batch_size = max(1, len(self.running))

    def remove(self, seq: Sequence) -> None:
        """Take a finished / cancelled / timed-out sequence out and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            if self._batch_open:
                self._batch_riders += 1
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.release(seq)

    # ---- after a forward ---------------------------------------------------------------------------------------
    def advance(self, plan: StepPlan) -> None:
        """The plan's tokens now have cached K/V: with prefix caching, blocks they completed become reusable; with
        sliding windows on every layer, blocks no query will read again are given back."""
        for chunk in plan.chunks:
            seq = chunk.seq
            seq.num_computed_tokens += chunk.num_tokens
            if self.blocks is not None and self.blocks.prefix_caching:
                self._register_full_blocks(seq)
            if self.window is not None:
                # the next query, at position num_computed_tokens, sees keys from num_computed_tokens - window + 1
                first_key = seq.num_computed_tokens - self.window + 1
                self.blocks.release_before(seq.seq_id, seq.block_table, first_key // self.blocks.block_size)

    def _register_full_blocks(self, seq: Sequence) -> None:
        """Blocks whose every position is now computed become reusable prefixes for later sequences."""
        size = self.blocks.block_size
        if len(seq.block_keys) >= seq.num_computed_tokens // size:
            return  # most decode steps complete no block; skip building the token list
        tokens = seq.all_token_ids
        while len(seq.block_keys) < seq.num_computed_tokens // size:
            index = len(seq.block_keys)
            parent = seq.block_keys[-1] if seq.block_keys else None
            seq.block_keys.append(self.blocks.register(seq.block_table[index], parent,
                                                       tuple(tokens[index * size:(index + 1) * size])))

    # ---- scheduling ---------------------------------------------------------------------------------------
    def schedule(self, now: float, more_arrivals: bool) -> StepPlan:
        if self.config.cache_mode == "none":
            plan = self._schedule_recompute()
        elif self.config.batching in ("static", "dynamic"):
            plan = self._schedule_batch(now, more_arrivals)
        else:
            plan = self._schedule_continuous()
        for chunk in plan.chunks:
            if chunk.seq.timings.first_scheduled is None:
                chunk.seq.timings.first_scheduled = now
        return plan

    def _admit(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _plan_decodes(self, plan: StepPlan, max_tokens: int) -> None:
        """One token for each decoding sequence (up to max_tokens). When KV blocks run out mid-decode, the
        newest running sequences are preempted (and recomputed later) rather than failing."""
        for seq in list(self.running):
            if seq not in self.running or seq.is_prefilling:
                continue
            while not self._try_grow(seq, seq.num_tokens):
                victim = self.running[-1]
                self.preempt(victim)
                plan.preempted.append(victim)
                plan.decodes = [c for c in plan.decodes if c.seq is not victim]
                if victim is seq:
                    break
            if seq in self.running and len(plan.decodes) < max_tokens:
                plan.decodes.append(Chunk(seq, 1))

    def _schedule_continuous(self) -> StepPlan:
        plan = StepPlan()
        self._plan_decodes(plan, self.config.max_batched_tokens)
        budget = self.config.max_batched_tokens - len(plan.decodes)
        for seq in list(self.running):
            if seq not in self.running or not seq.is_prefilling or budget <= 0:
                continue
            chunk = self._prefill_chunk(seq, budget)
            while chunk is None and plan.is_empty and self.running[-1] is not seq:
                # every running sequence is mid-prefill and the blocks ran out: the newest waits again, or none
                # of them would ever move
                victim = self.running[-1]
                self.preempt(victim)
                plan.preempted.append(victim)
                chunk = self._prefill_chunk(seq, budget)
            if chunk is None:
                break
            plan.prefills.append(chunk)
            budget -= chunk.num_tokens
        while self.waiting and len(self.running) < self.config.max_batch_size and budget > 0:
            seq = self.waiting[0]
            chunk = self._prefill_chunk(seq, budget)
            if chunk is None:
                break
            self._admit(seq)
            plan.prefills.append(chunk)
            budget -= chunk.num_tokens
        return plan

    def _prefill_chunk(self, seq: Sequence, budget: int) -> Chunk | None:
        reused = not seq.block_table and self._reuse_prefix(seq)
        size = min(seq.num_uncomputed_tokens, self.config.prefill_chunk_size, budget)
        if size <= 0 or not self._try_grow(seq, seq.num_computed_tokens + size):
            if reused:  # not admitted after all: hold no blocks while waiting
                self.release(seq)
                seq.num_computed_tokens = seq.num_cached_tokens = 0
            return None
        return Chunk(seq, size)

    def _reuse_prefix(self, seq: Sequence) -> bool:
        """Take the cached blocks of the longest registered prefix of the sequence's tokens. At least one token
        is left to compute: its logits give the next token."""
        if self.blocks is None or not self.blocks.prefix_caching:
            return False
        blocks, keys = self.blocks.take_prefix(seq.seq_id, seq.all_token_ids, seq.num_tokens - 1)
        if not blocks:
            return False
        seq.block_table.extend(blocks)
        seq.block_keys.extend(keys)
        seq.num_computed_tokens = len(blocks) * self.blocks.block_size
        seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed_tokens)
        return True

    def _schedule_recompute(self) -> StepPlan:
        """cache_mode 'none': every running sequence feeds all its tokens again, every step."""
        while self.waiting and len(self.running) < self.config.max_batch_size:
            self._admit(self.waiting[0])
        plan = StepPlan()
        for seq in self.running:
            seq.num_computed_tokens = 0
            plan.prefills.append(Chunk(seq, seq.num_tokens))
        return plan

    def _schedule_batch(self, now: float, more_arrivals: bool) -> StepPlan:
        if not self.running:
            self._batch_open = False
            self._batch_riders = 0
            batch = self._form_batch(now, more_arrivals)
            if not batch:
                return StepPlan()
            for seq in batch:
                self._admit(seq)
            self._batch_open = True
        plan = StepPlan()
        self._plan_decodes(plan, len(self.running))
        prefilling = [s for s in self.running if s.is_prefilling]  # after preemptions, which may take some
        longest = max((s.num_uncomputed_tokens for s in prefilling), default=0)
        for seq in prefilling:
            if not self._try_grow(seq, seq.num_tokens):
                self.preempt(seq)
                plan.preempted.append(seq)
                continue
            plan.prefills.append(Chunk(seq, seq.num_uncomputed_tokens))
            plan.num_padding += longest - seq.num_uncomputed_tokens  # left padding to the longest prompt
        if plan.decodes:
            plan.num_padding += self._batch_riders  # finished rows keep riding until the longest ends
        return plan

    def _form_batch(self, now: float, more_arrivals: bool) -> list[Sequence]:
        if not self.waiting:
            return []
        size = self.config.max_batch_size
        if len(self.waiting) < size and more_arrivals:
            if self.config.batching == "static":
                return []  # a static batch waits until it is full (or no more requests can come)
            oldest = min(s.timings.arrival for s in self.waiting)
            if (now - oldest) * 1000.0 < self.config.window_ms:
                return []
        anchor = self.waiting[0]
        candidates = list(self.waiting)[1:]
        if self.config.length_bucketing or self.config.max_length_spread is not None:
            anchor_len = anchor.num_tokens
            if self.config.max_length_spread is not None:
                candidates = [s for s in candidates if abs(s.num_tokens - anchor_len) <= self.config.max_length_spread]
            candidates.sort(key=lambda s: abs(s.num_tokens - anchor_len))
        batch = [anchor]
        for seq in candidates:
            if len(batch) >= size:
                break
            if self.config.schedule_by_tokens:
                longest = max(seq.num_tokens, *(s.num_tokens for s in batch))
                if longest * (len(batch) + 1) > self.config.max_batched_tokens:
                    continue
            batch.append(seq)
        return batch
