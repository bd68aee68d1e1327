"""Output-quality metrics of a candidate precision against a reference: text, tokens, teacher-forced logits,
task checks, per sample and aggregated per category with bootstrap confidence intervals."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_infergate.quality.golden_files import GoldenSample
from pytest_infergate.stats import mean, paired_bootstrap_ci, percentile

# Han, Hiragana/Katakana, Hangul: scored per character, since they have no spaces between words
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+", re.UNICODE)


class CJKAwareTokenizer:
    """rouge-score's default tokenizer keeps only [a-z0-9], so Chinese text scores as empty. This one keeps
    words in every script (lower-cased) and splits CJK text into characters."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())


_SCORER = None


def rouge(reference: str, candidate: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 (rouge-score) with the CJK-aware tokenizer. Two empty texts agree perfectly."""
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=CJKAwareTokenizer())
    tokenizer = CJKAwareTokenizer()
    if not tokenizer.tokenize(reference) and not tokenizer.tokenize(candidate):
        return {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    scores = _SCORER.score(reference, candidate)
    return {name: score.fmeasure for name, score in scores.items()}


def _extract_json(text: str) -> Any:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    body = fenced.group(1) if fenced else text
    start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError("no JSON object or list in the output")
    decoder = json.JSONDecoder()
    value, _ = decoder.raw_decode(body[start:])
    return value


_JSON_TYPES = {"object": dict, "array": list, "string": str, "number": (int, float), "integer": int,
               "boolean": bool, "null": type(None)}


def _schema_errors(value: Any, schema: dict) -> list[str]:
    """The subset of JSON Schema golden files use: type, required, properties (recursively)."""
    errors = []
    expected = schema.get("type")
    if expected and not isinstance(value, _JSON_TYPES.get(expected, object)):
        return [f"expected {expected}, got {type(value).__name__}"]
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"missing key {key!r}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += [f"{key}: {e}" for e in _schema_errors(value[key], sub)]
    return errors


def task_checks(sample: GoldenSample, text: str) -> dict[str, bool]:
    """Each task check of the sample, passed or not."""
    checks: dict[str, bool] = {}
    if sample.expected:
        low = text.lower()
        checks["expected"] = any(e.lower() in low for e in sample.expected)
    if sample.regex:
        checks["regex"] = re.search(sample.regex, text) is not None
    if sample.must_parse_json or sample.json_schema:
        try:
            value = _extract_json(text)
            checks["json"] = True
            if sample.json_schema:
                checks["json_schema"] = not _schema_errors(value, sample.json_schema)
        except ValueError:
            checks["json"] = False
    if sample.max_words:
        checks["max_words"] = len(text.split()) <= sample.max_words
    return checks


def task_score(sample: GoldenSample, text: str) -> float | None:
    """1 if every check passes, 0 otherwise; None for samples without checks."""
    checks = task_checks(sample, text)
    return None if not checks else float(all(checks.values()))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class TokenStats:
    """Teacher-forced comparison over one reference continuation."""

    kl: list[float] = field(default_factory=list)  # per token KL(reference || candidate), nats
    top1_agree: list[bool] = field(default_factory=list)
    ref_nll: list[float] = field(default_factory=list)  # -log p_ref(token)
    cand_nll: list[float] = field(default_factory=list)  # -log p_cand(token)


@dataclass
class SampleQuality:
    id: str
    category: str
    reference_text: str
    candidate_text: str
    reference_tokens: list[int]
    candidate_tokens: list[int]
    rouge1: float
    rouge2: float
    rougeL: float
    exact_match: bool
    first_divergence: int | None
    first_divergence_char: int | None
    length_ratio: float
    mean_kl: float | None = None
    max_kl: float | None = None
    top1: float | None = None
    reference_ppl: float | None = None
    candidate_ppl: float | None = None
    reference_task: float | None = None
    candidate_task: float | None = None
    candidate_checks: dict[str, bool] = field(default_factory=dict)
    # against accepted golden outputs (the accepted output is the "reference" side): near-tie or drift, why,
    # and log p(current top token) - log p(accepted token) at the first divergence, in nats
    regression: str | None = None
    regression_reason: str | None = None
    divergence_margin: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SampleQuality:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def compare_sample(sample: GoldenSample, reference_tokens: list[int], reference_text: str,
                   candidate_tokens: list[int], candidate_text: str, stats: TokenStats | None,
                   decode=None) -> SampleQuality:
    scores = rouge(reference_text, candidate_text)
    divergence = first_divergence(reference_tokens, candidate_tokens)
    char = None
    if divergence is not None:
        char = first_divergence(reference_text, candidate_text) if decode is None else len(
            decode(reference_tokens[:divergence]))
    quality = SampleQuality(
        id=sample.id, category=sample.category, reference_text=reference_text, candidate_text=candidate_text,
        reference_tokens=list(reference_tokens), candidate_tokens=list(candidate_tokens),
        rouge1=scores["rouge1"], rouge2=scores["rouge2"], rougeL=scores["rougeL"],
        exact_match=list(reference_tokens) == list(candidate_tokens), first_divergence=divergence,
        first_divergence_char=char, length_ratio=len(candidate_tokens) / max(1, len(reference_tokens)),
        reference_task=task_score(sample, reference_text), candidate_task=task_score(sample, candidate_text),
        candidate_checks=task_checks(sample, candidate_text))
    if stats is not None and stats.kl:
        quality.mean_kl = mean(stats.kl)
        quality.max_kl = max(stats.kl)
        quality.top1 = mean([float(x) for x in stats.top1_agree])
        quality.reference_ppl = math.exp(mean(stats.ref_nll))
        quality.candidate_ppl = math.exp(mean(stats.cand_nll))
    return quality


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
    reference_source: str = ""  # "fp32 dequantized from Q4_K_M": a GGUF model's (scoring.reference_source)

    @property
    def reference(self) -> str:
        """The reference as a verdict names it: "fp32", or "fp32 dequantized from Q4_K_M"."""
        return self.reference_source or self.reference_precision

    def to_dict(self) -> dict:
        return {"precision": self.precision, "reference_precision": self.reference_precision,
                "reference_source": self.reference_source,
                "summary": self.summary, "categories": self.categories, "seconds": self.seconds,
                "flags": self.flags, "notes": self.notes, "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, data: dict) -> QualityResult:
        return cls(data["precision"], data["reference_precision"],
                   [SampleQuality.from_dict(s) for s in data.get("samples", [])], dict(data.get("summary", {})),
                   dict(data.get("categories", {})), float(data.get("seconds", 0.0)), list(data.get("flags", [])),
                   list(data.get("notes", [])), str(data.get("reference_source", "")))


AGGREGATES = ("rouge1", "rouge2", "rougeL", "exact_match", "length_ratio", "mean_kl", "top1")
# A resample where the reference passed no task check has no task ratio; capped here so the percentiles stay finite.
# Only a lower bound is ever set on the ratio (min_task_ratio), far below this.
TASK_RATIO_CAP = 10.0


def _task_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean candidate task score over mean reference score, of (reference, candidate) pairs."""
    reference, candidate = mean([p[0] for p in pairs]), mean([p[1] for p in pairs])
    return candidate / reference if reference else 1.0 if candidate == 0 else math.inf


def _delta_ppl_rel(pairs: Sequence[tuple[float, float]]) -> float:
    """Relative Δ perplexity of the reference continuation, of (reference NLL, candidate NLL) pairs per sample."""
    return math.exp(mean([p[1] for p in pairs]) - mean([p[0] for p in pairs])) - 1.0


def aggregate(samples: list[SampleQuality], token_kl: list[float] | None = None) -> dict[str, Any]:
    """Means (with 95% paired-bootstrap CIs) over samples; p99 KL over all tokens (no interval: a percentile of
    tokens that come in samples); task scores and their ratio, and Δ perplexity of the reference continuation
    (candidate vs reference), each with its CI over the samples resampled in pairs."""
    out: dict[str, Any] = {"samples": len(samples)}
    for name in AGGREGATES:
        values = [float(getattr(s, name)) for s in samples if getattr(s, name) is not None]
        if values:
            point, low, high = paired_bootstrap_ci(values, resamples=1000)
            out[name] = point
            out[name + "_ci"] = [low, high]
    if token_kl:
        out["p99_kl"] = percentile(token_kl, 99)
    nll = [(math.log(s.reference_ppl), math.log(s.candidate_ppl)) for s in samples
           if s.reference_ppl and s.candidate_ppl]
    if nll:
        out["reference_ppl"] = math.exp(mean([pair[0] for pair in nll]))
        out["candidate_ppl"] = math.exp(mean([pair[1] for pair in nll]))
        out["delta_ppl"] = out["candidate_ppl"] - out["reference_ppl"]
        out["delta_ppl_rel"] = out["delta_ppl"] / out["reference_ppl"]
        _, low, high = paired_bootstrap_ci(nll, _delta_ppl_rel, resamples=1000)
        out["delta_ppl_rel_ci"] = [low, high]
    scored = [s for s in samples if s.reference_task is not None]
    if scored:
        out["reference_task"] = mean([s.reference_task for s in scored])
        out["candidate_task"] = mean([s.candidate_task for s in scored])
        tasks = [(s.reference_task, s.candidate_task) for s in scored]
        out["task_ratio"] = _task_ratio(tasks)
        if math.isfinite(out["task_ratio"]):
            _, low, high = paired_bootstrap_ci(tasks, lambda pairs: min(_task_ratio(pairs), TASK_RATIO_CAP),
                                               resamples=1000)
            out["task_ratio_ci"] = [low, high]
    return out


def by_category(samples: list[SampleQuality]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[SampleQuality]] = {}
    for sample in samples:
        groups.setdefault(sample.category, []).append(sample)
    return {name: aggregate(group) for name, group in sorted(groups.items())}


def worst_samples(samples: list[SampleQuality], count: int = 5) -> list[SampleQuality]:
    changed = [s for s in samples if not s.exact_match]
    return sorted(changed, key=lambda s: (s.rougeL, -(s.mean_kl or 0)))[:count]


def describe_sample(sample: SampleQuality, labels: tuple[str, str] = ("reference", "candidate")) -> str:
    """One changed sample: its scores (or near-tie / drift verdict) and both texts from the first divergence."""
    where = sample.first_divergence_char or 0
    ref, cand = (f"{label}:".ljust(11) for label in labels)
    if sample.regression:
        figures = f" {sample.regression.upper()} ({sample.regression_reason})"
    else:
        figures = f" ROUGE-L {sample.rougeL:.2f}" + (f", mean KL {sample.mean_kl:.3f}" if sample.mean_kl is not None
                                                     else "")
    return (f"{sample.id} [{sample.category}]{figures}, first divergence at token {sample.first_divergence}:\n"
            f"      {ref}{sample.reference_text[:where]!r} + {sample.reference_text[where:where + 50]!r}\n"
            f"      {cand}{sample.candidate_text[:where]!r} + {sample.candidate_text[where:where + 50]!r}")


@dataclass
class Generated:
    """One golden sample's output as a precision generated it (golden_generation), what every comparison reads."""

    id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    # per token, (ids, log-probabilities) of the GOLDEN_TOP_LOGPROBS most likely tokens as generated (in the batch
    # of the fixed composition); empty where the backend does not record them (HF generate)
    top_logprobs: list = field(default_factory=list)
