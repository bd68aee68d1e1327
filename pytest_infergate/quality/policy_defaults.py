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
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DefaultPolicy:
    """The thresholds `check()` applies to the precisions of one class when nothing else sets any."""

    name: str  # the class, as the verdict names it: "8-bit"
    precisions: tuple[str, ...]
    rules: dict[str, float] = field(default_factory=dict)


FLOATING_POINT = DefaultPolicy("floating point", ("fp32", "fp16", "bf16"), {"min_top1": 0.95, "max_mean_kl": 0.01})
EIGHT_BIT = DefaultPolicy("8-bit", ("int8",), {"min_top1": 0.9, "max_mean_kl": 0.05})
FOUR_BIT = DefaultPolicy("4-bit", ("nf4",), {"min_top1": 0.9, "max_mean_kl": 0.05})
# a server's precision is not ours to know (often quantized): the loosest class's thresholds
SERVED = DefaultPolicy("a served model, precision unknown", ("endpoint",), {"min_top1": 0.9, "max_mean_kl": 0.05})
DEFAULT_POLICIES = (FLOATING_POINT, EIGHT_BIT, FOUR_BIT, SERVED)


def default_policy(precision: str) -> DefaultPolicy:
    """The default of `precision`'s class; a precision of no class (one added later) gets the served model's,
    the loosest, rather than no gate at all."""
    return next((policy for policy in DEFAULT_POLICIES if precision in policy.precisions), SERVED)
