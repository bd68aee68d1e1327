"""The HF generate backend: the gates' workloads through transformers' own `model.generate`, for models the engine
refuses (or to compare the two on one model), with the surface the bench uses on `Engine`: `generate(requests)`
with per-request timings, `config`, `steps`, `events`, the KV figures, `reset_prefix_cache()`, `check_drained()`,
`close()`. Static batching only (left-padded batches of `max_batch_size` in arrival order), transformers' own KV
cache, timings from a stopping criterion called after every token (which also ends rows for the engine's reasons)
and generate's own sampler: greedy outputs equal `model.generate`'s, as the engine's do. How it differs from the
engine, point by point: docs/explanation/engine.md, 'How the HF backend differs'.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from pytest_infergate.engine.attention import own_attention
from pytest_infergate.engine.config import EngineConfig
from pytest_infergate.engine.runner import kv_bytes_per_token
from pytest_infergate.engine.sequence import (
    DegradationEvent,
    FinishReason,
    Limits,
    Result,
    StepRecord,
    StopChecker,
    eos_token_ids,
)
from pytest_infergate.errors import OptionError
from pytest_infergate.workloads.request import Request, render_prompt
from pytest_infergate.workloads.timings import RequestTimings


@dataclass
class Row:
    """One request inside a generate batch."""

    request: Request
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    timings: RequestTimings
    tokens: list[int] = field(default_factory=list)
    finish: tuple[FinishReason, str] | None = None


class BatchWatcher:
    """generate's stopping criterion: called after each generated token with the ids so far. It timestamps the
    token of every row still running, ends rows for the engine's reasons, and reports each step."""

    def __init__(self, rows: list[Row], stops: StopChecker, width: int, on_step):
        self.rows = rows
        self.stops = stops
        self.width = width  # padded prompt length
        self.on_step = on_step  # called with (this watcher, now, rows that got a token)
        self.num_generated = 0
        self.last = time.perf_counter()  # the end of the previous step

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        now = time.perf_counter()
        self.num_generated += 1
        running = [row for row in self.rows if row.finish is None]
        for row, token in zip(self.rows, input_ids[:, -1].tolist()):
            if row.finish is None:
                row.tokens.append(token)
                row.timings.token_times.append(now)
                row.timings.first_token = row.timings.first_token or now
                row.finish = self.stops.check(row.request, row.tokens, row.max_new_tokens) or self._expired(row, now)
                if row.finish is not None:
                    row.timings.end(now)
        self.on_step(self, now, len(running))
        self.last = now
        return torch.tensor([row.finish is not None for row in self.rows], device=input_ids.device)

    @property
    def num_cached_tokens(self) -> int:
        return len(self.rows) * (self.width + self.num_generated)

    @staticmethod
    def _expired(row: Row, now: float) -> tuple[FinishReason, str] | None:
        deadline = row.request.deadline_s
        if deadline is not None and now - row.timings.arrival > deadline:
            return FinishReason.TIMED_OUT, f"deadline of {deadline * 1000:.0f} ms passed after {len(row.tokens)} tokens"
        return None


