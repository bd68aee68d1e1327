"""Typed result records: what every infergate gate measured and decided, and the run that holds them.

Each record is written to JSON (`to_dict`) and read back (`from_dict`) by the report, the CLI and the xdist
controller. The JSON shape is versioned: `kind: "results"`, `schema_version` 2 (version 1, written before
`kind` existed, is still read).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pytest_infergate.errors import InfergateError
from pytest_infergate.perf.budget import Violation
from pytest_infergate.perf.metrics import Measurement
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.quality.batch_invariance import BatchInvariance
from pytest_infergate.quality.metrics import QualityResult, SampleQuality
from pytest_infergate.status import Status

KIND = "results"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
RESULT_PROPERTY = "infergate_result"  # the user property that carries a record from a test to the controller


@dataclass
class PerfRecord:
    """One gated measurement: budgets, and the comparison with a stored baseline or side A of an A/B run."""

    kind: ClassVar[str] = "perf"
    test: str  # measurement key: test id, plus ::label
    label: str
    precision: str
    status: Status
    measurement: Measurement
    backend: str = "engine"  # engine, hf-generate, endpoint
    backend_reason: str = ""  # why this backend (e.g. the engine refused the model)
    fallback: bool = False
    engine_config: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    budget: dict = field(default_factory=dict)  # key -> limit, plus max_regression
    fingerprint: dict = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fingerprint_mismatch: list[str] = field(default_factory=list)
    remeasured: int = 0
    relative_check_missing: str = ""
    baseline_summary: dict | None = None  # side A of an interleaved A/B run

    @property
    def summary(self) -> dict[str, float]:
        return self.measurement.summary()

    @property
    def is_endpoint(self) -> bool:
        return self.backend == "endpoint"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "label": self.label, "precision": self.precision,
                "status": self.status.value, "backend": self.backend, "backend_reason": self.backend_reason,
                "fallback": self.fallback, "engine_config": self.engine_config, "tags": self.tags,
                "budget": self.budget, "fingerprint": self.fingerprint, "measurement": self.measurement.to_dict(),
                "summary": self.summary, "violations": [v.to_dict() for v in self.violations],
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": self.notes,
                "fingerprint_mismatch": self.fingerprint_mismatch, "remeasured": self.remeasured,
                "relative_check_missing": self.relative_check_missing, "baseline_summary": self.baseline_summary}

    @classmethod
    def from_dict(cls, data: dict) -> PerfRecord:
        return cls(test=data["test"], label=data.get("label", ""), precision=data["precision"],
                   status=Status(data["status"]), measurement=Measurement.from_dict(data["measurement"]),
                   backend=data.get("backend") or "engine", backend_reason=data.get("backend_reason", ""),
                   fallback=bool(data.get("fallback")), engine_config=dict(data.get("engine_config") or {}),
                   tags=dict(data.get("tags") or {}), budget=dict(data.get("budget") or {}),
                   fingerprint=dict(data.get("fingerprint") or {}),
                   violations=[Violation.from_dict(v) for v in data.get("violations", [])],
                   verdicts=[Verdict.from_dict(v) for v in data.get("verdicts", [])],
                   notes=list(data.get("notes", [])), fingerprint_mismatch=list(data.get("fingerprint_mismatch", [])),
                   remeasured=int(data.get("remeasured", 0)),
                   relative_check_missing=data.get("relative_check_missing", ""),
                   baseline_summary=data.get("baseline_summary"))


@dataclass
class QualityRecord:
    """A candidate precision (or endpoint) against the reference precision, decided by a policy."""

    kind: ClassVar[str] = "quality"
    test: str
    status: Status
    result: QualityResult
    policy: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def precision(self) -> str:
        return self.result.precision

    @property
    def reference_precision(self) -> str:
        return self.result.reference_precision

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "status": self.status.value, "policy": self.policy,
                "problems": self.problems, **self.result.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> QualityRecord:
        return cls(data["test"], Status(data["status"]), QualityResult.from_dict(data), dict(data.get("policy", {})),
                   list(data.get("problems", [])))


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

    @property
    def near_ties(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression == "near-tie"]

    @property
    def drift(self) -> list[SampleQuality]:
        return [s for s in self.changed if s.regression != "near-tie"]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "status": self.status.value, "precision": self.precision,
                "path": self.path, "updated": self.updated, "changes": self.changes, "compared": self.compared,
                "missing": self.missing, "mean_topk_kl": self.mean_topk_kl,
                "near_ties": len(self.near_ties), "drift": len(self.drift),  # counts, derived from `changed`
                "changed": [s.to_dict() for s in self.changed], "policy": self.policy, "problems": self.problems,
                "environment_mismatch": self.environment_mismatch}

    @classmethod
    def from_dict(cls, data: dict) -> GoldenRecord:
        updated = data.get("updated")  # version 1 stored the path of an update here
        return cls(data["test"], Status(data["status"]), data["precision"], str(data.get("path") or updated or ""),
                   bool(updated), list(data.get("changes", [])), int(data.get("compared", 0)),
                   list(data.get("missing", [])), data.get("mean_topk_kl"),
                   [SampleQuality.from_dict(s) for s in data.get("changed", [])], dict(data.get("policy", {})),
                   list(data.get("problems", [])), list(data.get("environment_mismatch", [])))


@dataclass
class BatchInvarianceRecord:
    """Whether a precision's greedy answers change with the batch they run in (see quality.batch_invariance)."""

    kind: ClassVar[str] = "batch_invariance"
    test: str
    status: Status
    result: BatchInvariance
    policy: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def precision(self) -> str:
        return self.result.precision

    def to_dict(self) -> dict:
        return {"kind": self.kind, "test": self.test, "status": self.status.value, "policy": self.policy,
                "problems": self.problems, **self.result.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> BatchInvarianceRecord:
        return cls(data["test"], Status(data["status"]), BatchInvariance.from_dict(data), dict(data.get("policy", {})),
                   list(data.get("problems", [])))


Record = PerfRecord | QualityRecord | GoldenRecord | BatchInvarianceRecord
RECORD_TYPES: dict[str, type] = {t.kind: t for t in (PerfRecord, QualityRecord, GoldenRecord, BatchInvarianceRecord)}


def record_from_dict(data: dict) -> Record:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in RECORD_TYPES:
        raise InfergateError(f"a result record of unknown kind {kind!r}; known: {', '.join(RECORD_TYPES)}")
    return RECORD_TYPES[kind].from_dict(data)


@dataclass
class RunResults:
    started: float = field(default_factory=time.time)
    finished: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict] = field(default_factory=dict)  # precision -> load record
    records: list[Record] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed / failed / skipped / error
    warnings: list[str] = field(default_factory=list)  # checks that did not run as asked (also in the summary)

    def add(self, record: Record) -> None:
        self.records.append(record)

    def of_type(self, record_type: type) -> list:
        return [r for r in self.records if isinstance(r, record_type)]

    @property
    def perf(self) -> list[PerfRecord]:
        return self.of_type(PerfRecord)

    @property
    def quality(self) -> list[QualityRecord]:
        return self.of_type(QualityRecord)

    @property
    def golden(self) -> list[GoldenRecord]:
        return self.of_type(GoldenRecord)

    @property
    def batch_invariance(self) -> list[BatchInvarianceRecord]:
        return self.of_type(BatchInvarianceRecord)

    def gate_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for record in self.records:
            gate = counts.setdefault(record.kind, {status.value: 0 for status in Status})
            gate[record.status.value] += 1
        return counts

    def to_dict(self) -> dict:
        return {"kind": KIND, "schema_version": SCHEMA_VERSION, "started": self.started,
                "finished": self.finished if self.finished is not None else time.time(),
                "environment": self.environment, "models": self.models,
                "records": [r.to_dict() for r in self.records], "outcomes": self.outcomes,
                "warnings": self.warnings, "gate_counts": self.gate_counts()}

    @classmethod
    def from_dict(cls, data: dict, source: str = "results file") -> RunResults:
        from pytest_infergate.perf.baseline import file_kind

        kind = file_kind(data)
        if kind != KIND:
            hint = (" (written by --infergate-save-baseline); this command takes a results file written by "
                    "--infergate-json" if kind == "baseline" else "; write one with pytest --infergate-json PATH")
            raise InfergateError(f"{source} is a {kind} file, not a results file{hint}")
        if data.get("schema_version") not in READABLE_VERSIONS:
            raise InfergateError(f"{source} has schema version {data.get('schema_version')!r}; this "
                                 f"pytest-infergate reads {', '.join(map(str, READABLE_VERSIONS))}")
        try:
            records = [record_from_dict(r) for r in data.get("records", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise InfergateError(f"{source}: a record is incomplete ({type(exc).__name__}: {exc}); was the file "
                                 "edited by hand or cut short? Re-run pytest with --infergate-json") from None
        return cls(started=data.get("started", 0.0), finished=data.get("finished"),
                   environment=dict(data.get("environment", {})), models=dict(data.get("models", {})),
                   records=records, outcomes=dict(data.get("outcomes", {})), warnings=list(data.get("warnings", [])))
