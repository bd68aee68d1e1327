"""The one comparison of a candidate's golden outputs with the reference precision's, used for local precisions and
endpoints alike: text and token metrics per sample, teacher-forced token statistics where they exist, aggregated
per run and per category."""

from __future__ import annotations

import time

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
from pytest_infergate.quality.score_cache import ScoreCache


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
    return QualityResult(precision, reference.record.precision, per_sample, aggregate(per_sample, token_kl),
                         by_category(per_sample), time.perf_counter() - started)


def compare_precision(reference, candidate, samples: list[GoldenSample], reference_outputs: list[Generated],
                      candidate_outputs: list[Generated], reference_scores: ScoreCache | None = None
                      ) -> QualityResult:
    """A local precision against the reference: both models score the reference's continuations (the reference's
    log-probabilities kept in `reference_scores` for the next candidate)."""
    # imported here, where a model runs: the endpoint-only install (no torch) imports this module
    from pytest_infergate.quality.scoring import teacher_forced

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