class HFGenerateBackend:
    """Runs requests through `model.generate` in static batches. `config` must ask for static (or sequential)
    batching on a contiguous cache, without prefix caching; `hf_config(config)` turns a config the engine would
    run into that (see backends.make_backend)."""

    name = "hf-generate"
    self_check = None  # the engine's self-check does not apply: this is the model's own implementation
    self_check_s = None

    def __init__(self, model, tokenizer, config: EngineConfig | None = None):
        config = config or EngineConfig(batching="static", cache_mode="contiguous")
        if config.batching not in ("static", "sequential") or config.cache_mode != "contiguous" \
                or config.prefix_caching:
            raise OptionError(
                f"the hf-generate backend runs static batches on transformers' own cache: it takes "
                f"EngineConfig(batching='static' or 'sequential', cache_mode='contiguous', prefix_caching=False), "
                f"got batching={config.batching!r}, cache_mode={config.cache_mode!r}, "
                f"prefix_caching={config.prefix_caching}. hf_config(config) converts a config it can run")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.device = next(model.parameters()).device
        self.limits = Limits.of(model, config)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.stops = StopChecker(tokenizer, self.eos_token_ids)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else min(self.eos_token_ids or {0})
        self.kv_bytes_per_token = self._measure_kv_bytes_per_token()
        self.steps: list[StepRecord] = []
        self.events: list[DegradationEvent] = []
        self.peak_kv_blocks = 0
        self._peak_kv_tokens = 0
        self._clock0 = time.perf_counter()
        self._ids = itertools.count()

    @torch.inference_mode()
    def _measure_kv_bytes_per_token(self) -> int:
        """What transformers' cache holds for one token, measured on a one-token forward (configs can be wrong
        about head dims); from the config if the model returns no cache."""
        dtype = self.model.get_input_embeddings().weight.dtype
        try:
            with own_attention(self.model):
                out = self.model(input_ids=torch.tensor([[self.pad_token_id]], device=self.device), use_cache=True)
            cache = out.get("cache") or out.get("past_key_values")
            return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        except Exception:
            return kv_bytes_per_token(self.model.config, dtype if dtype.is_floating_point else torch.float32)

    # ---- the bench's surface ------------------------------------------------------------------------------------
    @property
    def kv_allocated_bytes(self) -> int:
        """The largest KV cache a batch grew to (transformers allocates as it goes)."""
        return self._peak_kv_tokens * self.kv_bytes_per_token

    def reset_prefix_cache(self) -> None:
        """No prefix cache here: nothing to forget."""

    def check_drained(self) -> None:
        """Nothing is held between generate() calls."""

    def close(self) -> None:
        """Nothing to restore: the model's attention was never switched."""

    def __enter__(self) -> HFGenerateBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def now(self) -> float:
        return time.perf_counter() - self._clock0

    # ---- generating ---------------------------------------------------------------------------------------------
    def generate(self, requests) -> list[Result]:
        """Run `requests` to completion in static batches and return their results in order. A request's
        `arrival_s` is replayed: a batch starts once its last request has arrived."""
        requests = list(requests)
        start = time.perf_counter()
        results: list[Result | None] = [None] * len(requests)
        rows: list[tuple[int, Row]] = []
        for index in sorted(range(len(requests)), key=lambda i: requests[i].arrival_s):
            row = self._admit(requests[index], start)
            if isinstance(row, Result):
                results[index] = row
            else:
                rows.append((index, row))
        for batch in self._batches(rows):
            time.sleep(max(0.0, max(row.timings.arrival for _, row in batch) - time.perf_counter()))
            self._run(batch, results)
        return results

    def _admit(self, request: Request, start: float) -> Row | Result:
        ids = render_prompt(self.tokenizer, request)
        self.limits.check(request, ids)
        ids, max_new_tokens, rejected = self.limits.fit(request, ids)
        row = Row(request, request.request_id or f"hf-{next(self._ids)}", ids, max_new_tokens,
                  RequestTimings(arrival=start + request.arrival_s))
        if rejected:
            row.finish = (FinishReason.REJECTED, rejected)
            row.timings.end(time.perf_counter())
            return self._result(row)
        return row

    def _batches(self, rows: list[tuple[int, Row]]):
        """Consecutive requests (in arrival order) with the same sampling settings, max_batch_size at a time."""
        def setting(row: Row):
            r = row.request
            return (r.temperature, r.top_p, r.top_k) if not r.is_greedy else "greedy"

        for _, group in itertools.groupby(rows, key=lambda item: setting(item[1])):
            group = list(group)
            for first in range(0, len(group), self.config.max_batch_size):
                yield group[first:first + self.config.max_batch_size]

    def _run(self, batch: list[tuple[int, Row]], results: list) -> None:
        rows = [row for _, row in batch]
        try:
            self._generate(rows)
        except torch.OutOfMemoryError as exc:
            if len(rows) == 1:
                rows[0].finish = rows[0].finish or (FinishReason.FAILED, f"out of memory with a batch of one: {exc}")
            else:  # halve the batch and go on, as the engine does
                self.events.append(DegradationEvent(self.now(), "oom-halved-batch",
                                                    f"out of memory at batch {len(rows)}; running halves"))
                half = len(batch) // 2
                for part in (batch[:half], batch[half:]):
                    for _, row in part:
                        row.tokens.clear()
                        row.timings.token_times.clear()
                        row.timings.first_token = None
                    self._run(part, results)
                return
        except Exception as exc:  # e.g. sampling from non-finite logits: these requests fail, the next go on
            for row in rows:
                row.finish = row.finish or (FinishReason.FAILED, f"generate failed: {type(exc).__name__}: {exc}")
        for index, row in batch:
            results[index] = self._result(row)

    @torch.inference_mode()
    def _generate(self, rows: list[Row]) -> None:
        from transformers import GenerationConfig, StoppingCriteriaList

        width = max(len(row.prompt_ids) for row in rows)
        ids = torch.tensor([[self.pad_token_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in rows])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows])
        first = rows[0].request
        sampling = {} if first.is_greedy else dict(temperature=first.temperature, top_p=first.top_p,
                                                   top_k=first.top_k)
        config = GenerationConfig(do_sample=not first.is_greedy, max_new_tokens=max(r.max_new_tokens for r in rows),
                                  pad_token_id=self.pad_token_id, eos_token_id=None, **sampling)
        watcher = BatchWatcher(rows, self.stops, width, self._record_step)
        for row in rows:
            row.timings.first_scheduled = watcher.last
        devices = [self.device] if self.device.type == "cuda" else []
        with own_attention(self.model), torch.random.fork_rng(devices=devices):
            if first.seed is not None:
                torch.manual_seed(first.seed)
            self.model.generate(ids.to(self.device), attention_mask=mask.to(self.device), generation_config=config,
                                stopping_criteria=StoppingCriteriaList([watcher]))
        for row in rows:  # generate ended: a row the watcher has not ended reached the batch's longest length
            if row.finish is None:
                row.finish = (FinishReason.LENGTH, f"max_new_tokens ({row.max_new_tokens}) reached")
                row.timings.end(time.perf_counter())

    def _record_step(self, watcher: BatchWatcher, now: float, num_running: int) -> None:
        """One generate step as the engine records its steps (the first is the batch's prefill)."""
        cached = watcher.num_cached_tokens
        self._peak_kv_tokens = max(self._peak_kv_tokens, cached)
        blocks = -(-cached // self.config.block_size)
        self.peak_kv_blocks = max(self.peak_kv_blocks, blocks)
        if not self.config.record_steps:
            return
        rows, prefill = watcher.rows, watcher.num_generated == 1
        prompt_tokens = sum(len(r.prompt_ids) for r in rows)
        self.steps.append(StepRecord(
            index=len(self.steps), start_s=watcher.last - self._clock0, batch_size=len(rows),
            num_prefill_tokens=prompt_tokens if prefill else 0, num_decode_tokens=0 if prefill else num_running,
            num_padding_tokens=len(rows) * watcher.width - prompt_tokens if prefill else len(rows) - num_running,
            kv_blocks_used=blocks, forward_s=now - watcher.last, step_s=now - watcher.last))

    def _result(self, row: Row) -> Result:
        reason, detail = row.finish
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        return Result(row.request_id, reason, detail, row.prompt_ids, list(row.tokens), text, row.timings,
                      is_warmup=bool(row.request.metadata.get("warmup")))
