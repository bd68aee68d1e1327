"""The one comparison of a candidate's golden outputs with the reference precision's, used for local precisions and
endpoints alike: text and token metrics per sample, teacher-forced token statistics where they exist, aggregated
per run and per category; and the session's memory of the reference's alone log-probabilities (ScoreCache), which
every candidate is compared on. Light to import: torch only where a model is scored."""

from __future__ import annotations

import time
import weakref

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

# What a ScoreCache keeps at most: the reference's log-probabilities of the 48 default samples' continuations are
# about 0.3 GiB for a 49k-token vocabulary (tokens x vocabulary x 4 bytes)
SCORE_CACHE_BYTES = 1 << 30


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
        from pytest_infergate.quality.scoring import score_rows  # torch: only when something is scored

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
