"""The failure messages of the golden regression and batch-invariance gates: what failed, the changed samples
with both texts, the near-ties with their margins, and what the accepted file was recorded with."""

from __future__ import annotations

from pathlib import Path

from pytest_infergate import units
from pytest_infergate.quality.metrics import describe_sample

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
