"""The structured results of one run: what every infergate test measured and decided.

Tests append plain-JSON records; under pytest-xdist they travel from workers to the controller inside the
test report, so one file covers the whole run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
RESULT_PROPERTY = "infergate_result"


@dataclass
class RunResults:
    started: float = field(default_factory=time.time)
    environment: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict] = field(default_factory=dict)  # precision -> load record
    records: list[dict] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed / failed / skipped / error

    def add(self, record: dict) -> None:
        self.records.append(record)

    def by_kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind]

    def gate_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for record in self.records:
            gate = counts.setdefault(record.get("kind", "other"), {"pass": 0, "fail": 0, "inconclusive": 0})
            status = record.get("status", "pass")
            gate[status] = gate.get(status, 0) + 1
        return counts

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "started": self.started, "finished": time.time(),
                "environment": self.environment, "models": self.models, "records": self.records,
                "outcomes": self.outcomes, "gate_counts": self.gate_counts()}

    @classmethod
    def from_dict(cls, data: dict) -> "RunResults":
        from pytest_infergate.errors import InfergateError

        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
            raise InfergateError(f"results file has schema version {found!r}; this pytest-infergate reads "
                                 f"{SCHEMA_VERSION}")
        return cls(started=data.get("started", 0.0), environment=data.get("environment", {}),
                   models=data.get("models", {}), records=list(data.get("records", [])),
                   outcomes=dict(data.get("outcomes", {})))
