"""A run's results: its environment, models and records, as one versioned JSON file.

The JSON shape is versioned: `kind: "results"`, `schema_version` 3 (versions 1, written before `kind` existed, and
2, before runs carried a run id, commit and environment fingerprint for `infergate history`, are still read).
Version 3 is strict JSON (see `finite_json`); an older reader that expects a number where version 3 writes null
is told the version instead of crashing on it. Version 4 opens with the run's one verdict: `verdict` (pass, fail
or inconclusive; --infergate-strict, recorded as `strict`, turns inconclusive into fail) and `reasons` (one per
failed or errored test, gate that did not pass and check that did not run: status, what, name, message), and
keeps each failed test's short message and location under `failures`.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_infergate.errors import InfergateError
from pytest_infergate.perf.baseline import BaselineEntry
from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    GoldenRecord,
    PerfRecord,
    QualityRecord,
    Record,
    record_from_dict,
)
from pytest_infergate.status import Finding, Status

KIND = "results"
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (strict JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def new_run_id(started: float) -> str:
    """Sortable by time (UTC), unique across machines: `20250101T120000Z-1a2b3c`."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started)) + "-" + secrets.token_hex(3)


def environment_fingerprint(environment: dict) -> str:
    """A short hash of what the run's numbers depend on besides the code: machine, library versions (not
    pytest-infergate's own), model, device. Runs with different fingerprints are not compared in a history."""
    versions = {k: v for k, v in (environment.get("versions") or {}).items() if k != "pytest-infergate"}
    basis = {"machine": environment.get("machine"), "versions": versions, "model": environment.get("model"),
             "device": environment.get("device"), "endpoint": (environment.get("endpoint") or {}).get("url")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True, default=str).encode()).hexdigest()[:12]



@dataclass
class RunResults:
    started: float = field(default_factory=time.time)
    finished: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict] = field(default_factory=dict)  # precision -> load record
    records: list[Record] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed / failed / skipped / error
    failures: dict[str, str] = field(default_factory=dict)  # nodeid -> short message and location of a failure
    skips: dict[str, str] = field(default_factory=dict)  # nodeid -> why it was skipped
    strict: bool = False  # --infergate-strict: an inconclusive check fails the run
    # checks that did not run or decide as asked (a warning each: the summary, the verdict's reasons, strict)
    findings: list[Finding] = field(default_factory=list)
    # tests skipped with what would make them run (not warnings: a skip is the test's own outcome), by test id
    skipped_findings: dict[str, Finding] = field(default_factory=dict)
    run_id: str = ""  # new_run_id(started) when written; "" in files before version 3
    commit: str | None = None  # git commit of the rootdir, when it is a git checkout
    # not in the file: this run's report kept beside its results file in a history folder, when read from one
    report_copy: str | None = field(default=None, compare=False, repr=False)

    @property
    def warnings(self) -> list[str]:
        """The findings as the lines every output prints."""
        return [finding.text() for finding in self.findings]

    @property
    def fingerprint(self) -> str:
        return environment_fingerprint(self.environment)

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

    def verdict(self):
        """The run's one verdict from every gate and every pytest outcome (results.run_verdict)."""
        from pytest_infergate.results.run_verdict import run_verdict

        return run_verdict(self)

    def gate_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for record in self.records:
            gate = counts.setdefault(record.kind, {status.value: 0 for status in Status})
            gate[record.status.value] += 1
        return counts

    def to_dict(self) -> dict:
        if not self.run_id:
            self.run_id = new_run_id(self.started)
        return finite_json({
            "kind": KIND, "schema_version": SCHEMA_VERSION, **self.verdict().to_dict(), "strict": self.strict,
            "run_id": self.run_id, "commit": self.commit,
            "fingerprint": self.fingerprint, "started": self.started,
            "finished": self.finished if self.finished is not None else time.time(),
            "environment": self.environment, "models": self.models, "records": [r.to_dict() for r in self.records],
            "outcomes": self.outcomes, "failures": self.failures, "skips": self.skips, "warnings": self.warnings,
            "findings": [f.to_dict() for f in self.findings],
            "skipped_findings": {test: f.to_dict() for test, f in self.skipped_findings.items()},
            "gate_counts": self.gate_counts()})

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
                   records=records, outcomes=dict(data.get("outcomes", {})),
                   # an older file has only the warnings' lines: each read whole, never parsed back
                   findings=[Finding.from_dict(f) for f in data.get("findings", data.get("warnings", []))],
                   skipped_findings={test: Finding.from_dict(f)
                                     for test, f in (data.get("skipped_findings") or {}).items()},
                   failures=dict(data.get("failures", {})), skips=dict(data.get("skips", {})),
                   strict=bool(data.get("strict", False)),
                   run_id=str(data.get("run_id") or ""), commit=data.get("commit"))


def baseline_entries(data: dict) -> dict[str, BaselineEntry]:
    """A results file (--infergate-json) as a stored baseline (issue #42: the accepted run *is* the baseline): each
    perf record with samples an entry, keyed by its measurement key, with its fingerprint, measured when the run
    started."""
    run = RunResults.from_dict(data)
    return {record.test: BaselineEntry(record.fingerprint, record.measurement, run.started)
            for record in run.perf if record.fingerprint and any(record.measurement.samples.values())}
