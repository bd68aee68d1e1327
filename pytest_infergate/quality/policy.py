"""Quality policy: the thresholds of the golden gates, where each comes from (ini lines by scope, then the test's
markers, or `check(policy=...)`; else the default of the precision's class), and what a result decided under them.

Three gates read the same policy (ini `infergate_quality_policy`, marker `infergate_quality`); each uses its keys:
- against the reference precision (`check()`): aggregate thresholds, `min_top1=0.9, max_mean_kl=0.05`, each decided
  on the aggregate's 95% interval (quality.thresholds); where none is set, the default policy of the precision's
  class (quality.policy_defaults) decides, so a check never passes with nothing checked;
- against the accepted golden outputs (`check_regression()`): `REGRESSION_KEYS`, with per-precision defaults;
- batch invariance (`check_batch_invariance()`): `max_batch_variant_share`, no gate unless set;
- over a text corpus (`check_corpus()`): `CORPUS_KEYS`, each on its interval over the corpus's chunks
  (quality.corpus_figures); where none is set, the default policy's corpus thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_infergate.errors import OptionError, unknown_keys
from pytest_infergate.quality.policy_defaults import default_policy
from pytest_infergate.quality.thresholds import ThresholdCheck
from pytest_infergate.quality.travel import TravelMargins
from pytest_infergate.scopes import applicable_scopes, parse_scoped_lines
from pytest_infergate.status import Decision, Status

if TYPE_CHECKING:
    from pytest_infergate.quality.golden_generation import BatchInvariance
    from pytest_infergate.quality.metrics import QualityResult

# the margins of the quality decision against accepted outputs (quality.travel): this run's figures against the
# reference precision compared with those recorded when the outputs were accepted
TRAVEL_KEYS = ("max_top1_drop", "max_kl_rise", "max_task_drop")

# key -> (aggregate name, "min" or "max"): thresholds of a comparison with the reference precision
AGGREGATE_KEYS = {
    "min_rouge_l": ("rougeL", "min"), "min_rouge_1": ("rouge1", "min"), "min_rouge_2": ("rouge2", "min"),
    "min_exact_match": ("exact_match", "min"), "max_mean_kl": ("mean_kl", "max"), "max_p99_kl": ("p99_kl", "max"),
    "min_top1": ("top1", "min"), "max_delta_ppl": ("delta_ppl_rel", "max"), "min_task_ratio": ("task_ratio", "min"),
    "min_length_ratio": ("length_ratio", "min"), "max_length_ratio": ("length_ratio", "max"),
}
# the regression gate against accepted outputs (see RegressionPolicy)
REGRESSION_KEYS = ("exact", "gate_tokens", "max_drift_share", "max_accepted_kl", "near_tie_margin",
                   "same_environment", "gate_other_machine", *TRAVEL_KEYS)
BATCH_KEYS = ("max_batch_variant_share",)
# key -> (figure of the corpus comparison's summary, "min" or "max"): thresholds of check_corpus(), teacher-forced
# over a text corpus (quality.corpus_figures); the rise is relative to the corpus figures accepted for the precision
CORPUS_KEYS = {"max_corpus_kl": ("mean_kl", "max"), "min_corpus_top1": ("top1", "min"),
               "max_corpus_delta_ppl": ("delta_ppl_rel", "max"), "max_corpus_p99_kl": ("p99_kl", "max"),
               "max_corpus_kl_rise": ("kl_rise", "max")}
# per category of the golden samples: the lowest category's task-score ratio (a category whose answers collapse
# while the mean over all samples holds)
CATEGORY_KEYS = ("min_category_task_ratio",)
FLAG_KEYS = ("exact", "gate_tokens", "same_environment", "gate_other_machine")  # 0 or 1
SHARE_KEYS = ("max_drift_share", "max_batch_variant_share", "max_top1_drop")  # 0..1
# figures that are fractions of the samples or tokens: a threshold above 1 can never be met (min_) or never
# be broken (max_), so it is a typo, not a policy
FRACTION_KEYS = ("min_rouge_l", "min_rouge_1", "min_rouge_2", "min_exact_match", "min_top1", "min_corpus_top1")
POLICY_KEYS = (*AGGREGATE_KEYS, *CATEGORY_KEYS, *REGRESSION_KEYS, *BATCH_KEYS, *CORPUS_KEYS)
REFERENCE_KEYS = (*AGGREGATE_KEYS, *CATEGORY_KEYS)  # check()'s: where none is set, the default policy decides

# Defaults of the regression gate, from the measurements in the README ("Golden regression gate"): a changed sample
# is a near-tie when, at its first divergence, the current model puts the accepted token within NEAR_TIE_MARGIN
# nats of its top token, and its mean top-k KL against the accepted log-probabilities over the whole accepted
# continuation stays within max_accepted_kl. Numerics that move (another CPU's kernels) stay below these KLs; a
# weight change that alters outputs scores above them.
NEAR_TIE_MARGIN = 0.25
MAX_ACCEPTED_KL = {"fp32": 1e-3, "fp16": 5e-3, "bf16": 5e-3, "int8": 1e-2, "nf4": 5e-3}
MAX_ACCEPTED_KL_OTHER = 1e-2  # precisions not listed (e.g. an endpoint: never scored, so never a near-tie)
# Whether token drift against outputs accepted on another machine (CPU model, kernel path or GPU) fails the gate
# (1) or is listed for review while what travels decides (0: quality.travel, this machine's quality against its own
# reference compared with the accepted machine's). Quantized precisions travel: LLM.int8 switches a column between
# int8 and float when an activation crosses its outlier threshold, so last-bit differences between two CPUs' MKL
# become changes no tie explains, and nf4 runs another algorithm with AVX512-BF16 than without. The reference
# precision has no reference to travel against; its outputs are reproduced across machines, so its tokens decide
# everywhere (the figures on two CPU models: docs/explanation/quality-gates.md).
GATE_OTHER_MACHINE = {"int8": False, "nf4": False}
# Whether token drift against this machine's own accepted outputs fails the gate (1: the token rule, for setups
# whose numerics never move) or is listed for review while quality against the reference, compared with the figures
# recorded when the outputs were accepted, decides (0). The quantized precisions decide by quality: a library upgrade
# (torch, bitsandbytes) moves their numerics on the same machine, and the token rule cannot tell that from a
# regression: a perturbation too small to move top-1 and KL changes as many outputs as one that drops top-1 well
# below the threshold (docs/explanation/quality-gates.md). The reference precision has no reference to be judged
# against: its tokens decide.
GATE_TOKENS = {"int8": False, "nf4": False}


class QualityPolicyError(OptionError):
    """An infergate_quality marker or ini policy with an unknown key or a wrong value."""


def parse_policy(values: dict[str, Any], where: str = "infergate_quality") -> dict[str, float]:
    policy = {}
    unknown = unknown_keys(values, list(POLICY_KEYS), "quality key")
    if unknown:
        raise QualityPolicyError(f"{where}: {unknown}; allowed: {', '.join(POLICY_KEYS)}")
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            finite = "" if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isfinite(value) \
                else "; a threshold of nan or inf would never be checked"
            raise QualityPolicyError(f"{where}: {key}={value!r} must be a non-negative number{finite}")
        if key in FLAG_KEYS and value not in (0, 1):
            raise QualityPolicyError(f"{where}: {key}={value!r} is a switch: 1 (on) or 0 (off)")
        if key in SHARE_KEYS and value > 1:
            raise QualityPolicyError(f"{where}: {key}={value!r} is a share of the samples, between 0 and 1")
        if key in FRACTION_KEYS and value > 1:
            figure = AGGREGATE_KEYS[key][0] if key in AGGREGATE_KEYS else CORPUS_KEYS[key][0]
            raise QualityPolicyError(f"{where}: {key}={value!r} can never be met: {figure} is a "
                                     "fraction, at most 1 (e.g. 0.9 for 90%)")
        policy[key] = float(value)
    return policy


def parse_ini_policies(lines: list[str]) -> dict[str, dict[str, float]]:
    """ini `infergate_quality_policy`: `PRECISION: key=value, ...` per line (`*` for every precision)."""
    return {scope: parse_policy(line.values, f"{line.where} ({scope})")
            for scope, line in parse_scoped_lines(lines, "infergate_quality_policy", QualityPolicyError).items()}


MARKER = "marker infergate_quality"
ARGUMENT = "check(policy=...)"
DEFAULT_SOURCE = "default policy for"  # how a default that decided is named (ResolvedPolicy.decided_by leads with it)


def ini_source(scope: str) -> str:
    return f"ini infergate_quality_policy scope {scope!r}"


@dataclass(frozen=True)
class Threshold:
    """One key's value and who set it; `over`: what it replaced, each `SOURCE: key=value` (a marker over an ini
    scope, a test-id scope over a precision's, an inner marker over an outer one)."""

    value: float
    source: str
    over: tuple[str, ...] = ()

    def named(self) -> str:
        """Who set it, and what it replaced: `marker infergate_quality, over ini ... scope 'nf4': min_top1=0.7`."""
        return self.source + "".join(f", over {replaced}" for replaced in self.over)


