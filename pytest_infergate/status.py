"""The vocabulary of verdicts: the Status every gate (perf, quality, golden, batch invariance) ends in, and the
Finding that says a check did not run or decide as asked."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # the data could not decide; a failure under --infergate-strict

    def __str__(self) -> str:
        return self.value

    @classmethod
    def worst(cls, statuses) -> Status:
        """fail over inconclusive over pass (an empty list passes)."""
        statuses = set(statuses)
        for status in (cls.FAIL, cls.INCONCLUSIVE):
            if status in statuses:
                return status
        return cls.PASS


# What kind of check a Finding is about: the not-run table's first column (results.summary.not_run)
GOLDEN_CHECK = "golden regression"
RELATIVE_CHECK = "relative perf check"
BASELINE_CHECK = "baseline"
BUDGET_KEY_CHECK = "budget key"
INI_SCOPE_CHECK = "ini scope"
ENGINE_CHECK = "engine experiment"
ENDPOINT_CHECK = "endpoint check"
SPEED_EXPERIMENT_CHECK = "speed experiment"
OTHER_CHECK = "check"  # a warning read from a results file written before findings were typed


@dataclass(frozen=True)
class Finding:
    """A check that did not run, or did not decide, as asked: made where that is known (the gate, the fixture, the
    session), carried unchanged to the terminal, the report's not-run table, the results JSON, JUnit and the
    history. `fix` says what makes it run; `text()` is the one line every output prints."""

    check: str
    test: str  # the test id, "" for the whole run
    why: str
    fix: str = ""

    def text(self) -> str:
        return f"{self.test + ': ' if self.test else ''}{self.reason()}"

    def reason(self) -> str:
        """Why, and what to do: the line without the test (a skip's reason, said of its own test)."""
        return f"{self.why}{'; ' + self.fix if self.fix else ''}"

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "test": self.test, "why": self.why, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: dict | str) -> Finding:
        """A finding as written, or an older file's plain warning line (kept whole: its parts were never typed)."""
        if isinstance(data, str):
            return cls(OTHER_CHECK, "", data)
        return cls(str(data.get("check", OTHER_CHECK)), str(data.get("test", "")), str(data.get("why", "")),
                   str(data.get("fix", "")))
