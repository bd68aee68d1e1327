"""The verdict of one gate: every gate (perf, quality, golden) ends in one of these."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # the data could not decide; a failure under --infergate-strict

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of_interval(cls, low: float, high: float, threshold: float) -> Status:
        """A slowdown ratio's interval against its threshold: fail when it lies wholly above, pass when wholly at
        or below, inconclusive when it straddles it (more samples would decide)."""
        return cls.FAIL if low > threshold else cls.PASS if high <= threshold else cls.INCONCLUSIVE

    @classmethod
    def worst(cls, statuses) -> Status:
        """fail over inconclusive over pass (an empty list passes)."""
        statuses = set(statuses)
        for status in (cls.FAIL, cls.INCONCLUSIVE):
            if status in statuses:
                return status
        return cls.PASS
