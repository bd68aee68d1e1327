"""Run golden samples through models and compare: candidate precision vs the reference precision, and current
outputs vs accepted golden outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_infergate.engine import Engine, EngineConfig, Request
from pytest_infergate.golden import GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality import SampleQuality, TokenStats, aggregate, by_category, compare_sample

TOP_K = 10


@dataclass
class Generated:
    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str


def generate(loaded, samples: list[GoldenSample], config: EngineConfig | None = None) -> list[Generated]:
    """Greedy outputs of every sample through the reference engine (continuous batching)."""
    config = config or EngineConfig(max_batch_size=64, max_model_len=2048, kv_budget_bytes=512 << 20)
    with Engine(loaded.model, loaded.tokenizer, config) as engine:
        results = engine.generate([Request(**s.request_kwargs(), request_id=s.id) for s in samples])
    return [Generated(s.id, r.prompt_token_ids, r.token_ids, r.text) for s, r in zip(samples, results)]


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


@torch.inference_mode()
def _continuation_logprobs(model, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """log-softmax [len(continuation), vocab] (float32) predicting each continuation token, for each row."""
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


def teacher_forced(reference_model, candidate_model, rows: list[tuple[list[int], list[int]]],
                   batch_size: int = 8) -> tuple[list[TokenStats], list[list[list[list[float]]]]]:
    """Score the reference continuations under both models. Returns per-row TokenStats and the reference's
    top-k log-probabilities per token (what golden files store)."""
    stats, topks = [], []
    for batch in _batches(rows, batch_size):
        ref_lp = _continuation_logprobs(reference_model, batch)
        cand_lp = ref_lp if candidate_model is reference_model else _continuation_logprobs(candidate_model, batch)
        for (prompt, cont), ref, cand in zip(batch, ref_lp, cand_lp):
            s = TokenStats()
            if cont:
                target = torch.tensor(cont)
                p = ref.exp()
                s.kl = (p * (ref - cand)).sum(-1).clamp_min(0).tolist()
                s.top1_agree = (ref.argmax(-1) == cand.argmax(-1)).tolist()
                s.ref_nll = (-ref.gather(1, target[:, None])[:, 0]).tolist()
                s.cand_nll = (-cand.gather(1, target[:, None])[:, 0]).tolist()
                values, indices = ref.topk(TOP_K, dim=-1)
                topks.append([[[int(t), round(float(v), 6)] for t, v in zip(ti, tv)]
                              for ti, tv in zip(indices.tolist(), values.tolist())])
            else:
                topks.append([])
            stats.append(s)
    return stats, topks


def topk_kl(stored: list[list[list[float]]], candidate: torch.Tensor) -> list[float]:
    """KL(stored || candidate) per token from the stored top-k, with the rest of the mass as one bucket."""
    out = []
    for row, cand in zip(stored, candidate):
        ids = torch.tensor([int(t) for t, _ in row])
        p = torch.tensor([v for _, v in row]).exp()
        q = cand[ids].exp()
        p_tail, q_tail = (1 - p.sum()).clamp_min(1e-12), (1 - q.sum()).clamp_min(1e-12)
        kl = float((p * (p.log() - q.clamp_min(1e-12).log())).sum() + p_tail * (p_tail.log() - q_tail.log()))
        out.append(max(0.0, kl))
    return out


@dataclass
class QualityResult:
    precision: str
    reference_precision: str
    samples: list[SampleQuality]
    summary: dict[str, Any]
    categories: dict[str, dict[str, Any]]
    seconds: float
    flags: list[str] = field(default_factory=list)  # problems that fail the gate whatever the policy
    notes: list[str] = field(default_factory=list)  # how to read the figures; never fail the gate

    def to_dict(self) -> dict:
        return {"precision": self.precision, "reference_precision": self.reference_precision,
                "summary": self.summary, "categories": self.categories, "seconds": self.seconds,
                "flags": self.flags, "notes": self.notes, "samples": [s.to_dict() for s in self.samples]}


def compare_with_reference(reference, candidate, samples: list[GoldenSample], reference_outputs: list[Generated],
                           candidate_outputs: list[Generated]) -> QualityResult:
    start = time.perf_counter()
    rows = [(r.prompt_ids, r.token_ids) for r in reference_outputs]
    stats, _ = teacher_forced(reference.model, candidate.model, rows)
    decode = reference.tokenizer.decode
    per_sample = [compare_sample(s, r.token_ids, r.text, c.token_ids, c.text, st,
                                 decode=lambda ids: decode(ids, skip_special_tokens=True))
                  for s, r, c, st in zip(samples, reference_outputs, candidate_outputs, stats)]
    token_kl = [kl for st in stats for kl in st.kl]
    result = QualityResult(candidate.record.requested_precision, reference.record.precision, per_sample,
                           aggregate(per_sample, token_kl), by_category(per_sample), time.perf_counter() - start)
    result.flags += quantization_flags(reference, candidate, per_sample)
    return result


def quantization_flags(reference, candidate, samples: list[SampleQuality]) -> list[str]:
    """A quantized precision with the reference's weight bytes and identical outputs was not quantized."""
    rec, ref = candidate.record, reference.record
    if rec.requested_precision in ("int8", "nf4") and candidate is not reference:
        same_bytes = rec.weight_bytes >= ref.weight_bytes
        same_outputs = all(s.exact_match for s in samples) and all((s.mean_kl or 0) < 1e-9 for s in samples)
        if same_bytes and same_outputs:
            return [f"{rec.requested_precision} looks unquantized: same weight bytes ({rec.weight_bytes}) and "
                    "identical outputs and logits as the reference"]
    if rec.fallback:
        return [f"{rec.requested_precision} ran as a fallback to {rec.precision}: {rec.fallback_reason}"]
    return []


