"""Engine: submit / step / generate / stream, with limits and per-request and per-step metrics."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from pytest_infergate.engine import arrivals, graph_build
from pytest_infergate.engine.attention import UnsupportedModelError, uninstall
from pytest_infergate.engine.block_manager import BlockManager
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.runner import (
    KVCache,
    ModelRunner,
    SamplingFailure,
    kv_bytes_per_token,
    num_blocks_for,
    record_top_logprobs,
    sample,
)
from pytest_infergate.engine.scheduler import Scheduler, StepPlan
from pytest_infergate.engine.self_check import attach
from pytest_infergate.engine.sequence import (
    DegradationEvent,
    FinishReason,
    Limits,
    Result,
    Sequence,
    SequenceStatus,
    StepRecord,
    StopChecker,
    StreamChunk,
    eos_token_ids,
)
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import Request, RequestError, render_prompt

__all__ = ["Engine", "UnsupportedModelError", "StepRecord", "DegradationEvent", "StreamChunk"]


class Engine:
    """The reference engine. Exact: with greedy decoding its outputs equal `model.generate(do_sample=False)`.

    The engine switches the model's attention implementation to its own for its lifetime; `close()` (or using
    the engine as a context manager) switches it back. On construction it checks itself against the model's own
    attention (`self_check`, a SelfCheckReport; `self_check_s`, its cost in seconds) and raises
    UnsupportedModelError for a model it cannot run exactly.
    """

    name = "engine"

    def __init__(self, model, tokenizer, config: EngineConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.model_config = model.config
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        if not self.dtype.is_floating_point:
            self.dtype = torch.float32
        graphs_wanted = graph_build.wanted(self.config, self.device)
        self.limits = Limits.of(model, self.config)
        self.max_model_len, self.max_input_tokens = self.limits.max_model_len, self.limits.max_input_tokens
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.stops = StopChecker(tokenizer, self.eos_token_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids or {0})

        def runner(cache, block_size):
            return ModelRunner(model, cache, block_size, self.device, pad, self.config.decode_group_size)

        # the model now runs on our attention
        self.layers, self.self_check = attach(model, runner, self.dtype, self.max_model_len)
        self.self_check_s = self.self_check.seconds
        self._closed = False
        geometry = {layer: spec.geometry for layer, spec in self.layers.items()}
        self.kv_bytes_per_token = kv_bytes_per_token(geometry, self.dtype)
        try:
            self.blocks, self.cache = self._allocate_cache(geometry, scratch_slot=graphs_wanted)
            self.scheduler = Scheduler(self.config, self.blocks, self._shared_window())
            self.runner = runner(self.cache, self.config.block_size)
            self.cuda_graphs = (graph_build.attach(self, pad) if graphs_wanted  # a GraphStatus
                                else graph_build.not_wanted(self.config, self.device))
        except BaseException:
            self.close()
            raise
        # what the engine's timings read; perf.lockstep swaps in a clock that runs only during this engine's steps
        self.clock: Callable[[], float] = time.perf_counter
        self._clock0 = self.clock()
        self._ids = itertools.count()
        self._sequences: dict[str, Sequence] = {}
        self._results: dict[str, Result] = {}
        self.steps: list[StepRecord] = []
        self.events: list[DegradationEvent] = []
        self.peak_kv_blocks = 0

    def _allocate_cache(self, geometry, scratch_slot: bool) -> tuple[BlockManager | None, KVCache | None]:
        """The block manager and the cache tensors; with `scratch_slot`, one slot more that no block covers (where
        the CUDA graphs' padding rows write)."""
        if self.config.cache_mode == "none":
            return None, None
        block_size = self.config.block_size
        num_blocks = num_blocks_for(self.config, self.kv_bytes_per_token)
        if num_blocks * block_size < self.max_model_len and not self.config.kv_sized_for_workload:
            raise OptionError(
                f"EngineConfig KV budget holds {num_blocks * block_size} tokens ({num_blocks} blocks of {block_size}, "
                f"{self.kv_bytes_per_token} bytes per token) but one sequence may need max_model_len = "
                f"{self.max_model_len}: raise kv_budget_bytes/kv_budget_blocks or lower max_model_len")
        cache = KVCache(geometry, num_blocks * block_size + int(scratch_slot), self.dtype, self.device)
        return BlockManager(num_blocks, block_size, self.config.prefix_caching), cache

    def _shared_window(self) -> int | None:
        """The largest sliding window when every attention layer has one (None otherwise): no query reads a key
        further back, so the scheduler gives back the blocks behind it."""
        windows = [spec.sliding_window for spec in self.layers.values()]
        return None if None in windows else max(windows)

    def close(self) -> None:
        """Switch the model back to its own attention and let go of the CUDA graphs and their memory pool (once;
        later calls do nothing)."""
        if not self._closed:
            self._closed = True
            uninstall(self.model)
            if getattr(self, "runner", None) is not None:  # close() also runs when construction failed
                self.runner.graphs = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- facts --------------------------------------------------------------------------------------------
    @property
    def kv_allocated_bytes(self) -> int:
        return self.cache.allocated_bytes if self.cache is not None else 0

    @property
    def device_s(self) -> float | None:
        """The device's time in this engine's forwards so far, by CUDA events; None off CUDA (engine.runner)."""
        return self.runner.device_s

    @property
    def num_free_blocks(self) -> int | None:
        return self.blocks.num_free_blocks if self.blocks is not None else None

    def now(self) -> float:
        return self.clock() - self._clock0

    @contextmanager
    def use_clock(self, clock: Callable[[], float]) -> Iterator[None]:
        """Time the requests run inside the block on `clock` (seconds) instead of the wall clock. Only between
        workloads: a request's timings must all come from one clock."""
        if self.has_unfinished:
            raise RuntimeError("Engine.use_clock: requests are still running; switch clocks between workloads")
        saved = self.clock, self._clock0
        self.clock, self._clock0 = clock, clock()
        try:
            yield
        finally:
            self.clock, self._clock0 = saved

    # ---- submitting ---------------------------------------------------------------------------------------
    def _new_request_id(self) -> str:
        """An automatic id no request (with a user's id or an automatic one) has used."""
        while True:
            request_id = f"req-{next(self._ids)}"
            if request_id not in self._sequences:
                return request_id

    def submit(self, request: Request, *, arrival: float | None = None) -> str:
        """Queue a request; returns its id. Invalid requests raise RequestError; requests the engine cannot take
        right now (queue full, prompt too long) end at once as `rejected`, with the reason."""
        ids = render_prompt(self.tokenizer, request)
        self.limits.check(request, ids)
        if request.request_id is not None and request.request_id in self._sequences:
            raise RequestError(f"request id {request.request_id!r} is already in use")
        request_id = request.request_id or self._new_request_id()
        seq = Sequence(request, ids, (self.now() if arrival is None else arrival) + self._clock0, request_id)
        self._sequences[request_id] = seq
        seq.prompt_token_ids, seq.max_new_tokens, rejected = self.limits.fit(request, ids)
        if not rejected and self.config.kv_sized_for_workload and self.blocks is not None:
            need = len(seq.prompt_token_ids) + seq.max_new_tokens  # a sequence that could never fit: no hang
            if -(-need // self.config.block_size) > self.blocks.num_blocks:
                rejected = f"needs {need} tokens of KV cache, more than the budget sized for this workload holds"
        if rejected:
            return self._end(seq, FinishReason.REJECTED, rejected)
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
    def step(self, *, more_arrivals: bool = False) -> list[str]:
        """One step: schedule, run the forward, sample, postprocess. Returns the ids of requests that ended."""
        self._expire()
        started = self.clock()
        plan = self.scheduler.schedule(started, more_arrivals)
        if plan.is_empty:
            return []
        try:
            logits, forward_s = self.runner.forward(plan)
        except torch.OutOfMemoryError as exc:
            return self._degrade(plan, exc)
        tokens = sample(logits, plan.sampling)
        record_top_logprobs(logits, plan.sampling, tokens)
        ended = self._postprocess(plan, tokens)
        self._record_step(plan, started, forward_s)
        return ended

    def _postprocess(self, plan: StepPlan, tokens: list[int | SamplingFailure]) -> list[str]:
        """Advance the sequences past the plan's tokens, append the sampled tokens, end those that stop."""
        sampled = plan.sampling  # before advancing: which chunks reached their sequence's end
        self.scheduler.advance(plan)
        now = self.clock()
        ended = []
        for seq, token in zip(sampled, tokens):
            if isinstance(token, SamplingFailure):
                ended.append(self._end(seq, FinishReason.FAILED, token.reason))
                continue
            seq.output_token_ids.append(token)
            seq.timings.token_times.append(now)
            if seq.timings.first_token is None:
                seq.timings.first_token = now
            stop = self.stops.check(seq.request, seq.output_token_ids, seq.max_new_tokens)
            if stop is not None:
                ended.append(self._end(seq, *stop))
        return ended

    def _record_step(self, plan: StepPlan, started: float, forward_s: float) -> None:
        used = self.blocks.num_used_blocks if self.blocks is not None else 0
        self.peak_kv_blocks = max(self.peak_kv_blocks, used)
        if self.config.record_steps:
            self.steps.append(StepRecord(
                index=len(self.steps), start_s=started - self._clock0, batch_size=len(plan.chunks),
                num_prefill_tokens=sum(c.num_tokens for c in plan.prefills), num_decode_tokens=len(plan.decodes),
                num_padding_tokens=plan.num_padding, kv_blocks_used=used, forward_s=forward_s,
                step_s=self.clock() - started, num_preempted=len(plan.preempted),
                device_s=self.runner.last_device_s))

    def _end(self, seq: Sequence, reason: FinishReason, detail: str) -> str:
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.remove(seq)
            seq.finish(reason, detail, self.clock())
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            self._results[seq.request_id] = seq.result(text)
        return seq.request_id

    def _expire(self) -> None:
        now = self.clock()
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            if seq.cancel_requested:
                self._end(seq, FinishReason.CANCELLED, "cancelled by the caller")
            elif seq.request.deadline_s is not None and now - seq.timings.arrival > seq.request.deadline_s:
                self._end(seq, FinishReason.TIMED_OUT,
                          f"deadline of {seq.request.deadline_s * 1000:.0f} ms passed after "
                          f"{len(seq.output_token_ids)} tokens")

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
        self.scheduler.halve_running()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.events.append(DegradationEvent(self.now(), "oom-halved-batch",
                                            f"out of memory at batch {len(plan.chunks)}; max_batch_size now "
                                            f"{self.config.max_batch_size}"))
        return []

    # ---- driving ------------------------------------------------------------------------------------------
    def generate(self, requests: Iterable[Request]) -> list[Result]:
        """Run `requests` to completion and return their results in order. A request's `arrival_s` is replayed:
        it is submitted that many seconds after the call starts (0 = all at once). A bad request raises
        RequestError naming it before any is queued (engine.arrivals)."""
        return arrivals.generate(self, requests)

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
