"""PerfOutcome: what one perf gate decided (budgets broken, verdicts against its reference, why a check could not
decide), the one record every route of the gate returns and every output reads (results.records.PerfRecord holds
it, written to JSON and read back)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.budget import Violation
from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.status import Status


class Route(str, enum.Enum):
    """What a candidate is compared with (perf.gate: a strategy each)."""

    BUDGET = "budget"  # nothing: the absolute budgets decide alone
    STORED = "stored"  # a baseline an earlier run saved, or run A's record (`infergate compare`, the history)
    ENVIRONMENT = "environment"  # the same workload in another Python environment, interleaved
    IN_PROCESS = "in-process"  # another model, precision or engine config in this process, interleaved
    ENDPOINT = "endpoint"  # a second server, interleaved

    def __str__(self) -> str:
        return self.value

    @property
    def interleaved(self) -> bool:
        """Both sides measured in alternating rounds: their per-round ratios cancel the machine's drift."""
        return self in (Route.ENVIRONMENT, Route.IN_PROCESS, Route.ENDPOINT)


@dataclass
class PerfOutcome:
    violations: list[Violation] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remeasured: int = 0
    strict: bool = False
    route: str = "budget"  # Route: what the candidate was compared with
    # the baseline's machine differs (timings not comparable: those verdicts are inconclusive), and what under
    # test changed since the baseline (compared, and named in every message)
    machine_mismatch: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    # the baseline is of another model (its name, architecture or served model): said in the run's verdict
    model_change: str = ""
    # a relative check was asked for (max_regression) but could not run; a warning, a failure under strict
    relative_check_missing: str = ""
    baseline: Measurement | None = None  # what the candidate was compared with (A of an A/B run); not written
    baseline_provenance: str = ""  # a stored baseline's repetitions, when and where it was recorded
    confirmed: int = 0  # repetitions of the fresh block a failure against a stored baseline was re-measured with

    @property
    def status(self) -> Status:
        checks = [v.status for v in self.violations] + [v.status for v in self.verdicts]
        if Status.FAIL in checks:
            return Status.FAIL
        if self.strict and self.relative_check_missing:
            return Status.FAIL
        if Status.INCONCLUSIVE in checks:
            return Status.FAIL if self.strict else Status.INCONCLUSIVE
        return Status.PASS

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL

    def message(self) -> str:
        lines = []
        if self.violations:
            undecided = sum(1 for v in self.violations if v.undecided)
            lines.append(f"{len(self.violations)} budget(s) exceeded"
                         + (f" ({undecided} inconclusive: the runner was busy)" if undecided else "") + ":")
            lines += ["  " + v.describe() for v in self.violations]
        bad = [v for v in self.verdicts if v.status != Status.PASS]
        if bad:
            lines.append("regression against the baseline"
                         + (f" ({self.baseline_provenance})" if self.baseline_provenance else "") + ":")
            # against a stored baseline, what changed since it was saved (an A/B run names its sides elsewhere)
            what = (", ".join(self.changes) if self.changes else "nothing under test changed") + ": " \
                if self.baseline_provenance else ""
            lines += [f"  {what}{v.headline()}" for v in bad]
            lines += ["    " + v.describe() for v in bad]
            if self.remeasured:
                lines.append(f"  (re-measured {self.remeasured} more time(s) before deciding)")
            if self.confirmed:
                lines.append(f"  (a failure was decided again after a fresh block of {self.confirmed} repetitions)")
            # undecided by the noise alone (a verdict with a note says its own reason: a busy runner, another machine)
            undecided = [v for v in bad if v.status == Status.INCONCLUSIVE and not v.note]
            if undecided:
                spread = max((v.high - v.low) / 2 / v.ratio for v in undecided)
                lines.append(f"  inconclusive: the 95% interval spans about ±{spread:.0%} of the ratio, wider than "
                             f"the threshold allows; on this machine at this many repetitions a max_regression "
                             f"below about {spread:.2f} cannot be confirmed either way — take more repetitions "
                             "(repeats=), gate with infergate_bench.ab() on a shared machine, or set a "
                             "max_regression the noise allows")
        if self.machine_mismatch:
            lines.append("the baseline was measured on another machine: " + ", ".join(self.machine_mismatch))
        if self.relative_check_missing and self.strict:
            lines.append(f"relative check not run (a failure under --infergate-strict): {self.relative_check_missing}")
        lines += self.notes
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The decision as results JSON keeps it (flat in a perf record, as schema 4 wrote it)."""
        return {"status": self.status.value, "strict": self.strict, "route": self.route,
                "violations": [v.to_dict() for v in self.violations],
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": list(self.notes),
                "machine_mismatch": list(self.machine_mismatch), "changes": list(self.changes),
                "model_change": self.model_change,
                "remeasured": self.remeasured, "confirmed": self.confirmed,
                "relative_check_missing": self.relative_check_missing,
                "baseline_provenance": self.baseline_provenance}

    @classmethod
    def from_dict(cls, data: dict) -> PerfOutcome:
        outcome = cls(violations=[Violation.from_dict(v) for v in data.get("violations", [])],
                      verdicts=[Verdict.from_dict(v) for v in data.get("verdicts", [])],
                      notes=list(data.get("notes", [])), remeasured=int(data.get("remeasured", 0)),
                      strict=bool(data.get("strict", False)), route=str(data.get("route") or _route_of(data)),
                      machine_mismatch=list(data.get("machine_mismatch", data.get("fingerprint_mismatch", []))),
                      changes=list(data.get("changes", [])), model_change=str(data.get("model_change") or ""),
                      relative_check_missing=str(data.get("relative_check_missing") or ""),
                      baseline_provenance=str(data.get("baseline_provenance") or ""),
                      confirmed=int(data.get("confirmed", 0)))
        # results written before `strict` was kept: a recorded failure the checks alone do not make was strict's
        if "strict" not in data and data.get("status") == Status.FAIL and outcome.status != Status.FAIL:
            outcome.strict = True
        return outcome


def _route_of(data: dict) -> str:
    """The route of a record written before it was kept, from what the record says of its baseline (an old A/B
    record does not say which side A was: a server's record was against a second endpoint, any other in-process)."""
    if data.get("baseline_provenance"):
        return "stored"
    if any(v.get("paired") for v in data.get("verdicts", [])):
        return "endpoint" if data.get("backend") == "endpoint" else "in-process"
    return "budget"
