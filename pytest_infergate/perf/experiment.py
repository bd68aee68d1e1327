"""Speed experiments decided on intervals, not on single timings: "is X faster than Y?", "does the gain grow from
one point to the next?".

Why: a ratio of two single timings is as noisy as the machine. On a loaded 2-core VM the KV cache's speedup over
recomputing came out as 10.5, 7.7 and 1.5 for prompts of 32, 128 and 256 tokens, the reverse of what it is. Each
point here is an interleaved comparison of two configs (perf.lockstep rounds), the speedup taken within each round
so that drift of the machine cancels, and its 95% bootstrap interval decides: a claim passes when the intervals
clear it, fails only when they lie wholly on the wrong side, and is inconclusive otherwise (more rounds on a
quieter machine would decide) - the same three outcomes as the gates (perf.verdict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_infergate.stats import paired_bootstrap_ci, percentile
from pytest_infergate.status import Status

QUIET_RUNNER = "rerun on a quiet runner (or with more rounds) to decide"


@dataclass(frozen=True)
class Speedup:
    """How many times faster one side ran than the other: the median of per-round ratios, with its 95% interval."""

    name: str
    ratio: float
    low: float
    high: float
    rounds: int

    def __post_init__(self):
        if not 0 < self.low <= self.high:
            raise ValueError(f"Speedup {self.name!r}: low and high must satisfy 0 < low <= high, got "
                             f"{self.low}, {self.high}")

    def describe(self) -> str:
        return f"{self.name} ×{self.ratio:.2f} (95% CI {self.low:.2f}-{self.high:.2f}, {self.rounds} rounds)"


def speedup(name: str, fast: Sequence[float], slow: Sequence[float], higher_is_better: bool = True) -> Speedup:
    """The speedup of `fast` over `slow` from one value per round each (`fast[i]` and `slow[i]` measured in the
    same round): fast/slow for a throughput, slow/fast for a time (`higher_is_better=False`)."""
    if len(fast) != len(slow) or not fast:
        raise ValueError(f"speedup {name!r}: needs one value per round on each side, got {len(fast)} and "
                         f"{len(slow)}")
    if min(fast) <= 0 or min(slow) <= 0:
        raise ValueError(f"speedup {name!r}: values must be positive, got {list(fast)} and {list(slow)}")
    ratios = [(f / s if higher_is_better else s / f) for f, s in zip(fast, slow)]
    point, low, high = paired_bootstrap_ci(ratios, lambda xs: percentile(xs, 50))
    return Speedup(name, point, low, high, len(ratios))


@dataclass(frozen=True)
class Claim:
    """One claim of an experiment, its decision and the intervals it was decided on."""

    claim: str
    status: Status
    evidence: str

    def describe(self) -> str:
        return f"{self.status.upper()}: {self.claim}: {self.evidence}"


def faster(s: Speedup) -> Claim:
    """Passes when the whole interval lies above 1, fails when it lies at or below 1, else inconclusive."""
    status = Status.PASS if s.low > 1.0 else Status.FAIL if s.high <= 1.0 else Status.INCONCLUSIVE
    return Claim(f"{s.name} is faster", status, s.describe())


def grows(before: Speedup, after: Speedup) -> Claim:
    """Passes when `after`'s interval lies wholly above `before`'s, fails when wholly at or below it, else
    inconclusive (overlapping intervals cannot tell which is larger)."""
    if after.low > before.high:
        status = Status.PASS
    elif after.high <= before.low:
        status = Status.FAIL
    else:
        status = Status.INCONCLUSIVE
    return Claim(f"the speedup grows from {before.name} to {after.name}", status,
                   f"{before.describe()} -> {after.describe()}")


def conclusion(experiment: str, claims: Sequence[Claim]) -> tuple[Status, str]:
    """The experiment's status (the worst of its claims) and a message listing every claim; an inconclusive
    one says how to decide it."""
    status = Status.worst(f.status for f in claims)
    lines = [f"{experiment}: {status.upper()}"] + ["  " + f.describe() for f in claims]
    if status == Status.INCONCLUSIVE:
        lines.append(f"  the intervals overlap their threshold: too noisy to decide here; {QUIET_RUNNER}")
    return status, "\n".join(lines)
