"""Typed result records: what every infergate gate measured and decided (held by `results.run.RunResults`).

Each record is written to JSON (`to_dict`) and read back (`from_dict`) by the report, the CLI and the xdist
controller. A figure that is not finite (a task ratio to a reference that scored 0) is written as null, with the
reason beside it under `<key>_undefined`, never as `Infinity` / `NaN`, which strict JSON readers reject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pytest_infergate.errors import InfergateError
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.outcome import PerfOutcome, Violation
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.quality.corpus_figures import CorpusResult
from pytest_infergate.quality.golden_generation import BatchInvariance
from pytest_infergate.quality.metrics import QualityResult, SampleQuality
from pytest_infergate.status import Decision, Status

UNDEFINED = "_undefined"  # suffix of the key that says why a figure is null
QUALITY_FIGURES = ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")  # a quality gate's in JUnit XML
CORPUS_FIGURES = ("mean_kl", "top1", "delta_ppl_rel", "p99_kl", "kl_rise")  # a corpus check's
RESULT_PROPERTY = "infergate_result"  # the user property that carries a record from a test to the controller


@dataclass
class PerfRecord:
    """One gated measurement and the gate's outcome (budgets, and the comparison with its reference: a stored
    baseline or side A of an A/B run). The decision is the outcome's, read through this record, never copied."""

    kind: ClassVar[str] = "perf"
    test: str  # measurement key: test id, plus ::label
    label: str
    precision: str
    measurement: Measurement
    outcome: PerfOutcome = field(default_factory=PerfOutcome)
    backend: str = "engine"  # engine, hf-generate, endpoint
    backend_reason: str = ""  # why this backend (e.g. the engine refused the model)
    fallback: bool = False
    engine_config: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    budget: dict = field(default_factory=dict)  # key -> limit, plus max_regression
    fingerprint: dict = field(default_factory=dict)
    baseline_summary: dict | None = None  # side A of an interleaved A/B run, or the stored baseline's figures

    @property
    def status(self) -> Status:
        return self.outcome.status

    @property
    def gated(self) -> bool:
        """Whether a budget limit or a comparison checked it (else its pass says "measured, not gated")."""
        return self.has_limits or self.asks_comparison or bool(self.verdicts)

    @property
    def asks_comparison(self) -> bool:  # max_regression: a relative check, which later runs make against a save
        return self.budget.get("max_regression") is not None

    @property
    def has_limits(self) -> bool:
        """Whether its budget names an absolute limit (any key but max_regression)."""
        return any(key != "max_regression" for key in self.budget)

    @property
    def compared_nothing(self) -> bool:
        """A relative check was asked for and there was no baseline (a first run, or the save): its pass is of its
        budget's limits and every output says so (a baseline without its entry: relative_check_missing)."""
        return (self.asks_comparison and not self.verdicts
                and self.outcome.route == "budget" and not self.relative_check_missing)

    @property
    def violations(self) -> list[Violation]:
        return self.outcome.violations

    @property
    def verdicts(self) -> list[Verdict]:
        return self.outcome.verdicts

    @property
    def notes(self) -> list[str]:
        return self.outcome.notes

    @property
    def machine_mismatch(self) -> list[str]:  # how the baseline's machine differs from this one
        return self.outcome.machine_mismatch

    @property
    def changes(self) -> list[str]:  # what under test changed since the baseline ("torch a → b")
        return self.outcome.changes

    @property
    def model_change(self) -> str:  # the baseline is of another model ("model_name a → b, architecture ...")
        return self.outcome.model_change

    @property
    def relative_check_missing(self) -> str:
        return self.outcome.relative_check_missing

    @property
    def baseline_provenance(self) -> str:  # a stored baseline's repetitions, when and where it was recorded
        return self.outcome.baseline_provenance

    @property
    def summary(self) -> dict[str, float]:
        return self.measurement.summary()

    @property
    def is_endpoint(self) -> bool:
        return self.backend == "endpoint"

    def decision(self) -> Decision:
        return self.outcome.decision()

    @property
    def compared_with(self) -> dict | None:
        """The figures of what the gate compared this run with (A of an A/B run, the stored baseline), beside this
        run's in every output: from the outcome's measurement where this run decided, else as recorded."""
        return self.outcome.baseline.summary() if self.outcome.baseline is not None else self.baseline_summary

    def key_figures(self) -> list[tuple[str, float]]:
        """What JUnit XML shows of it (CI test tabs): each summary figure, named by label."""
        return [(f"{self.label + '.' if self.label else ''}{name}", round(value, 4)) for name, value in
                self.summary.items()]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "label": self.label, "precision": self.precision,
                **self.outcome.to_dict(), **backend_dict(self),
                "fallback": self.fallback, "engine_config": self.engine_config, "tags": self.tags,
                "budget": self.budget, "fingerprint": self.fingerprint, "measurement": self.measurement.to_dict(),
                "summary": self.summary, "baseline_summary": self.compared_with}

    @classmethod
    def from_dict(cls, data: dict) -> PerfRecord:
        backend, backend_reason = backend_of(data)
        return cls(test=data["test"], label=data.get("label", ""), precision=data["precision"],
                   measurement=Measurement.from_dict(data["measurement"]), outcome=PerfOutcome.from_dict(data),
                   backend=backend, backend_reason=backend_reason,
                   fallback=bool(data.get("fallback")), engine_config=dict(data.get("engine_config") or {}),
                   tags=dict(data.get("tags") or {}), budget=dict(data.get("budget") or {}),
                   fingerprint=dict(data.get("fingerprint") or {}),
                   baseline_summary=data.get("baseline_summary"))


