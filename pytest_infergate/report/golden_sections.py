"""The report's golden-output sections: each precision against its accepted outputs, every changed sample with its
verdict (a near-tie the numerics may flip, or drift) and the margin that decided it; and batch invariance, which
precisions' greedy answers change with the batch they run in, with one sample shown."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.quality.golden_generation import Divergence
from pytest_infergate.results.records import BatchInvarianceRecord, GoldenRecord


def nats(value: float | None) -> str:
    return f"{units.number(value)} nats" if units.is_number(value) else units.DASH


@dataclass
class GoldenChange:
    id: str
    category: str
    verdict: str  # near-tie / drift / "–" (a file written before the classification)
    reason: str
    margin: str  # log p(current top token) - log p(accepted token) at the first divergence
    mean_kl: str
    divergence_token: int | None


@dataclass
class GoldenSection:
    test: str
    precision: str
    status: str  # pass / fail / updated
    path: str
    compared: int
    near_ties: int
    drift: int
    changes: list[GoldenChange]
    problems: list[str]
    environment_mismatch: list[str]
    policy: str  # the regression policy applied, as text
    undecided: list[str]  # why it is inconclusive
    decided_by: str = ""  # which evidence decided (GoldenRecord.decided_by)
    travel: str = ""  # on another machine: quality against the reference, this machine vs the accepted one


def golden_sections(records: list[GoldenRecord]) -> list[GoldenSection]:
    out = []
    for r in records:
        changes = [GoldenChange(s.id, s.category, s.regression or units.DASH, s.regression_reason or "",
                                nats(s.divergence_margin), nats(s.mean_kl), s.first_divergence) for s in r.changed]
        drift_first = sorted(changes, key=lambda c: c.verdict == "near-tie")  # drift decides a failure: first
        out.append(GoldenSection(r.test, r.precision, "updated" if r.updated else r.status.value, r.path, r.compared,
                                 len(r.near_ties), len(r.drift), drift_first, list(r.problems),
                                 list(r.environment_mismatch),
                                 ", ".join(f"{key} {units.number(value)}" for key, value in r.policy.items()),
                                 list(r.undecided), r.decided_by, r.travel))
    return out


@dataclass
class VariantSummary:
    name: str
    description: str
    changed: int
    samples: int
    mean_kl: str
    max_kl: str


@dataclass
class BatchInvarianceSection:
    test: str
    precision: str
    status: str
    batch_variant: bool  # some sample's greedy answer changed with its batch
    variant_samples: int
    samples: int
    share: str
    variants: list[VariantSummary]
    example: Divergence | None
    example_variant: str  # the variant it changed in
    example_margin: str
    problems: list[str]
    notes: list[str]
    compared: str  # which tokens of each sample were compared


def batch_invariance_sections(records: list[BatchInvarianceRecord]) -> list[BatchInvarianceSection]:
    out = []
    for r in records:
        result = r.result
        example = result.example()
        where = next((v.name for v in result.variants if example is not None and example in v.changed), "")
        out.append(BatchInvarianceSection(
            r.test, r.precision, r.status.value, bool(result.variant_ids), len(result.variant_ids),
            len(result.samples), units.percent(result.variant_share),
            [VariantSummary(v.name, v.description, len(v.changed), v.samples, nats(v.mean_kl), nats(v.max_kl))
             for v in result.variants],
            example, where, nats(example.margin) if example is not None else units.DASH, list(r.problems),
            list(result.notes),
            "every token" if result.max_new_tokens is None else f"first {result.max_new_tokens} tokens"))
    return out