def golden_outputs(samples: list[GoldenSample], generated: list[Generated], model=None) -> list[GoldenOutput]:
    """Outputs to accept; with `model`, each token's top-k log-probabilities under it are stored too."""
    topks: list = [[] for _ in generated]
    if model is not None:
        _, topks = teacher_forced(model, model, [(g.prompt_ids, g.token_ids) for g in generated])
    return [GoldenOutput(g.id, g.token_ids, g.text, topk) for g, topk in zip(generated, topks)]


@dataclass
class GoldenRegression:
    precision: str
    changed: list[SampleQuality]
    missing: list[str]
    compared: int
    mean_topk_kl: float | None

    @property
    def ok(self) -> bool:
        return not self.changed and not self.missing


def compare_with_golden(tokenizer, samples: list[GoldenSample], current: list[Generated], accepted: GoldenOutputs,
                        precision: str, model=None) -> GoldenRegression:
    """Current outputs of `precision` against its own accepted golden outputs (token for token). With `model`
    (the one that produced them), the accepted top-k log-probabilities are scored too."""
    changed, missing, kls = [], [], []
    decode = tokenizer.decode
    for sample, now in zip(samples, current):
        old = accepted.outputs.get(sample.id)
        if old is None:
            missing.append(sample.id)
            continue
        quality = compare_sample(sample, old.token_ids, old.text, now.token_ids, now.text, None,
                                 decode=lambda ids: decode(ids, skip_special_tokens=True))
        if model is not None and old.top_logprobs and old.token_ids:
            lp = _continuation_logprobs(model, [(now.prompt_ids, old.token_ids)])[0]
            quality.mean_kl = sum(topk_kl(old.top_logprobs, lp)) / len(old.token_ids)
            kls.append(quality.mean_kl)
        if not quality.exact_match:
            changed.append(quality)
    return GoldenRegression(precision, changed, missing, len(samples) - len(missing),
                            sum(kls) / len(kls) if kls else None)
