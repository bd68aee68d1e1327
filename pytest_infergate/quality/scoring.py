"""Scoring golden outputs: the log-probabilities a model gives a fixed continuation (teacher-forced), the KL / top-1
/ NLL built on them, and THE comparison of a candidate's golden outputs with the reference precision's, for local
precisions and endpoints alike. Both sides see the same tokens, so the figures measure the models, not where their
greedy paths parted. Golden scoring is always ALONE, one row per forward: a row's log-probabilities in a padded batch
depend on the other rows (int8's outlier columns, the GEMM's row count), so accepted log-probabilities are recorded
and checked with the same computation. The reference's are scored once per session (ScoreCache). Light to import:
torch comes from requirements.import_torch() where a model is scored (the endpoint-only install imports this module)."""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

from pytest_infergate.models import QUANTIZED
from pytest_infergate.quality.golden_files import GoldenSample
from pytest_infergate.quality.metrics import (
    Generated,
    QualityResult,
    SampleQuality,
    TokenStats,
    aggregate,
    by_category,
    compare_sample,
)
from pytest_infergate.requirements import import_torch

if TYPE_CHECKING:
    import torch

TOP_K = 10
# What a ScoreCache keeps at most: the reference's log-probabilities of the 48 default samples' continuations are
# about 0.3 GiB for a 49k-token vocabulary (tokens x vocabulary x 4 bytes)
SCORE_CACHE_BYTES = 1 << 30


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def continuation_logprobs(model, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """log-softmax [len(continuation), vocab] (float32) predicting each continuation token, for each row."""
    torch = import_torch()
    with torch.inference_mode():
        device = next(model.parameters()).device
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (prompt, cont) in enumerate(rows):
            seq = prompt + cont
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        out = []
        for i, (prompt, cont) in enumerate(rows):
            start = len(prompt) - 1
            out.append(torch.log_softmax(logits[i, start:start + len(cont)].float(), dim=-1).cpu())
        return out


def score_rows(model, rows: list[tuple[list[int], list[int]]], batch_size: int = 1) -> list[torch.Tensor]:
    """`continuation_logprobs` of each row, `batch_size` rows per forward (1: alone, the golden scoring)."""
    return [lp for batch in _batches(rows, batch_size) for lp in continuation_logprobs(model, batch)]


class ScoreCache:
    """Alone log-probabilities of rows, kept per model to be read again: every candidate precision is compared on
    the reference's continuations, so the reference's log-probabilities of them are computed once per session,
    not once per candidate. Up to `max_bytes`; rows past that are scored again when asked."""

    def __init__(self, max_bytes: int = SCORE_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(prompt, cont): log-probs}

    def logprobs(self, model, rows: list[tuple[list[int], list[int]]]) -> list:
        """`score_rows(model, rows)` (alone), from what was kept where it can be."""
        kept = self._kept.setdefault(model, {})
        keys = [(tuple(prompt), tuple(cont)) for prompt, cont in rows]
        missing = [i for i, key in enumerate(keys) if key not in kept]
        scored = dict(zip(missing, score_rows(model, [rows[i] for i in missing])))
        out = []
        for i, key in enumerate(keys):
            if i in scored:
                size = scored[i].numel() * scored[i].element_size()
                if self.bytes + size <= self.max_bytes:
                    kept[key] = scored[i]
                    self.bytes += size
            out.append(scored[i] if i in scored else kept[key])
        return out


def teacher_forced(reference_model, candidate_model, rows: list[tuple[list[int], list[int]]],
                   batch_size: int = 1, reference_scores: ScoreCache | None = None
                   ) -> tuple[list[TokenStats], list[list[list[list[float]]]]]:
    """Score the reference continuations under both models, `batch_size` rows per forward (1: alone). Returns
    per-row TokenStats and the reference's top-k log-probabilities per token (what golden files store).
    `reference_scores`: where the reference's alone log-probabilities are kept between calls."""
    stats, topks = [], []
    for batch in _batches(rows, batch_size):
        if reference_scores is not None and batch_size == 1:
            ref_lp = reference_scores.logprobs(reference_model, batch)
        else:
            ref_lp = continuation_logprobs(reference_model, batch)
        cand_lp = ref_lp if candidate_model is reference_model else continuation_logprobs(candidate_model, batch)
        for (_, cont), ref, cand in zip(batch, ref_lp, cand_lp):
            stats.append(token_stats(ref, cand, cont))
            topks.append(top_logprobs(ref) if cont else [])
    return stats, topks


def token_stats(ref: torch.Tensor, cand: torch.Tensor, continuation: list[int]) -> TokenStats:
    """KL(ref || cand), top-1 agreement and both NLLs of `continuation`, per token."""
    s = TokenStats()
    if continuation:
        torch = import_torch()
        target = torch.tensor(continuation)
        s.kl = (ref.exp() * (ref - cand)).sum(-1).clamp_min(0).tolist()
        s.top1_agree = (ref.argmax(-1) == cand.argmax(-1)).tolist()
        s.ref_nll = (-ref.gather(1, target[:, None])[:, 0]).tolist()
        s.cand_nll = (-cand.gather(1, target[:, None])[:, 0]).tolist()
    return s


def top_logprobs(logprobs: torch.Tensor, k: int = TOP_K) -> list[list[list[float]]]:
    """Per token, [[token id, log-prob], ...] of the k most likely tokens (what accepted files store, 6 decimals)."""
    values, indices = logprobs.topk(k, dim=-1)
    return [[[int(t), round(float(v), 6)] for t, v in zip(ti, tv)] for ti, tv in zip(indices.tolist(),
                                                                                     values.tolist())]


def topk_kl(stored: list[list[list[float]]], candidate: torch.Tensor) -> list[float]:
    """KL(stored || candidate) per token from the stored top-k, with the rest of the mass as one bucket."""
    torch = import_torch()
    out = []
    for row, cand in zip(stored, candidate):
        ids = torch.tensor([int(t) for t, _ in row])
        p = torch.tensor([v for _, v in row]).exp()
        q = cand[ids].exp()
        p_tail, q_tail = (1 - p.sum()).clamp_min(1e-12), (1 - q.sum()).clamp_min(1e-12)
        kl = float((p * (p.log() - q.clamp_min(1e-12).log())).sum() + p_tail * (p_tail.log() - q_tail.log()))
        out.append(max(0.0, kl))
    return out


def compare_with_reference(reference, samples: list[GoldenSample], reference_outputs: list,
                           candidate_outputs: list, stats: list[TokenStats | None], precision: str,
                           started: float | None = None) -> QualityResult:
    """`candidate_outputs` (any objects with `token_ids` and `text`) against the reference precision's, sample by
    sample; `stats` are the teacher-forced token statistics of each sample (None where there are none, e.g. an
    endpoint that returned no logprobs). `started`: perf_counter() when the caller began (scoring included)."""
    started = time.perf_counter() if started is None else started
    decode = reference.tokenizer.decode
    per_sample = [compare_sample(s, r.token_ids, r.text, c.token_ids, c.text, st,
                                 decode=lambda ids: decode(ids, skip_special_tokens=True))
                  for s, r, c, st in zip(samples, reference_outputs, candidate_outputs, stats)]
    token_kl = [kl for st in stats if st is not None for kl in st.kl]
    result = QualityResult(precision, reference.record.precision, per_sample, aggregate(per_sample, token_kl),
                           by_category(per_sample), time.perf_counter() - started,
                           reference_source=reference_source(reference))
    if result.reference_source:
        result.notes.append(f"reference: {result.reference_source} (the GGUF file's weights, dequantized, not the "
                            "original float model): the figures measure the distance from that file")
    source = getattr(reference, "source", None)
    if getattr(source, "random_weights", False) and precision != reference.record.precision:
        # a newcomer trying the starter on the fast test model read its quality verdict as one of quantization
        result.notes.append(f"{source.name} has seeded random weights (a model to try the plugin on): quantization "
                            "flips more of its greedy tokens than a trained model's, so this verdict says nothing of "
                            "a real model's quality; gate quality on a trained model (leave out --infergate-model for "
                            "the embedded SmolLM2-135M)")
    return result


def reference_source(reference) -> str:
    """"fp32 dequantized from Q4_K_M" where the reference's weights are a GGUF file's quantized ones, dequantized
    (models.sources.ModelSource.dequantized_from); "" where its precision's name says what it is."""
    quantization = getattr(getattr(reference, "source", None), "dequantized_from", "")
    return f"{reference.record.precision} dequantized from {quantization}" if quantization else ""


def compare_precision(reference, candidate, samples: list[GoldenSample], reference_outputs: list[Generated],
                      candidate_outputs: list[Generated], reference_scores: ScoreCache | None = None
                      ) -> QualityResult:
    """A local precision against the reference: both models score the reference's continuations (the reference's
    log-probabilities kept in `reference_scores` for the next candidate)."""
    started = time.perf_counter()
    rows = [(r.prompt_ids, r.token_ids) for r in reference_outputs]
    stats, _ = teacher_forced(reference.model, candidate.model, rows, reference_scores=reference_scores)
    result = compare_with_reference(reference, samples, reference_outputs, candidate_outputs, stats,
                                    candidate.record.requested_precision, started)
    result.flags += quantization_flags(reference, candidate, result.samples)
    return result


def quantization_flags(reference, candidate, samples: list[SampleQuality]) -> list[str]:
    """A quantized precision with the reference's weight bytes and identical outputs was not quantized."""
    rec, ref = candidate.record, reference.record
    if rec.requested_precision in QUANTIZED and candidate is not reference:
        same_bytes = rec.weight_bytes >= ref.weight_bytes
        same_outputs = all(s.exact_match for s in samples) and all((s.mean_kl or 0) < 1e-9 for s in samples)
        if same_bytes and same_outputs:
            return [f"{rec.requested_precision} looks unquantized: same weight bytes ({rec.weight_bytes}) and "
                    "identical outputs and logits as the reference"]
    if rec.fallback:
        return [f"{rec.requested_precision} ran as a fallback to {rec.precision}: {rec.fallback_reason}"]
    return []
