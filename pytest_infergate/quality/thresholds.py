"""One threshold of a quality policy against one aggregate of a comparison with the reference, decided on the
aggregate's 95% interval over the samples (quality.metrics.aggregate): FAIL when the whole interval lies beyond the
threshold, PASS when it lies within, INCONCLUSIVE when it straddles it, saying roughly how many samples would decide.
A point estimate alone would fail an int8 whose top-1 reads 0.89 on 16 samples, though 0.89 +- 0.03 says nothing
either way, and pass one that reads 0.91 as surely as one that reads 0.99.

Where an aggregate has no interval (a comparison of one sample; p99 KL, a percentile over tokens) the point decides,
and the check says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_infergate.status import Status

FEWEST_FOR_INTERVAL = 2  # a bootstrap over one sample (or chunk) is that sample: no interval


@dataclass(frozen=True)
class ThresholdCheck:
    """`figure` (an aggregate of the summary) against `threshold`, a lower bound (`direction` "min") or an upper
    one ("max"), set by `source` (which marker, ini scope or default)."""

    key: str  # the policy key: "min_top1"
    figure: str  # the aggregate it bounds: "top1"
    direction: str  # "min" or "max"
    threshold: float
    source: str
    point: float | None  # None: not measured
    low: float | None = None  # the 95% interval; None where the aggregate has none
    high: float | None = None
    samples: int = 0  # how many units the interval resamples (golden samples; a corpus's chunks)
    no_interval: str = ""  # why the point decides ("one sample", "a percentile over tokens")
    unit: str = "sample"  # what the interval resamples, as the advice names it
    more: str = "add golden samples or raise `limit=`"  # what gives the interval more of them

    @classmethod
    def of(cls, summary: dict[str, Any], key: str, figure: str, direction: str, threshold: float,
           source: str, unit: str = "sample", more: str = "add golden samples or raise `limit=`") -> ThresholdCheck:
        point = summary.get(figure)
        samples = int(summary.get(unit + "s", 0) or 0)
        named = {"unit": unit, "more": more}
        if not isinstance(point, (int, float)):  # absent, or undefined (None in a file read back)
            return cls(key, figure, direction, threshold, source, None, samples=samples, **named)
        ci = summary.get(figure + "_ci")
        if samples == 1:
            return cls(key, figure, direction, threshold, source, point, samples=samples, no_interval=f"one {unit}",
                       **named)
        if not ci or samples < FEWEST_FOR_INTERVAL:
            return cls(key, figure, direction, threshold, source, point, samples=samples,
                       no_interval=f"{figure} has no interval", **named)
        return cls(key, figure, direction, threshold, source, point, ci[0], ci[1], samples, **named)

    @property
    def measured(self) -> bool:
        return self.point is not None

    def _beyond(self, value: float) -> bool:
        return value < self.threshold if self.direction == "min" else value > self.threshold

    @property
    def status(self) -> Status:
        if self.point is None:
            return Status.INCONCLUSIVE
        if self.low is None or self.high is None:
            return Status.FAIL if self._beyond(self.point) else Status.PASS
        if all(self._beyond(bound) for bound in (self.low, self.high)):
            return Status.FAIL
        if not any(self._beyond(bound) for bound in (self.low, self.high)):
            return Status.PASS
        return Status.INCONCLUSIVE

    def samples_needed(self) -> int | None:
        """About how many samples would put the interval on one side of the threshold: the half-width on the
        threshold's side shrinks as 1/sqrt(n), so n * (half-width / distance)^2. None when the point sits on the
        threshold (no number of samples decides) or there is no interval."""
        if self.point is None or self.low is None or self.high is None:
            return None
        distance = abs(self.point - self.threshold)
        if distance == 0:
            return None
        half = self.point - self.low if self.point >= self.threshold else self.high - self.point
        return max(self.samples + 1, math.ceil(self.samples * (half / distance) ** 2))

    def describe(self) -> str:
        """The check in one line: the figure, its interval, where it lies against the threshold, who set it."""
        bound = ">=" if self.direction == "min" else "<="
        source = f" ({self.source})" if self.source else ""  # "": said once above it (results.summary)
        if self.point is None:
            return f"{self.key}: {self.figure} was not measured{source}"
        if self.low is None or self.high is None:
            broken = self.status == Status.FAIL
            relation = ("<" if self.direction == "min" else ">") if broken else bound
            return (f"{self.key}: {self.figure} = {self.point:.4g} {relation} {self.threshold:g}{source}, decided on "
                    f"the point ({self.no_interval})")
        ci = f"{self.figure} = {self.point:.4g} (95% CI {self.low:.4g}-{self.high:.4g})"
        status = self.status
        if status == Status.FAIL:
            side = "below" if self.direction == "min" else "above"
            return f"{self.key}: {ci} lies wholly {side} {self.threshold:g}{source}"
        if status == Status.PASS:
            return f"{self.key}: {ci} lies within {bound} {self.threshold:g}{source}"
        needed = self.samples_needed()
        decides = (f"about {needed} {self.unit}s would decide ({self.samples} now): {self.more}"
                   if needed is not None else f"the figure sits on the threshold: no number of {self.unit}s decides")
        return f"{self.key}: {ci} straddles {self.threshold:g}{source}: {decides}"
