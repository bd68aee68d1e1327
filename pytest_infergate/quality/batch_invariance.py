"""Batch invariance: does a sample's greedy answer depend on what else is in its batch? A batched server gives each
request the numerics of the batch it lands in, and LLM.int8 or kernels that block by the row count can change the
answer with the neighbours. Each sample runs in three variants per precision, greedy on the reference engine:
`alone` (a batch of one, the baseline), `batch` (the golden gates' fixed-composition run, from the cache) and
`rotated` (the samples rotated by half, at most half at a time); with `max_new_tokens`, on its first that many
tokens. Per variant: the samples whose tokens differ from `alone`, the margin at each first divergence and the
teacher-forced KL(alone || in a batch). Light to import; running the check imports torch. Why these variants, and
what was measured: docs/explanation/quality-gates.md, 'check_batch_invariance'.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from pytest_infergate.quality.golden_files import GoldenSample
from pytest_infergate.quality.metrics import first_divergence
from pytest_infergate.stats import mean

SCORING_BATCH = {"batch": 8, "rotated": 4}


@dataclass
class Divergence:
    id: str
    token: int  # index of the first differing token
    margin: float | None  # log p(alone's token) - log p(variant's token) there, teacher-forced alone; nats
    alone_text: str
    variant_text: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Divergence:
        return cls(data["id"], int(data["token"]), data.get("margin"), data.get("alone_text", ""),
                   data.get("variant_text", ""))


@dataclass
class VariantResult:
    name: str  # batch / rotated
    description: str
    changed: list[Divergence]
    samples: int
    mean_kl: float | None = None  # KL(alone || in this variant's batches), mean over tokens
    max_kl: float | None = None  # the largest per-sample mean
    generation_s: float = 0.0  # 0 when reused from the cache

    @property
    def share(self) -> float:
        return len(self.changed) / self.samples if self.samples else 0.0

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "samples": self.samples, "share": self.share,
                "mean_kl": self.mean_kl, "max_kl": self.max_kl, "generation_s": self.generation_s,
                "changed": [d.to_dict() for d in self.changed]}

    @classmethod
    def from_dict(cls, data: dict) -> VariantResult:
        return cls(data["name"], data.get("description", ""),
                   [Divergence.from_dict(d) for d in data.get("changed", [])], int(data.get("samples", 0)),
                   data.get("mean_kl"), data.get("max_kl"),
                   float(data.get("generation_s", 0.0)))


@dataclass
class BatchInvariance:
    precision: str
    samples: list[str]  # ids, in the order asked
    variants: list[VariantResult]
    seconds: float = 0.0  # wall, everything included
    cpu_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    max_new_tokens: int | None = None  # each sample compared on its first this many tokens (None: all of them)

    @property
    def variant_ids(self) -> list[str]:
        """Samples whose greedy tokens change with the batch in at least one variant."""
        changed = {d.id for v in self.variants for d in v.changed}
        return [s for s in self.samples if s in changed]

    @property
    def variant_share(self) -> float:
        return len(self.variant_ids) / len(self.samples) if self.samples else 0.0

    def example(self) -> Divergence | None:
        """The changed sample to show: the first one, in the variant that changed most."""
        worst = max(self.variants, key=lambda v: len(v.changed), default=None)
        return worst.changed[0] if worst and worst.changed else None

    def to_dict(self) -> dict:
        return {"precision": self.precision, "samples": self.samples, "variant_share": self.variant_share,
                "variant_ids": self.variant_ids, "variants": [v.to_dict() for v in self.variants],
                "seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "notes": self.notes,
                "max_new_tokens": self.max_new_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> BatchInvariance:
        return cls(data["precision"], list(data.get("samples", [])),
                   [VariantResult.from_dict(v) for v in data.get("variants", [])], float(data.get("seconds", 0.0)),
                   float(data.get("cpu_seconds", 0.0)), list(data.get("notes", [])), data.get("max_new_tokens"))


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
    from pytest_infergate.quality.generation import golden_engine_config, run_samples  # torch: only when run
    from pytest_infergate.quality.scoring import score_rows

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
