"""A precision's current golden outputs against its own accepted ones, token for token; each changed sample
classified as a near-tie (numerics broke a tie the model was undecided about) or drift (the model changed); what
decides (`GoldenRegression`): the tokens (the reference precision, `gate_tokens=1`, `exact=1`) or, for the quantized
precisions, quality against the reference compared with the figures accepted with the outputs (quality.travel), the
changed samples listed; the accepted outputs an update writes; and the failure messages of the regression and
batch-invariance gates (the changed samples with both texts, the near-ties with their margins, what the accepted
file was recorded with)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_infergate import units
from pytest_infergate.quality.golden_files import GoldenOutput, GoldenOutputs, GoldenSample
from pytest_infergate.quality.metrics import (
    Generated,
    SampleQuality,
    compare_sample,
    describe_sample,
    first_divergence,
)
from pytest_infergate.quality.policy import RegressionPolicy
from pytest_infergate.quality.travel import SampleFigures
from pytest_infergate.status import Decision

NEAR_TIE = "near-tie"
DRIFT = "drift"
ACCEPT_HERE = ("Accept this machine's outputs beside them with --infergate-update-golden and commit the file "
               "(this machine is then judged against its own)")
UNTIL_THEN = "until then the verdict is inconclusive (a failure under --infergate-strict)"


def outputs_to_accept(samples: list[GoldenSample], generated: list[Generated], model=None,
                      figures: dict[str, SampleFigures] | None = None) -> list[GoldenOutput]:
    """Outputs to accept; with `model`, each token's top-k log-probabilities under it are stored too (scored
    alone, as `compare_with_golden` scores them); with `figures` (sample id -> its figures against the reference
    precision on this machine), those too, for the decision on another machine (quality.travel)."""
    topks: list = [[] for _ in generated]
    if model is not None:
        # imported here, where a model scores: the endpoint-only install (no torch) imports this module
        from pytest_infergate.quality.scoring import teacher_forced

        _, topks = teacher_forced(model, model, [(g.prompt_ids, g.token_ids) for g in generated])
    figures = figures or {}
    return [GoldenOutput(g.id, g.token_ids, g.text, topk, figures[g.id].to_dict() if g.id in figures else None)
            for g, topk in zip(generated, topks)]


@dataclass(frozen=True)
class Classification:
    verdict: str  # NEAR_TIE or DRIFT
    reason: str


def divergence_margin(accepted_tokens: list[int], current_tokens: list[int], logprobs) -> float | None:
    """log p(top token) - log p(accepted token) at the first divergence, under the current model's log-probabilities
    over the accepted continuation (teacher-forced, alone); None where one output is a prefix of the other."""
    index = first_divergence(accepted_tokens, current_tokens)
    if index is None or index >= min(len(accepted_tokens), len(current_tokens)):
        return None
    row = logprobs[index]
    return float(row.max() - row[accepted_tokens[index]])


def margin_as_generated(accepted_tokens: list[int], current_tokens: list[int], top_logprobs) -> float | None:
    """The margin at the first divergence read from the log-probabilities the current run recorded while generating
    (`Generated.top_logprobs`: its batch's numerics included, which a row scored alone does not see). None where
    they were not recorded, one output is a prefix of the other, or the accepted token is outside the recorded top
    tokens (then the alone scoring, which sees every token, gives the margin)."""
    index = first_divergence(accepted_tokens, current_tokens)
    if not top_logprobs or index is None or index >= min(len(accepted_tokens), len(current_tokens), len(top_logprobs)):
        return None
    ids, values = top_logprobs[index]
    if accepted_tokens[index] not in ids:
        return None
    return float(values[0] - values[ids.index(accepted_tokens[index])])


def classify_change(margin: float | None, accepted_kl: float | None, policy: RegressionPolicy) -> Classification:
    """Near-tie: the accepted token was within `near_tie_margin` of the top token where the outputs part, AND the
    current model's distribution over the whole accepted continuation stays within `max_accepted_kl` of the
    accepted one (mean top-k KL). Anything else is drift."""
    if accepted_kl is None:
        return Classification(DRIFT, "not scored: no accepted log-probabilities to tell numerics from drift")
    if margin is None:
        return Classification(DRIFT, "one output is a prefix of the other: a length limit or a stop changed")
    if margin > policy.near_tie_margin:
        return Classification(DRIFT, f"margin {margin:.3f} > near_tie_margin {policy.near_tie_margin:g}, "
                                     f"accepted KL {units.number(accepted_kl, 2)}")
    if accepted_kl > policy.max_accepted_kl:
        return Classification(DRIFT, f"margin {margin:.3f}, accepted KL {units.number(accepted_kl, 2)} > "
                                     f"max_accepted_kl {policy.max_accepted_kl:g}")
    return Classification(NEAR_TIE, f"margin {margin:.3f}, accepted KL {units.number(accepted_kl, 2)}")


@dataclass
class GoldenRegression:
    precision: str
    changed: list[SampleQuality]  # each with `regression` (near-tie / drift), its reason and margin
    missing: list[str]
    compared: int
    mean_topk_kl: float | None  # over the changed samples that could be scored (unchanged ones are not scored)
    policy: RegressionPolicy = field(default_factory=RegressionPolicy)
    environment_mismatch: list[str] = field(default_factory=list)
    other_machine: str = ""  # where the accepted outputs were recorded, when that is not this machine
    # where the policy lets quality decide (by_quality): this run's quality against its reference compared with the
    # figures recorded when the outputs were accepted (None: not decided that way, or no accepted file records them)
    travel: Decision | None = None  # quality.travel.decide_travel's
    travel_source: str = ""  # the accepted file whose figures `travel` compared with
    # on this machine, why quality could not decide where the policy asks it to (an accepted file without figures,
    # the reference precision itself): the token rule decides instead, and says why
    token_rule_why: str = ""

    def classify(self, policy: RegressionPolicy, environment_mismatch: list[str] | None = None,
                 other_machine: str | None = None) -> GoldenRegression:
        """(Re)classify every changed sample under `policy`; returns self. `other_machine`: the machine the accepted
        outputs were recorded on, when not this one ("" when it is)."""
        self.policy = policy
        if environment_mismatch is not None:
            self.environment_mismatch = list(environment_mismatch)
        if other_machine is not None:
            self.other_machine = other_machine
        for sample in self.changed:
            verdict = classify_change(sample.divergence_margin, sample.mean_kl, policy)
            sample.regression, sample.regression_reason = verdict.verdict, verdict.reason
        return self

    @property
    def near_ties(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression == NEAR_TIE]

    @property
    def drift(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression != NEAR_TIE]

    @property
    def drift_share(self) -> float:
        return len(self.drift) / self.compared if self.compared else 0.0

    @property
    def by_quality(self) -> bool:
        """The policy lets quality against the reference decide, the token-level changes listed but not deciding:
        gate_tokens=0 against this machine's accepted outputs, gate_other_machine=0 against another machine's;
        exact=1 compares token for token everywhere."""
        if self.policy.exact:
            return False
        return not (self.policy.gate_other_machine if self.other_machine else self.policy.gate_tokens)

    def decided_by(self) -> str:
        """Which evidence decided, in one phrase (report and terminal)."""
        if self.by_quality and self.travel is not None:
            source = self.travel_source or "the accepted file"
            if self.other_machine:
                return (f"quality against the reference, this machine's vs as accepted in {source} (tokens compared "
                        f"with another machine's: {self.other_machine})")
            return f"quality against the reference, this run's vs as accepted in {source} (changed tokens listed)"
        if self.by_quality and self.other_machine:
            return f"token for token against another machine ({self.other_machine}); no accepted file records figures"
        if self.other_machine:
            return f"token for token against another machine ({self.other_machine})"
        why = f" ({self.token_rule_why})" if self.by_quality and self.token_rule_why else ""
        return f"token for token against this machine's accepted outputs{why}"

    def problems(self) -> list[str]:
        """Why the gate fails (empty: it passes)."""
        out = []
        if self.missing:
            out.append(f"{len(self.missing)} samples have no accepted output: {', '.join(self.missing[:10])}")
        if self.policy.exact and self.changed:
            out.append(f"exact=1: {len(self.changed)} of {self.compared} outputs changed "
                       f"({len(self.near_ties)} of them near-ties)")
        elif self.by_quality and self.travel is not None:
            out += self.travel.problems
        elif self.by_quality and self.other_machine:
            pass  # tokens do not travel: drift without figures is undecided (below)
        elif self._drift_beyond_policy():
            why = f"; {self.token_rule_why}" if self.by_quality and self.token_rule_why else ""
            out.append(f"drift in {len(self.drift)} of {self.compared} outputs ({self.drift_share:.1%}), policy "
                       f"max_drift_share {self.policy.max_drift_share:g}{why}")
        if self.policy.same_environment and self.environment_mismatch:
            out.append("same_environment=1: the accepted outputs were recorded in another environment: "
                       + "; ".join(self.environment_mismatch))
        return out

    def undecided(self) -> list[str]:
        """Why the gate can neither pass nor fail (empty: it can), each naming the action that decides: figures that
        straddle their margins, or, on another machine, drift beyond policy with no accepted file recording the
        figures."""
        if self.problems() or not self.by_quality:
            return []
        if self.travel is not None:
            if self.other_machine:
                return [f"{why} on {self.other_machine}. {ACCEPT_HERE}, or widen the policy's max_top1_drop / "
                        f"max_kl_rise / max_task_drop; {UNTIL_THEN}" for why in self.travel.undecided]
            return [f"{why}. If the change is intended, accept this run's outputs with --infergate-update-golden and "
                    "commit the file; else add golden samples (the interval narrows) or widen the policy's "
                    f"max_top1_drop / max_kl_rise / max_task_drop; {UNTIL_THEN}" for why in self.travel.undecided]
        if not self.other_machine or not self._drift_beyond_policy():
            return []
        return [f"drift in {len(self.drift)} of {self.compared} outputs ({self.drift_share:.1%}) against outputs "
                f"accepted on another machine ({self.other_machine}), whose file records no quality figures to "
                f"decide on (schema 3, gate_other_machine=0). {ACCEPT_HERE}; {UNTIL_THEN}"]

    def _drift_beyond_policy(self) -> bool:
        return bool(self.drift) and self.drift_share > self.policy.max_drift_share

    @property
    def ok(self) -> bool:
        return not self.problems()


def compare_with_golden(tokenizer, samples: list[GoldenSample], current: list[Generated], accepted: GoldenOutputs,
                        precision: str, model=None, policy: RegressionPolicy | None = None) -> GoldenRegression:
    """Current outputs of `precision` against its own accepted golden outputs (token for token). With `model`
    (the one that produced them) each changed sample's accepted continuation is scored under it, alone as it was
    recorded (margin at the first divergence, mean top-k KL against the accepted log-probabilities), and
    classified under `policy` (`classify_change`); without, every change counts as drift. The margin is read from
    the generation's own log-probabilities where the backend recorded them (`margin_as_generated`), else from the
    alone scoring."""
    changed, missing, kls = [], [], []
    decode = tokenizer.decode
    for sample, now in zip(samples, current):
        old = accepted.outputs.get(sample.id)
        if old is None:
            missing.append(sample.id)
            continue
        quality = compare_sample(sample, old.token_ids, old.text, now.token_ids, now.text, None,
                                 decode=lambda ids: decode(ids, skip_special_tokens=True))
        if quality.exact_match:
            continue  # same tokens from the same composition: nothing to classify, nothing scored
        if model is not None and old.top_logprobs and old.token_ids:
            # imported here, where a model scores: the endpoint-only install (no torch) imports this module
            from pytest_infergate.quality.scoring import score_rows, topk_kl

            logprobs = score_rows(model, [(now.prompt_ids, old.token_ids)])[0]
            quality.mean_kl = sum(topk_kl(old.top_logprobs, logprobs)) / len(old.token_ids)
            generated = margin_as_generated(old.token_ids, now.token_ids, getattr(now, "top_logprobs", None))
            quality.divergence_margin = (generated if generated is not None
                                         else divergence_margin(old.token_ids, now.token_ids, logprobs))
            kls.append(quality.mean_kl)
        changed.append(quality)
    regression = GoldenRegression(precision, changed, missing, len(samples) - len(missing),
                                  sum(kls) / len(kls) if kls else None)
    return regression.classify(policy or RegressionPolicy.of({}, precision))


SHOWN = 5  # samples shown per list; the record has all of them


def regression_failure(regression, problems: list[str], path: Path, header: dict) -> str:
    """`regression`: a GoldenRegression that broke its policy."""
    lines = [f"{len(regression.changed)} of {regression.compared} golden outputs of {regression.precision} changed: "
             f"{len(regression.drift)} drift, {len(regression.near_ties)} near-ties (accepted: {path}; library "
             f"versions then: {header.get('versions')})", *("  " + p for p in problems)]
    if regression.drift:
        lines.append("drift (changed beyond numerics):")
        lines += ["  " + describe_sample(s, ("accepted", "current")) for s in regression.drift[:SHOWN]]
        if len(regression.drift) > SHOWN:
            lines.append(f"  ... and {len(regression.drift) - SHOWN} more: "
                         + ", ".join(s.id for s in regression.drift[SHOWN:]))
    if regression.near_ties:
        lines.append("near-ties (numerics at a tie; they pass unless exact=1): " + near_tie_list(regression.near_ties))
    threads = (header.get("environment") or {}).get("threads")
    if threads is not None:
        lines.append(f"accepted with {threads} torch threads (the thread count is recorded, not compared)")
    return "\n".join(lines)


def near_tie_list(samples) -> str:
    return ", ".join(f"{s.id} (token {s.first_divergence}, margin {units.number(s.divergence_margin)} nats, KL "
                     f"{units.number(s.mean_kl, 2)})" for s in samples)


def batch_invariance_failure(result, problems: list[str]) -> str:
    """`result`: a BatchInvariance that broke its policy."""
    lines = [f"{result.precision}: greedy answers change with the batch they run in", *("  " + p for p in problems)]
    for variant in result.variants:
        kl = f", mean KL(alone || batched) {variant.mean_kl:.2e}" if variant.mean_kl is not None else ""
        lines.append(f"  {variant.name} ({variant.description}): {len(variant.changed)} of {variant.samples} "
                     f"changed{kl}")
        for d in variant.changed[:SHOWN]:
            margin = f", margin {d.margin:.3f}" if d.margin is not None else ""
            lines.append(f"    {d.id} at token {d.token}{margin}: alone {d.alone_text!r} / batched {d.variant_text!r}")
    return "\n".join(lines)
