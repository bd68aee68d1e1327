"""The vocabulary of verdicts: the Status every gate (perf, quality, golden, batch invariance) ends in, and the
Finding a check says beyond its record (it did not run or decide as asked; or a note of a check that ran)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # the data could not decide; a failure under --infergate-strict

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        """How bad: fail over inconclusive over pass, the one order of statuses (`worst`, and lists said worst
        first)."""
        return _RANK[self]

    @classmethod
    def worst(cls, statuses) -> Status:
        """fail over inconclusive over pass (an empty list passes): the one rule by which checks make a status."""
        return max((cls(status) for status in statuses), key=lambda status: status.rank, default=cls.PASS)


_RANK = {Status.PASS: 0, Status.INCONCLUSIVE: 1, Status.FAIL: 2}


@dataclass
class Decision:
    """What a policy gate (quality vs the reference, golden regression, batch invariance) decided: a failure for
    each `problem`, undecided for each reason in `undecided`, else a pass; `notes` are said beside it. The shape
    every gate's record keeps (a perf gate's PerfOutcome, with its violations and verdicts, has the same status)."""

    problems: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the typed figures it rests on, where a gate decides on figures (quality.travel.TravelFigure): what reads them
    # as figures, not words (benchmarks/quality_power.py), reads them here
    figures: list = field(default_factory=list)

    @property
    def status(self) -> Status:
        return Status.worst([Status.FAIL] * len(self.problems) + [Status.INCONCLUSIVE] * len(self.undecided))


def under_strict(status: Status, strict: bool) -> Status:
    """--infergate-strict, applied here and only here (the session's test outcomes, the run's verdict): an undecided
    check fails. Gates record what their checks decided."""
    return Status.FAIL if strict and status == Status.INCONCLUSIVE else status


# What kind of check a Finding is about: the not-run table's first column (results.run.not_run)
GOLDEN_CHECK = "golden regression"
RELATIVE_CHECK = "relative perf check"
BUDGET_KEY_CHECK = "budget key"
INI_SCOPE_CHECK = "ini scope"
ENGINE_CHECK = "engine experiment"
ENDPOINT_CHECK = "endpoint check"
SPEED_EXPERIMENT_CHECK = "speed experiment"
OTHER_CHECK = "check"  # a warning read from a results file written before findings were typed
QUALITY_CHECK = "quality gate"
PERF_CHECK = "perf gate"


@dataclass(frozen=True)
class Finding:
    """What a check has to say beyond its record, made where that is known (the gate, the fixture, the session) and
    carried unchanged to every output; `text()` is the one line each prints, `fix` says what makes the check run.

    `status` None: the check did not run, or did not decide, as asked — a run-level warning (the terminal summary,
    the report's not-run table, the results JSON, JUnit, the history) that makes a passing run INCONCLUSIVE. A
    Status: said of a check that ran and decided so (a gate's own undecided verdict, a note beside a pass); its
    record already carries the decision to the verdict, so the finding is said in the terminal only."""

    check: str
    test: str  # the test id, "" for the whole run
    why: str
    fix: str = ""
    status: Status | None = None
    evidence: str = ""  # the figures it rests on ("other processes took 52% of the machine's CPU time")

    @property
    def not_run(self) -> bool:
        return self.status is None

    def text(self) -> str:
        return f"{self.test + ': ' if self.test else ''}{self.reason()}"

    def reason(self) -> str:
        """Why (on what evidence), and what to do: the line without the test (a skip's reason, of its own test)."""
        return f"{self.lead()}{'; ' + self.fix if self.fix else ''}"

    def warning(self) -> str:
        """What its test's pytest warning says: a check not run as asked is a reason of the run's verdict, said
        whole there with what to do, so the warning names it and points there; a decided check's note is whole."""
        if not self.not_run or not self.fix:
            return self.text()
        return f"{self.test + ': ' if self.test else ''}{self.lead()} (what to do: the infergate verdict below)"

    def lead(self) -> str:
        """Why, on what evidence: the reason without what to do."""
        return f"{self.why}{f' ({self.evidence})' if self.evidence else ''}"

    def to_dict(self) -> dict[str, str]:
        out = {"check": self.check, "test": self.test, "why": self.why, "fix": self.fix}
        out |= {"evidence": self.evidence} if self.evidence else {}
        return out | ({"status": self.status.value} if self.status is not None else {})

    @classmethod
    def from_dict(cls, data: dict | str) -> Finding:
        """A finding as written, or an older file's plain warning line (kept whole: its parts were never typed)."""
        if isinstance(data, str):
            return cls(OTHER_CHECK, "", data)
        status = data.get("status")
        return cls(str(data.get("check", OTHER_CHECK)), str(data.get("test", "")), str(data.get("why", "")),
                   str(data.get("fix", "")), Status(status) if status else None, str(data.get("evidence", "")))