@dataclass(frozen=True)
class ResolvedPolicy:
    """The policy of one comparison, each key with its source. `default`: the default policy's name when it set
    check()'s thresholds (nothing else set any)."""

    thresholds: dict[str, Threshold] = field(default_factory=dict)
    scopes: tuple[str, ...] = ()  # the ini scopes that applied
    default: str = ""

    @classmethod
    def given(cls, rules: dict[str, float], source: str = ARGUMENT) -> ResolvedPolicy:
        return cls({key: Threshold(value, source) for key, value in rules.items()})

    @property
    def rules(self) -> dict[str, float]:
        return {key: threshold.value for key, threshold in self.thresholds.items()}

    def layered(self, rules: dict[str, float], source: str) -> ResolvedPolicy:
        """This policy with `rules` from `source` laid over it (each replaced key remembered)."""
        thresholds = dict(self.thresholds)
        for key, value in rules.items():
            old = thresholds.get(key)
            over = (*old.over, f"{old.source}: {key}={old.value:g}") if old is not None else ()
            thresholds[key] = Threshold(value, source, over)
        return ResolvedPolicy(thresholds, self.scopes, self.default)

    def for_reference(self, precision: str) -> ResolvedPolicy:
        """What `check()` decides under: this policy, or, where it sets none of check()'s thresholds, this policy
        with the default of `precision`'s class beside it (quality.policy_defaults)."""
        return self._or_default(precision, REFERENCE_KEYS, "rules")

    def for_corpus(self, precision: str) -> ResolvedPolicy:
        """What `check_corpus()` decides under: this policy, or, where it sets none of the corpus keys, this policy
        with the corpus thresholds of the default of `precision`'s class beside it."""
        return self._or_default(precision, tuple(CORPUS_KEYS), "corpus_rules")

    def _or_default(self, precision: str, keys: tuple[str, ...], rules: str) -> ResolvedPolicy:
        if any(key in keys for key in self.thresholds):
            return self
        default = default_policy(precision)
        source = f"{DEFAULT_SOURCE} {precision}"
        return ResolvedPolicy({**self.thresholds, **{key: Threshold(value, source)
                                                     for key, value in getattr(default, rules).items()}},
                              self.scopes, f"{source} ({default.name} class)")

    def decided_by(self, keys: tuple[str, ...] = REFERENCE_KEYS) -> str:
        """Which policy decided check() (or, with `keys`, another gate), in one phrase: `default policy for int8
        (8-bit class): min_top1=0.9, ...`, or `policy from marker infergate_quality(min_top1=0.95) and ini
        infergate_quality_policy scope 'nf4' (max_mean_kl=0.5); min_top1 from marker infergate_quality, over ini ...
        scope 'nf4': min_top1=0.7`."""
        keys = {key: threshold for key, threshold in self.thresholds.items() if key in keys}
        if self.default:
            return f"{self.default}: " + ", ".join(f"{key}={t.value:g}" for key, t in keys.items())
        by_source: dict[str, list[str]] = {}
        for key, threshold in keys.items():
            by_source.setdefault(threshold.source, []).append(f"{key}={threshold.value:g}")
        parts = [f"{source}({', '.join(values)})" if source in (MARKER, ARGUMENT) else
                 f"{source} ({', '.join(values)})" for source, values in by_source.items()]
        overridden = [f"{key} from {t.named()}" for key, t in keys.items() if t.over]
        return "policy from " + " and ".join(parts) + "".join(f"; {line}" for line in overridden)


