"""The default policy of a comparison with the reference precision (`check()`), per precision class: what decides
when neither a marker `infergate_quality`, nor an ini `infergate_quality_policy` line, nor `check(policy=...)` sets
any of check()'s thresholds. Without it an empty policy would pass anything, a quantization that changes one token
in five included.

The thresholds gate the two figures that every local comparison measures and that do not depend on how long the
samples' answers are (teacher-forced on the reference's continuation, per token): top-1 agreement and mean
KL(reference || candidate). Text figures (ROUGE, exact match) move with answer length and greedy paths drifting
apart late, so they stay a team's own choice.

Half precision must agree at 0.95 with a KL within 0.01 (ten times bf16's KL on the embedded model), and 8-bit,
4-bit and a server of unknown precision at 0.9 within 0.05: int8's interval clears both, nf4's (a quantization that
changes one token in five, which a default must fail; a team that accepts it says so in its own policy) misses
both, whole. fp32 is in the floating-point class with fp16 and bf16: against a half-precision reference (a GPU's
fp16) the difference is the reference's rounding; against fp32 itself it is identical by construction.

The corpus check (`check_corpus()`: teacher-forced over the built-in corpus of public-domain prose) gates the same
two figures over text the model did not write, where it is less sure of the next token, so quantization shows more:
the floating-point class keeps check()'s 0.95 within 0.01, and 8-bit, 4-bit and a server 0.85 within 0.1, which
int8's intervals clear and nf4's miss, whole. The figures these rest on (per precision, with their intervals and
the machines they were measured on): docs/explanation/quality-gates.md and docs/measurements.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DefaultPolicy:
    """The thresholds `check()` applies to the precisions of one class when nothing else sets any."""

    name: str  # the class, as the verdict names it: "8-bit"
    precisions: tuple[str, ...]
    rules: dict[str, float] = field(default_factory=dict)
    corpus_rules: dict[str, float] = field(default_factory=dict)  # check_corpus()'s, the same figures over a corpus


FLOATING_POINT = DefaultPolicy("floating point", ("fp32", "fp16", "bf16"), {"min_top1": 0.95, "max_mean_kl": 0.01},
                               {"min_corpus_top1": 0.95, "max_corpus_kl": 0.01})
EIGHT_BIT = DefaultPolicy("8-bit", ("int8",), {"min_top1": 0.9, "max_mean_kl": 0.05},
                          {"min_corpus_top1": 0.85, "max_corpus_kl": 0.1})
FOUR_BIT = DefaultPolicy("4-bit", ("nf4",), {"min_top1": 0.9, "max_mean_kl": 0.05},
                         {"min_corpus_top1": 0.85, "max_corpus_kl": 0.1})
# a server's precision is not ours to know (often quantized): the loosest class's thresholds
SERVED = DefaultPolicy("a served model, precision unknown", ("endpoint",), {"min_top1": 0.9, "max_mean_kl": 0.05},
                       {"min_corpus_top1": 0.85, "max_corpus_kl": 0.1})
DEFAULT_POLICIES = (FLOATING_POINT, EIGHT_BIT, FOUR_BIT, SERVED)


def default_policy(precision: str) -> DefaultPolicy:
    """The default of `precision`'s class; a precision of no class (one added later) gets the served model's,
    the loosest, rather than no gate at all."""
    return next((policy for policy in DEFAULT_POLICIES if precision in policy.precisions), SERVED)