@dataclass
class PolicyGateRecord:
    """A gate whose `result` (typed: `precision`, `to_dict`, `from_dict`) a quality policy decided: the thresholds
    applied, broken and undecided, and which policy."""

    kind: ClassVar[str]
    result_type: ClassVar[type]
    test: str
    status: Status
    result: Any
    policy: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    backend: str = "engine"  # what generated the outputs compared: engine, hf-generate, endpoint
    backend_reason: str = ""  # why not the engine
    undecided: list[str] = field(default_factory=list)  # thresholds its intervals straddle, each saying what decides
    decided_by: str = ""  # which policy decided, one phrase (quality.policy.ResolvedPolicy.decided_by)

    @property
    def precision(self) -> str:
        return self.result.precision

    def result_dict(self) -> dict:
        return self.result.to_dict()

    def key_figures(self) -> list[tuple[str, float]]:
        """What JUnit XML shows of it (CI test tabs)."""
        return []

    def decision(self) -> Decision:
        """Its outcome in the shape every gate's shares (status.Decision); its status is the record's."""
        return Decision(list(self.problems), list(self.undecided))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "status": self.status.value, "policy": self.policy,
                "problems": self.problems, "undecided": self.undecided, "decided_by": self.decided_by,
                **backend_dict(self), **self.result_dict()}

    @classmethod
    def from_dict(cls, data: dict):
        return cls(data["test"], Status(data["status"]), cls.result_type.from_dict(data),
                   dict(data.get("policy", {})), list(data.get("problems", [])), *backend_of(data),
                   undecided=list(data.get("undecided", [])), decided_by=str(data.get("decided_by", "")))


@dataclass
class QualityRecord(PolicyGateRecord):
    """A candidate precision (or endpoint) against the reference precision, decided by a policy."""

    kind: ClassVar[str] = "quality"
    result_type: ClassVar[type] = QualityResult
    result: QualityResult

    def key_figures(self) -> list[tuple[str, float]]:
        return [(f"quality.{name}", round(self.summary[name], 4)) for name in QUALITY_FIGURES
                if isinstance(self.summary.get(name), (int, float))]  # a figure that is not defined is not shown

    @property
    def reference_precision(self) -> str:
        return self.result.reference_precision

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary

    def result_dict(self) -> dict:
        data = self.result.to_dict()
        data["summary"] = _explain_undefined(data["summary"])
        data["categories"] = {name: _explain_undefined(c) for name, c in data["categories"].items()}
        return data