def default_failure_advice(precision: str, decided_by: str) -> str:
    """What to do about a quality failure decided by the default of `precision`'s class ("" where a stated policy
    decided): nobody chose that bar, so the loss is either accepted in a policy of one's own or the precision not
    gated (nf4 fails the 4-bit default on most models)."""
    if not decided_by.startswith(DEFAULT_SOURCE):
        return ""
    return (f"Accept the loss with a policy for {precision} (ini infergate_quality_policy or an infergate_quality "
            f"marker), or drop {precision} from the precisions.")


def resolve_policy(ini_lines: list[str], marker_kwargs: list[dict[str, Any]], precision: str, key: str
                   ) -> ResolvedPolicy:
    """The policy of one comparison: ini lines whose scope applies (see scopes.py), then the test's markers
    (outermost first), each key remembering its source and what it replaced."""
    scoped = parse_ini_policies(ini_lines)
    scopes = applicable_scopes(scoped, precision, key)
    policy = ResolvedPolicy(scopes=tuple(scopes))
    for scope in scopes:
        policy = policy.layered(scoped[scope], ini_source(scope))
    for kwargs in marker_kwargs:
        policy = policy.layered(parse_policy(kwargs), MARKER)
    return policy


def threshold_checks(summary: dict[str, Any], policy: ResolvedPolicy) -> list[ThresholdCheck]:
    """The aggregate thresholds of a comparison with the reference, each against its aggregate's interval (other
    gates' keys are theirs)."""
    return [ThresholdCheck.of(summary, key, *AGGREGATE_KEYS[key], threshold.value, threshold.named())
            for key, threshold in policy.thresholds.items() if key in AGGREGATE_KEYS]


