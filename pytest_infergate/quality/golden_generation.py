"""Golden samples through a local model on its backend (the reference engine, or HF generate where the engine
refused it), greedy, and how much a sample's answer depends on its batch. Tokens depend on which samples share a
forward (LLM.int8 picks outlier columns over every row; fp32 kernels block by the row count), so golden outputs are
always generated in one fixed composition: the WHOLE sample file in file order in one run with GOLDEN_BATCHING, a
subset selected from it (HF generate: static batches in file order, so the method recorded names the backend). Batch
invariance (`check_variants`) runs each sample `alone`, in that `batch` and `rotated` by half, and reports per variant
the samples that changed, the margin at the first divergence and the teacher-forced KL(alone || batched). Why, and
what was measured: docs/explanation/quality-gates.md, 'check_batch_invariance'.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_infergate import context
from pytest_infergate.engine import EngineConfig
from pytest_infergate.quality.batch_invariance import BatchInvariance, Divergence, VariantResult
from pytest_infergate.quality.golden_files import GoldenError, GoldenSample, load_samples
from pytest_infergate.quality.metrics import Generated, first_divergence
from pytest_infergate.requirements import import_torch
from pytest_infergate.stats import mean
from pytest_infergate.workloads.request import Request, RequestError, render_prompt
from pytest_infergate.workloads.transcript import answer_tokens, transcript_stops

DEFAULT_MAX_MODEL_LEN = 2048
# log-probabilities recorded per generated token: the margin of a changed golden token is read from the run that
# generated it (its batch's numerics included); an accepted token outside the top 8 is far from a tie
GOLDEN_TOP_LOGPROBS = 8
# the engine settings that decide which tokens share a forward (max_model_len only caps lengths)
GOLDEN_BATCHING = {"batching": "continuous", "cache_mode": "paged", "max_batch_size": 64, "max_batched_tokens": 2048,
                   "prefill_chunk_size": 512, "block_size": 16, "kv_budget_bytes": 512 << 20}


@dataclass
class GenerationRun:
    """One engine run over a composition of samples, with what it cost."""

    outputs: list[Generated]
    wall_s: float
    cpu_s: float  # process CPU time: on a shared machine the honest figure beside the wall time
    threads: int
    composition: str = ""  # composition_id of the samples, in the order they ran
    by_id: dict[str, Generated] = field(init=False)

    def __post_init__(self):
        self.by_id = {g.id: g for g in self.outputs}


def golden_engine_config(max_model_len: int = DEFAULT_MAX_MODEL_LEN, **overrides) -> EngineConfig:
    return EngineConfig(**{**GOLDEN_BATCHING, "max_model_len": max_model_len, "record_steps": False, **overrides})


def golden_method(backend: str = "engine", plain_text: bool = False) -> dict:
    """How accepted outputs are made, written into their header: a file made another way is not comparable.
    `backend`: the backend's name (the engine's method says none, as files written before backends existed);
    `plain_text`: a base model's, whose answers end at the transcript's next turn (a chat model's method says none)."""
    method = {"generation": "whole sample file, file order, one engine run", "engine": dict(GOLDEN_BATCHING),
              "scoring": "alone (one row per forward)"}
    if plain_text:
        method["answer"] = "plain-text transcript, cut before the first next-turn marker"
    if backend != "engine":
        method["backend"] = f"{backend}: static batches of {GOLDEN_BATCHING['max_batch_size']} through model.generate"
    return method


def composition_id(samples: list[GoldenSample]) -> str:
    """A hash of what decides the generation of a composition: each sample's id and request, in order."""
    payload = json.dumps([[s.id, s.request_kwargs()] for s in samples], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def golden_requests(samples: list[GoldenSample], tokenizer, max_model_len: int, max_new_tokens: int | None = None
                    ) -> list[Request]:
    """One greedy request per sample (`max_new_tokens`: at most that many of each sample's tokens); a sample the
    engine could never serve is an error naming its file and line."""
    requests = []
    for sample in samples:
        kwargs = sample.request_kwargs()
        if max_new_tokens is not None:
            kwargs["max_new_tokens"] = min(kwargs["max_new_tokens"], max_new_tokens)
        try:
            # a base model's answer stops where it opens the next turn of its transcript (run_samples cuts it there)
            request = Request(**kwargs, request_id=sample.id, top_logprobs=GOLDEN_TOP_LOGPROBS,
                              stop_strings=transcript_stops(tokenizer, kwargs.get("messages")))
            length = len(render_prompt(tokenizer, request))
        except RequestError as exc:
            raise GoldenError(f"{sample.where or 'golden set'}: sample {sample.id!r}: {exc}") from None
        if length >= max_model_len:
            raise GoldenError(f"{sample.where or 'golden set'}: sample {sample.id!r} has a {length}-token prompt, over "
                              f"the golden engine's context of {max_model_len} tokens: shorten it, or raise the limit "
                              f"with --infergate-golden-max-len (ini infergate_golden_max_len)")
        requests.append(request)
    return requests


def run_samples(loaded, samples: list[GoldenSample], max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                config: EngineConfig | None = None, max_new_tokens: int | None = None) -> GenerationRun:
    """Greedy outputs of `samples`, all submitted at once in this order to one backend of the model
    (GOLDEN_BATCHING unless `config`): the composition is exactly this list. `max_new_tokens` caps every sample's
    output: in a batch of one those are the first tokens of the uncapped run (greedy decoding is causal); in a
    larger batch a sequence that stops sooner frees its slot sooner, so the run is a composition of its own."""
    torch = import_torch()
    # imported here, where a model runs: the endpoint-only install (no torch) imports this module
    from pytest_infergate.engine.backends import choice_for

    requests = golden_requests(samples, loaded.tokenizer, max_model_len, max_new_tokens)
    wall, cpu = time.perf_counter(), time.process_time()
    backend = choice_for(loaded).build(loaded.model, loaded.tokenizer, config or golden_engine_config(max_model_len))
    with backend:
        results = backend.generate(requests)
    decode = functools.partial(loaded.tokenizer.decode, skip_special_tokens=True)
    outputs = [Generated(s.id, r.prompt_token_ids, r.token_ids, r.text, r.top_logprobs)
               for s, r in zip(samples, results)]
    # the engine stops after the token that completes a next-turn marker (HF generate does not stop): cut before it
    outputs = [_first_tokens(g, answer_tokens(g.token_ids, decode, q.stop_strings), loaded.tokenizer)
               for g, q in zip(outputs, requests)]
    return GenerationRun(outputs, time.perf_counter() - wall, time.process_time() - cpu, torch.get_num_threads(),
                         composition_id(samples))


def generate_golden_outputs(loaded, samples: list[GoldenSample], max_model_len: int = DEFAULT_MAX_MODEL_LEN
                            ) -> list[Generated]:
    """Greedy outputs of exactly `samples` in one run (their own composition; the gates use `fixed_outputs`)."""
    return run_samples(loaded, samples, max_model_len).outputs


def sample_sets_of(samples: list[GoldenSample]) -> dict[str, list[GoldenSample]]:
    """The whole sample set (file order) of every requested sample. Samples built in code (no source file) form
    one set of their own, in the order given."""
    sets: dict[str, list[GoldenSample]] = {}
    for sample in samples:
        if sample.source not in sets:
            sets[sample.source] = load_samples(Path(sample.source)) if sample.source else [
                s for s in samples if not s.source]
    for source, whole in sets.items():
        missing = {s.id for s in samples if s.source == source} - {s.id for s in whole}
        if missing:
            raise GoldenError(f"{source}: samples {sorted(missing)} are no longer in the file (it changed during "
                              "the run?)")
    return sets


def fixed_runs(loaded, samples: list[GoldenSample], cache: dict, max_model_len: int = DEFAULT_MAX_MODEL_LEN
               ) -> list[GenerationRun]:
    """The fixed-composition run of each sample set the requested samples belong to, once per session and
    precision (`cache` is the session's)."""
    runs = []
    for source, whole in sample_sets_of(samples).items():
        key = (loaded.record.requested_precision, source, composition_id(whole), max_model_len)
        if key not in cache:
            started = time.monotonic()
            cache[key] = run_samples(loaded, whole, max_model_len)
            took = time.monotonic() - started
            if took >= context.EVERY_S:  # quick work prints nothing, as elsewhere
                context.report(f"generated the golden outputs of {len(whole)} samples ({Path(source).name}, "
                                f"{loaded.record.requested_precision}) in {took:.0f} s, once this session")
        runs.append(cache[key])
    return runs


def fixed_outputs(loaded, samples: list[GoldenSample], cache: dict, max_model_len: int = DEFAULT_MAX_MODEL_LEN
                  ) -> list[Generated]:
    """The greedy outputs of `samples`, selected from their sample sets' fixed-composition runs."""
    by_id = {}
    for run in fixed_runs(loaded, samples, cache, max_model_len):
        by_id.update(run.by_id)
    return [by_id[s.id] for s in samples]


SCORING_BATCH = {"batch": 8, "rotated": 4}


def rotate(samples: list, by: int | None = None) -> list:
    by = len(samples) // 2 if by is None else by
    return samples[by:] + samples[:by]


def _kl_per_sample(alone_lp: list, batched_lp: list) -> list[float]:
    """Mean KL(alone || batched) per row (rows with no tokens skipped)."""
    out = []
    for a, b in zip(alone_lp, batched_lp):
        if len(a):
            out.append(float((a.exp() * (a - b)).sum(-1).clamp_min(0).mean()))
    return out


def check_variants(loaded, samples: list[GoldenSample], fixed: list, max_model_len: int, fixed_s: float = 0.0,
                   max_new_tokens: int | None = None) -> BatchInvariance:
    """The variants of `samples` (see the module docstring); `fixed`: their outputs in the fixed-composition run;
    `max_new_tokens`: compare each sample's first that many tokens only."""
    from pytest_infergate.quality.scoring import score_rows  # torch: only when run

    wall, cpu = time.perf_counter(), time.process_time()
    n = len(samples)
    alone = run_samples(loaded, samples, max_model_len, golden_engine_config(max_model_len, max_batch_size=1),
                        max_new_tokens)
    rotated_samples = rotate(samples)
    rotated = run_samples(loaded, rotated_samples, max_model_len,
                          golden_engine_config(max_model_len, max_batch_size=max(1, (n + 1) // 2)), max_new_tokens)
    if max_new_tokens is not None:
        fixed = [_first_tokens(g, max_new_tokens, loaded.tokenizer) for g in fixed]
    rows = [(g.prompt_ids, g.token_ids) for g in alone.outputs]
    alone_lp = score_rows(loaded.model, rows)
    variants = []
    for name, description, outputs, order, seconds in (
            ("batch", "the fixed-composition run (whole sample file at once)", fixed, list(range(n)), fixed_s),
            ("rotated", f"rotated by half, at most {max(1, (n + 1) // 2)} at a time", _in_order(rotated, samples),
             [i for i in rotate(list(range(n)))], rotated.wall_s)):
        changed = [_divergence(a, v, lp, loaded.tokenizer)
                   for a, v, lp in zip(alone.outputs, outputs, alone_lp) if a.token_ids != v.token_ids]
        batched = score_rows(loaded.model, [rows[i] for i in order], SCORING_BATCH[name])
        by_index = dict(zip(order, batched))
        kls = _kl_per_sample(alone_lp, [by_index[i] for i in range(n)])
        variants.append(VariantResult(name, description, changed, n, mean(kls) if kls else None,
                                      max(kls) if kls else None, seconds))
    notes = [f"alone: {alone.wall_s:.0f}s wall, {alone.cpu_s:.0f}s CPU; rotated: {rotated.wall_s:.0f}s wall, "
             f"{rotated.cpu_s:.0f}s CPU; {alone.threads} torch threads"]
    if max_new_tokens is not None:
        notes.insert(0, f"each sample compared on its first {max_new_tokens} tokens")
    return BatchInvariance(loaded.record.requested_precision, [s.id for s in samples], variants,
                           time.perf_counter() - wall, time.process_time() - cpu, notes, max_new_tokens)


def _in_order(run, samples: list[GoldenSample]) -> list:
    return [run.by_id[s.id] for s in samples]


def _first_tokens(generated, count: int, tokenizer):
    """`generated` cut to its first `count` tokens (text decoded as the engine decodes a finished output)."""
    if len(generated.token_ids) <= count:
        return generated
    ids = generated.token_ids[:count]
    return replace(generated, token_ids=ids, text=tokenizer.decode(ids, skip_special_tokens=True),
                   top_logprobs=generated.top_logprobs[:count])


def _divergence(alone, variant, logprobs, tokenizer) -> Divergence:
    index = first_divergence(alone.token_ids, variant.token_ids)
    margin = None
    if index is not None and index < min(len(alone.token_ids), len(variant.token_ids)):
        row = logprobs[index]
        margin = float(row[alone.token_ids[index]] - row[variant.token_ids[index]])
    prefix = len(tokenizer.decode(alone.token_ids[:index or 0], skip_special_tokens=True))
    return Divergence(alone.id, index or 0, margin, alone.text[prefix:prefix + 60], variant.text[prefix:prefix + 60])
