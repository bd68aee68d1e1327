"""The default policy of a comparison with the reference precision (`check()`), per precision class: what decides
when neither a marker `infergate_quality`, nor an ini `infergate_quality_policy` line, nor `check(policy=...)` sets
any of check()'s thresholds. Without it an empty policy passed anything: the starter gate passed nf4 at top-1
0.783, mean KL 0.289, exact match 6% on the embedded model (issue #55).

The thresholds gate the two figures that every local comparison measures and that do not depend on how long the
samples' answers are (teacher-forced on the reference's continuation, per token): top-1 agreement and mean
KL(reference || candidate). Text figures (ROUGE, exact match) move with answer length and greedy paths drifting
apart late, so they stay a team's own choice. Measured on the embedded model (SmolLM2-135M, 48 built-in samples,
against fp32, docs/explanation/quality-gates.md):

- bf16: top-1 0.978, mean KL 0.001 (fp16 rounds less: closer still);
- int8: top-1 0.94 (95% CI 0.926-0.950), mean KL 0.021 (0.0200 on an Intel Xeon, 0.0211 on an AMD EPYC);
- nf4: top-1 0.78-0.80, mean KL 0.28-0.29: a quantization that changes one token in five, which a default must
  fail, and a team that accepts it says so in its own policy;
- a served model (llama.cpp Q4_1 against the local fp32): top-1 0.98, KL(endpoint top-5 || fp32) 0.0018.

So half precision must agree at 0.95 with a KL within 0.01 (10x bf16's), and 8-bit, 4-bit and a server of unknown
precision at 0.9 within 0.05 (int8's interval clears both; nf4's misses both, whole). fp32 is in the floating-point
class with fp16 and bf16: against a half-precision reference (a GPU's fp16) the difference is the reference's
rounding; against fp32 itself it is identical by construction.

The corpus check (`check_corpus()`: teacher-forced over about 10,100 tokens of public-domain prose, 21 chunks) gates
the same two figures over text the model did not write, where it is less sure of the next token (fp32 perplexity
14.1), so quantization shows more: bf16 top-1 0.974 (95% CI 0.970-0.978), mean KL 0.0016; int8 top-1 0.900
(0.892-0.908), KL 0.039 (0.030-0.051); nf4 top-1 0.651 (0.628-0.672), KL 0.58 (0.44-0.73) (Intel Xeon, 2 vCPUs,
2026-12-05). So the floating-point class keeps check()'s 0.95 within 0.01, and 8-bit, 4-bit and a server 0.85
within 0.1: int8's intervals clear both, nf4's miss both, whole.
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
