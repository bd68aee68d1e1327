"""A precision's current golden outputs against its own accepted ones, token for token; and the accepted outputs an
update writes."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.quality.generation import Generated
from pytest_infergate.quality.golden_files import GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality.metrics import SampleQuality, compare_sample
from pytest_infergate.quality.scoring import continuation_logprobs, teacher_forced, topk_kl


def outputs_to_accept(samples: list[GoldenSample], generated: list[Generated], model=None) -> list[GoldenOutput]:
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
            lp = continuation_logprobs(model, [(now.prompt_ids, old.token_ids)])[0]
            quality.mean_kl = sum(topk_kl(old.top_logprobs, lp)) / len(old.token_ids)
            kls.append(quality.mean_kl)
        if not quality.exact_match:
            changed.append(quality)
    return GoldenRegression(precision, changed, missing, len(samples) - len(missing),
                            sum(kls) / len(kls) if kls else None)