def recorded_checks(summary: dict[str, Any], rules: dict[str, float]) -> list[ThresholdCheck]:
    """The aggregate thresholds of `rules` (a record's policy as applied) against `summary`, their source left out:
    a record's line names its policy once."""
    return threshold_checks(summary, ResolvedPolicy.given(rules, source=""))


def category_findings(categories: dict[str, dict[str, Any]], policy: dict[str, float]) -> tuple[list[str], list[str]]:
    """Per category of the samples: (violations of `min_category_task_ratio`, which fail the gate; categories below
    the aggregate policy's `min_task_ratio` / `min_rouge_l` while the mean may pass, which are flagged)."""
    violations, flagged = [], []
    checks = [("task_ratio", "min_task_ratio"), ("rougeL", "min_rouge_l")]
    for name, figures in sorted(categories.items()):
        ratio = figures.get("task_ratio")
        floor = policy.get("min_category_task_ratio")
        if floor is not None and ratio is not None and ratio < floor:
            violations.append(f"min_category_task_ratio: category {name!r} task_ratio = {ratio:.3g} "
                              f"({figures.get('samples', '?')} samples), policy >= {floor:g}")
            continue
        for figure, key in checks:
            value = figures.get(figure)
            if key in policy and value is not None and value < policy[key]:
                flagged.append(f"category {name!r} ({figures.get('samples', '?')} samples): {figure} {value:.3g} "
                               f"below the policy's {key}={policy[key]:g}; gate it with min_category_task_ratio")
    return violations, flagged


