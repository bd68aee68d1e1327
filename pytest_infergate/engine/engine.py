"""Engine: submit / step / generate / stream, with limits and per-request and per-step metrics."""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

import torch

from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.kv_cache import ATTENTION_NAME, KVCache, kv_bytes_per_token, kv_geometry, register_attention
from pytest_infergate.engine.request import (FinishReason, Request, RequestError, Result, Sequence, SequenceStatus,
                                             render_prompt)
from pytest_infergate.engine.runner import ModelRunner, sample
from pytest_infergate.engine.scheduler import Scheduler, StepPlan
from pytest_infergate.errors import InfergateError, OptionError

DEFAULT_KV_BUDGET_BYTES = 1 << 30


class UnsupportedModelError(InfergateError):
    """The model's attention layers do not go through transformers' attention interface."""


@dataclass
class StepRecord:
    index: int
    start_s: float  # since the engine's clock origin
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    kv_blocks_used: int
    forward_s: float
    step_s: float
    num_preempted: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DegradationEvent:
    at_s: float
    kind: str
    detail: str


@dataclass
class StreamChunk:
    token_id: int
    text: str  # the text this token added (may be empty while a multi-byte character is incomplete)


class Engine:
    """The reference engine. Exact: with greedy decoding its outputs equal `model.generate(do_sample=False)`.

    The engine switches the model's attention implementation to its own for its lifetime; `close()` (or using
    the engine as a context manager) switches it back.
    """

    def __init__(self, model, tokenizer, config: EngineConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.model_config = model.config
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        if not self.dtype.is_floating_point:
            self.dtype = torch.float32
        limit = getattr(self.model_config, "max_position_embeddings", None) or 8192
        self.max_model_len = self.config.max_model_len or min(limit, 8192)
        self.max_input_tokens = min(self.config.max_input_tokens or self.max_model_len - 1, self.max_model_len - 1)
        self.kv_bytes_per_token = kv_bytes_per_token(self.model_config, self.dtype)
        self.eos_token_ids = self._eos_ids()
        self.blocks, self.cache = self._allocate_cache()
        self.scheduler = Scheduler(self.config, self.blocks)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids or {0})
        self.runner = ModelRunner(model, self.cache, self.blocks, self.device, pad)
        self._install_attention()
        self._clock0 = time.perf_counter()
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}
        self._results: dict[str, Result] = {}
        self.steps: list[StepRecord] = []
        self.events: list[DegradationEvent] = []
        self.peak_kv_blocks = 0

    # ---- set-up -------------------------------------------------------------------------------------------
    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model_config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is not None:
                ids.update(value if isinstance(value, (list, tuple)) else [value])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _allocate_cache(self) -> tuple[BlockManager | None, KVCache | None]:
        if self.config.cache_mode == "none":
            return None, None
        block_size = self.config.block_size
        if self.config.kv_budget_blocks is not None:
            num_blocks = self.config.kv_budget_blocks
        else:
            budget = self.config.kv_budget_bytes or DEFAULT_KV_BUDGET_BYTES
            num_blocks = budget // (self.kv_bytes_per_token * block_size)
        if num_blocks * block_size < self.max_model_len:
            have = num_blocks * block_size
            raise OptionError(
                f"EngineConfig KV budget holds {have} tokens ({num_blocks} blocks of {block_size}, "
                f"{self.kv_bytes_per_token} bytes per token) but one sequence may need max_model_len = "
                f"{self.max_model_len}: raise kv_budget_bytes/kv_budget_blocks or lower max_model_len")
        num_kv_heads, head_dim = kv_geometry(self.model_config)
        cache = KVCache(self.model_config.num_hidden_layers, num_blocks * block_size, num_kv_heads, head_dim,
                        self.dtype, self.device)
        return BlockManager(num_blocks, block_size, self.config.prefix_caching), cache

    def _install_attention(self) -> None:
        # engines on one model may overlap and close in any order: the first one remembers the model's own
        # attention implementation, the last one to close puts it back
        users = getattr(self.model, "_infergate_engines", 0)
        if users == 0:
            self.model._infergate_original_attention = getattr(self.model_config, "_attn_implementation", None)
        self.model._infergate_engines = users + 1
        self._closed = False
        register_attention()
        calls = []
        from pytest_infergate.engine import kv_cache

        original = kv_cache.infergate_attention

        def probe(*args, **kwargs):
            calls.append(1)
            return original(*args, **kwargs)

        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION_NAME, probe)
        try:
            self.model.set_attn_implementation(ATTENTION_NAME)
            seq = Sequence(Request(prompt_token_ids=[self.runner.pad_token_id], max_new_tokens=1), [0], 0.0, "probe")
            plan = StepPlan()
            from pytest_infergate.engine.scheduler import Chunk

            plan.prefills.append(Chunk(seq, 1))
            if self.blocks is not None:
                self.blocks.grow(seq.seq_id, seq.block_table, 1)
            try:
                self.runner.forward(plan)
            finally:
                if self.blocks is not None:
                    self.blocks.free(seq.seq_id, seq.block_table)
        except Exception as exc:
            self._restore_attention()
            raise UnsupportedModelError(
                f"model family {self.model_config.model_type!r} cannot run on the infergate engine: {exc}") from exc
        finally:
            register_attention()
        if not calls:
            self._restore_attention()
            raise UnsupportedModelError(
                f"model family {self.model_config.model_type!r} does not call transformers' attention interface "
                "(AttentionInterface), so the engine's KV cache cannot plug in; use a model family that supports "
                "attn_implementation (Llama, Qwen2, Mistral, Gemma, ...)")

    def _restore_attention(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.model._infergate_engines -= 1
        original = getattr(self.model, "_infergate_original_attention", None)
        if self.model._infergate_engines == 0 and original:
            self.model.set_attn_implementation(original)

    def close(self) -> None:
        self._restore_attention()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- facts --------------------------------------------------------------------------------------------
    @property
    def kv_allocated_bytes(self) -> int:
        return self.cache.allocated_bytes if self.cache is not None else 0

    @property
    def num_free_blocks(self) -> int | None:
        return self.blocks.num_free_blocks if self.blocks is not None else None

    def now(self) -> float:
        return time.perf_counter() - self._clock0

    # ---- submitting ---------------------------------------------------------------------------------------
    def _tokenize(self, request: Request) -> list[int]:
        ids = render_prompt(self.tokenizer, request)
        vocab = self.model_config.vocab_size
        bad = [t for t in set(ids) | set(request.stop_token_ids) if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"token ids {sorted(bad)[:5]} are outside the vocabulary (0..{vocab - 1}): check "
                               "prompt_token_ids / stop_token_ids")
        return ids

    def submit(self, request: Request, *, arrival: float | None = None) -> str:
        """Queue a request; returns its id. Invalid requests raise RequestError; requests the engine cannot take
        right now (queue full, prompt too long) end at once as `rejected`, with the reason."""
        ids = self._tokenize(request)
        request_id = request.request_id or f"req-{next(self._ids)}"
        if request_id in self._sequences:
            raise RequestError(f"request id {request_id!r} is already in use")
        now = self.now() if arrival is None else arrival
        if len(ids) >= self.max_model_len and not self.config.truncate_input:
            raise RequestError(f"prompt has {len(ids)} tokens, over the context window of {self.max_model_len}: "
                               "shorten it or set EngineConfig(truncate_input=True)")
        seq = Sequence(request, ids, now + self._clock0, request_id)
        self._sequences[request_id] = seq
        if len(ids) > self.max_input_tokens:
            if self.config.truncate_input:
                seq.prompt_token_ids = ids[-self.max_input_tokens:]
            else:
                return self._end(seq, FinishReason.REJECTED,
                                 f"prompt has {len(ids)} tokens, max_input_tokens is {self.max_input_tokens}")
        limit = self.config.max_new_tokens_limit
        budget_left = self.max_model_len - len(seq.prompt_token_ids)
        seq.max_new_tokens = min(request.max_new_tokens, limit or request.max_new_tokens, budget_left)
        if self.config.max_queue_len is not None and len(self.scheduler.waiting) >= self.config.max_queue_len:
            return self._end(seq, FinishReason.REJECTED, f"queue full ({self.config.max_queue_len} waiting)")
        self.scheduler.add(seq)
        return request_id

    def cancel(self, request_id: str) -> None:
        """Cancel a waiting or running request; it ends as `cancelled` at the next step."""
        seq = self._sequences.get(request_id)
        if seq is None:
            raise RequestError(f"no request with id {request_id!r}")
        seq.cancel_requested = True

    def result(self, request_id: str) -> Result | None:
        return self._results.get(request_id)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- running ------------------------------------------------------------------------------------------
    def _end(self, seq: Sequence, reason: FinishReason, detail: str) -> str:
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.remove(seq)
            seq.finish(reason, detail, time.perf_counter())
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            self._results[seq.request_id] = Result(
                seq.request_id, reason, detail, seq.prompt_token_ids, list(seq.output_token_ids), text,
                seq.timings, seq.num_preemptions, bool(seq.request.metadata.get("warmup")), seq.num_cached_tokens)
        return seq.request_id

    def _expire(self) -> None:
        now = time.perf_counter()
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            if seq.cancel_requested:
                self._end(seq, FinishReason.CANCELLED, "cancelled by the caller")
            elif seq.request.deadline_s is not None and now - seq.timings.arrival > seq.request.deadline_s:
                self._end(seq, FinishReason.TIMED_OUT,
                          f"deadline of {seq.request.deadline_s * 1000:.0f} ms passed after "
                          f"{len(seq.output_token_ids)} tokens")

    def _check_stop(self, seq: Sequence, token: int) -> tuple[FinishReason, str] | None:
        request = seq.request
        if token in self.eos_token_ids and not request.ignore_eos:
            return FinishReason.EOS, "end-of-sequence token"
        if token in request.stop_token_ids:
            return FinishReason.STOP, f"stop token {token}"
        if request.stop_strings:
            tail = self.tokenizer.decode(seq.output_token_ids[-16:], skip_special_tokens=False)
            for stop in request.stop_strings:
                if stop in tail:
                    return FinishReason.STOP, f"stop string {stop!r}"
        if len(seq.output_token_ids) >= seq.max_new_tokens:
            return FinishReason.LENGTH, f"max_new_tokens ({seq.max_new_tokens}) reached"
        return None

    def step(self, *, more_arrivals: bool = False) -> list[str]:
        """Run one scheduling step and one forward. Returns the ids of requests that ended in this step."""
        self._expire()
        step_start = time.perf_counter()
        plan = self.scheduler.schedule(step_start, more_arrivals)
        if plan.is_empty:
            return []
        for chunk in plan.chunks:
            if chunk.seq.timings.first_scheduled is None:
                chunk.seq.timings.first_scheduled = step_start
        try:
            logits, forward_s = self.runner.forward(plan)
        except torch.OutOfMemoryError as exc:
            return self._degrade(plan, exc)
        now = time.perf_counter()
        sampling = [c.seq for c in plan.chunks if c.samples]
        tokens = sample(logits, sampling) if sampling else []
        for chunk in plan.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
            if self.config.prefix_caching:
                self._register_full_blocks(chunk.seq)
        ended = []
        for seq, token in zip(sampling, tokens):
            seq.output_token_ids.append(token)
            seq.timings.token_times.append(now)
            if seq.timings.first_token is None:
                seq.timings.first_token = now
            stop = self._check_stop(seq, token)
            if stop is not None:
                ended.append(self._end(seq, *stop))
        if self.blocks is not None:
            self.peak_kv_blocks = max(self.peak_kv_blocks, self.blocks.num_used_blocks)
        if self.config.record_steps:
            decode_tokens = len(plan.decodes)
            self.steps.append(StepRecord(
                index=len(self.steps), start_s=step_start - self._clock0, batch_size=len(plan.chunks),
                num_prefill_tokens=sum(c.num_tokens for c in plan.prefills), num_decode_tokens=decode_tokens,
                num_padding_tokens=plan.num_padding,
                kv_blocks_used=self.blocks.num_used_blocks if self.blocks is not None else 0,
                forward_s=forward_s, step_s=time.perf_counter() - step_start, num_preempted=len(plan.preempted)))
        return ended

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

    def reset_prefix_cache(self) -> None:
        """Forget the cached prefixes: the next requests compute their prompts in full (between repetitions of a
        measured workload, so each repetition sees the same cache state)."""
        if self.blocks is not None:
            self.blocks.reset_prefix_cache()

    def _degrade(self, plan: StepPlan, exc: Exception) -> list[str]:
        """Out of device memory in a step: halve the running batch (newest out, recomputed later) and go on."""
        running = self.scheduler.running
        if len(running) <= 1:
            return [self._end(s, FinishReason.FAILED, f"out of memory with a batch of one: {exc}")
                    for s in list(running)]
        for seq in running[len(running) // 2:][::-1]:
            self.scheduler.preempt(seq)
        self.config.max_batch_size = max(1, len(self.scheduler.running))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.events.append(DegradationEvent(self.now(), "oom-halved-batch",
                                            f"out of memory at batch {len(plan.chunks)}; max_batch_size now "
                                            f"{self.config.max_batch_size}"))
        return []

    # ---- driving ------------------------------------------------------------------------------------------
    def generate(self, requests: Iterable[Request]) -> list[Result]:
        """Run `requests` to completion and return their results in order. A request's `arrival_s` is replayed:
        it is submitted that many seconds after the call starts (0 = all at once)."""
        requests = list(requests)
        start = self.now()
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        ids: list[str | None] = [None] * len(requests)
        cursor = 0
        while True:
            now = self.now()
            while cursor < len(order) and start + requests[order[cursor]].arrival_s <= now:
                index = order[cursor]
                ids[index] = self.submit(requests[index], arrival=start + requests[index].arrival_s)
                cursor += 1
            more = cursor < len(order)
            if self.scheduler.num_unfinished == 0:
                if not more:
                    break
                time.sleep(max(0.0, start + requests[order[cursor]].arrival_s - self.now()))
                continue
            self.step(more_arrivals=more)
            if not self.scheduler.running:
                # a static/dynamic batch is still forming: wait a little for arrivals or the window to close
                time.sleep(0.001)
        return [self._results[i] for i in ids]

    def run_until_done(self) -> None:
        while self.scheduler.num_unfinished:
            self.step()

    def stream(self, request: Request) -> Iterator[StreamChunk]:
        """Submit `request` and yield its tokens as they are produced (other queued requests run alongside).
        The generator's return value is the Result."""
        request_id = self.submit(request)
        seq = self._sequences[request_id]
        sent = 0
        text_so_far = ""
        while True:
            if seq.status != SequenceStatus.FINISHED:
                self.step()
            done = seq.status == SequenceStatus.FINISHED
            while sent < len(seq.output_token_ids):
                sent += 1
                text = self.tokenizer.decode(seq.output_token_ids[:sent], skip_special_tokens=True)
                # hold back a trailing incomplete multi-byte character until it completes (or the stream ends)
                last = done and sent == len(seq.output_token_ids)
                delta = ""
                if last or not text.endswith("\ufffd"):
                    delta, text_so_far = text[len(text_so_far):], text
                yield StreamChunk(seq.output_token_ids[sent - 1], delta)
            if done:
                return self._results[request_id]

    # ---- accounting ---------------------------------------------------------------------------------------
    def check_drained(self) -> None:
        """Every block is free again once no request is left (raises AssertionError otherwise)."""
        if self.scheduler.num_unfinished:
            raise AssertionError(f"{self.scheduler.num_unfinished} requests are still unfinished")
        if self.blocks is not None and self.blocks.num_free_blocks != self.blocks.num_blocks:
            raise AssertionError(f"{self.blocks.num_used_blocks} KV blocks still in use after draining")