@dataclass
class GoldenRecord:
    """A precision's outputs against its own accepted golden outputs, or an update of them. Each changed sample
    carries its verdict (`regression`: near-tie or drift), why, and the log-prob margin at its first divergence."""

    kind: ClassVar[str] = "golden"
    test: str
    status: Status
    precision: str
    path: str
    updated: bool = False  # --infergate-update-golden rewrote the file
    changes: list[str] = field(default_factory=list)  # what an update changed
    compared: int = 0
    missing: list[str] = field(default_factory=list)
    mean_topk_kl: float | None = None  # over the changed samples (unchanged ones are not scored)
    changed: list[SampleQuality] = field(default_factory=list)
    policy: dict[str, float] = field(default_factory=dict)  # the regression policy applied, defaults filled in
    problems: list[str] = field(default_factory=list)  # why it failed
    environment_mismatch: list[str] = field(default_factory=list)  # accepted file's header vs this run
    backend: str = "engine"  # what generated the current outputs: engine, hf-generate, endpoint
    backend_reason: str = ""  # why not the engine
    undecided: list[str] = field(default_factory=list)  # why it is inconclusive, each naming the action that decides
    decided_by: str = ""  # which evidence decided, one phrase (GoldenRegression.decided_by)
    travel: str = ""  # on another machine: the quality figures against the reference, this machine vs the accepted
    # compared across a model change (the accepted outputs of the weights before these): said on a pass too
    model_change: str = ""

    @property
    def near_ties(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression == "near-tie"]

    @property
    def drift(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression != "near-tie"]

    def decision(self) -> Decision:
        return Decision(list(self.problems), list(self.undecided))

    def key_figures(self) -> list[tuple[str, float]]:
        if self.updated:
            return []
        return [("golden.changed", len(self.changed)), ("golden.near_ties", len(self.near_ties))]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "status": self.status.value, "precision": self.precision,
                "path": self.path, "updated": self.updated, "changes": self.changes, "compared": self.compared,
                "missing": self.missing, "mean_topk_kl": self.mean_topk_kl,
                "near_ties": len(self.near_ties), "drift": len(self.drift),  # counts, derived from `changed`
                "changed": [s.to_dict() for s in self.changed], "policy": self.policy, "problems": self.problems,
                "environment_mismatch": self.environment_mismatch, "undecided": self.undecided,
                "decided_by": self.decided_by, "travel": self.travel, "model_change": self.model_change,
                **backend_dict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> GoldenRecord:
        updated = data.get("updated")  # version 1 stored the path of an update here
        return cls(data["test"], Status(data["status"]), data["precision"], str(data.get("path") or updated or ""),
                   bool(updated), list(data.get("changes", [])), int(data.get("compared", 0)),
                   list(data.get("missing", [])), data.get("mean_topk_kl"),
                   [SampleQuality.from_dict(s) for s in data.get("changed", [])], dict(data.get("policy", {})),
                   list(data.get("problems", [])), list(data.get("environment_mismatch", [])), *backend_of(data),
                   undecided=list(data.get("undecided", [])), decided_by=str(data.get("decided_by", "")),
                   travel=str(data.get("travel", "")), model_change=str(data.get("model_change", "")))


@dataclass
class BatchInvarianceRecord(PolicyGateRecord):
    """Whether a precision's greedy answers change with the batch they run in (see quality.golden_generation)."""

    kind: ClassVar[str] = "batch_invariance"
    result_type: ClassVar[type] = BatchInvariance
    result: BatchInvariance

    def key_figures(self) -> list[tuple[str, float]]:
        return [("batch_variant_share", round(self.result.variant_share, 4))]


@dataclass
class CorpusRecord(PolicyGateRecord):
    """A candidate precision against the reference teacher-forced over a text corpus (quality.corpus_figures)."""

    kind: ClassVar[str] = "corpus"
    result_type: ClassVar[type] = CorpusResult
    result: CorpusResult

    def key_figures(self) -> list[tuple[str, float]]:
        return [(f"corpus.{name}", round(self.result.summary[name], 4)) for name in CORPUS_FIGURES
                if isinstance(self.result.summary.get(name), (int, float))]


def backend_dict(record) -> dict:
    """A record's backend and why, as written to JSON."""
    return {"backend": record.backend, "backend_reason": record.backend_reason}


def backend_of(data: dict) -> tuple[str, str]:
    """(backend, why) of a record read back; files written before backends were recorded ran on the engine."""
    return data.get("backend") or "engine", data.get("backend_reason", "")


def _explain_undefined(summary: dict) -> dict:
    """The quality aggregate with an infinite task ratio (the reference passed no task check, the candidate some:
    quality/metrics.py `aggregate`, which the policy reads as no loss) as null plus the reason."""
    out = dict(summary)
    value = out.get("task_ratio")
    if isinstance(value, float) and not math.isfinite(value):
        out["task_ratio"] = None
        out["task_ratio" + UNDEFINED] = (f"the reference passed no task check, the candidate "
                                         f"{out.get('candidate_task', 0):.0%}: no loss")
    return out


def undefined_reason(summary: dict, key: str) -> str | None:
    """Why `summary[key]` has no finite value, if the results say (files before version 3 held inf itself)."""
    reason = summary.get(key + UNDEFINED)
    if reason:
        return reason
    value = summary.get(key)
    if key == "task_ratio" and isinstance(value, float) and not math.isfinite(value):
        return _explain_undefined(summary)["task_ratio" + UNDEFINED]
    return None


Record = PerfRecord | QualityRecord | GoldenRecord | BatchInvarianceRecord | CorpusRecord
RECORD_TYPES: dict[str, type] = {t.kind: t for t in (PerfRecord, QualityRecord, GoldenRecord, BatchInvarianceRecord,
                                                     CorpusRecord)}


def record_from_dict(data: dict) -> Record:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in RECORD_TYPES:
        raise InfergateError(f"a result record of unknown kind {kind!r}; known: {', '.join(RECORD_TYPES)}")
    return RECORD_TYPES[kind].from_dict(data)