def decide_quality(result: QualityResult, policy: ResolvedPolicy) -> Decision:
    """A candidate against the reference under `policy`: an aggregate whose interval lies wholly beyond its
    threshold, a category below its floor, and the flags of the comparison fail it; an interval that straddles its
    threshold leaves it undecided, saying how many samples would decide. A threshold on a figure not measured fails
    where the test set it, and is undecided where the default did (a server without logprobs has no top-1, and the
    default cannot know what else to gate). Points decided without an interval, and categories below the aggregate
    floors while the mean passes, are noted (not gated)."""
    checks = threshold_checks(result.summary, policy)
    problems = [check.describe() for check in checks
                if check.status == Status.FAIL or (not check.measured and not policy.default)]
    undecided = [check.describe() for check in checks if check.measured and check.status == Status.INCONCLUSIVE]
    undecided += [f"{check.describe()}: a server that returned no logprobs has no top-1 or KL; set the policy on "
                  "what it measured, e.g. @pytest.mark.infergate_quality(min_rouge_l=0.4)"
                  for check in checks if not check.measured and policy.default]
    on_point = [check.describe() for check in checks if check.status == Status.PASS and check.low is None]
    by_category, flagged = category_findings(result.categories, policy.rules)
    return Decision(problems + by_category + list(result.flags), undecided, notes=on_point + flagged)


def decide_batch_invariance(result: BatchInvariance, policy: dict[str, float]) -> Decision:
    """Batch invariance under the policy's `max_batch_variant_share` (no gate unless set)."""
    limit_share = policy.get("max_batch_variant_share")
    if limit_share is None or result.variant_share <= limit_share:
        return Decision()
    return Decision([f"max_batch_variant_share: {len(result.variant_ids)} of {len(result.samples)} samples "
                     f"({result.variant_share:.1%}) change with the batch, policy <= {limit_share:g}"])


@dataclass(frozen=True)
class RegressionPolicy:
    """The regression gate's rules for one precision, defaults filled in.

    exact: any changed output fails, on every machine (teams with deterministic hardware); otherwise near-ties pass
    as information.
    gate_tokens: token drift against this machine's accepted outputs fails the gate (True: the reference precision's
    default) or is listed while quality against the reference, compared with the figures accepted with the outputs,
    decides (False: the quantized precisions' default, see GATE_TOKENS; `travel` holds the margins).
    max_drift_share: the share of compared samples that may change by drift (not a near-tie) before the gate fails.
    max_accepted_kl / near_tie_margin: the near-tie test (see NEAR_TIE_MARGIN).
    same_environment: a header that records another environment (CPU flags, GPU, libraries, kernels) fails the gate
    instead of only warning.
    gate_other_machine: token drift against outputs accepted on another machine fails the gate (True) or is listed
    while the quality figures that travel decide (False: the quantized precisions' default, see GATE_OTHER_MACHINE;
    `travel` holds that decision's margins)."""

    exact: bool = False
    gate_tokens: bool = True
    max_drift_share: float = 0.0
    max_accepted_kl: float = MAX_ACCEPTED_KL_OTHER
    near_tie_margin: float = NEAR_TIE_MARGIN
    same_environment: bool = False
    gate_other_machine: bool = True
    travel: TravelMargins = TravelMargins()

    @classmethod
    def of(cls, rules: dict[str, float], precision: str) -> RegressionPolicy:
        return cls(exact=bool(rules.get("exact", 0)),
                   gate_tokens=bool(rules.get("gate_tokens", GATE_TOKENS.get(precision, True))),
                   max_drift_share=rules.get("max_drift_share", 0.0),
                   max_accepted_kl=rules.get("max_accepted_kl", MAX_ACCEPTED_KL.get(precision, MAX_ACCEPTED_KL_OTHER)),
                   near_tie_margin=rules.get("near_tie_margin", NEAR_TIE_MARGIN),
                   same_environment=bool(rules.get("same_environment", 0)),
                   gate_other_machine=bool(rules.get("gate_other_machine", GATE_OTHER_MACHINE.get(precision, True))),
                   travel=TravelMargins.of(rules))

    def to_dict(self) -> dict[str, float]:
        return {"exact": float(self.exact), "gate_tokens": float(self.gate_tokens),
                "max_drift_share": self.max_drift_share,
                "max_accepted_kl": self.max_accepted_kl, "near_tie_margin": self.near_tie_margin,
                "same_environment": float(self.same_environment),
                "gate_other_machine": float(self.gate_other_machine), "max_top1_drop": self.travel.top1_drop,
                "max_kl_rise": self.travel.kl_rise, "max_task_drop": self.travel.task_drop}
