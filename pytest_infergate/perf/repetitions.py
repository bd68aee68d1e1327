"""How many repetitions a measurement takes where a stored baseline is its yardstick (a save, and a run compared with
one): at least LEAST_REPETITIONS, then more until each gated figure's side resolves a third of max_regression, at
most MOST_REPETITIONS; and whether it takes the calibration probe. The comparison itself: perf.stored."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_infergate import context
from pytest_infergate.context import TestContext
from pytest_infergate.measurement import Measurement, scales_with_speed
from pytest_infergate.perf.outcome import Budget
from pytest_infergate.perf.stored import side
from pytest_infergate.stats import least_disturbed, paired_bootstrap_ci, resolution

# How many repetitions a side of a stored comparison takes (a save, and the run compared with it): at least
# LEAST_REPETITIONS, then more until the side's own least-disturbed summary resolves a change of SETTLED_SHARE of
# max_regression (its 95% interval as a factor), at most MOST_REPETITIONS. Two such sides give the comparison an
# interval about half the threshold wide (√2/3 of it), so an unchanged run passes and a ×1.25 one fails at 10%.
LEAST_REPETITIONS, MOST_REPETITIONS = 5, 12
SETTLED_SHARE = 1 / 3
# ...and it measures for at least --infergate-min-time seconds in all (default 6), however short a repetition (at
# most CAP_REPETITIONS): these VMs run the thread up to ×2 slower in spells of 0.1–7 s that a guest cannot see
# (docs/measurements.md, "the host's slow spells"); repetitions spread over several seconds let the least-disturbed
# summary and the thread's speed probe find the host's full speed on both sides, where five repetitions of a fast
# workload fit inside one spell.
CAP_REPETITIONS = 40


def side_resolution(measurement: Measurement, metric: str, pct: float | None) -> float:
    """The smallest change this side alone resolves, as a factor: √(high/low) of the bootstrap interval of its
    least-disturbed summary of `metric` (inf: too few repetitions to summarize)."""
    one = side(measurement, metric, pct, probed=False)
    if one is None:
        return math.inf
    _, low, high = paired_bootstrap_ci(one.costs, least_disturbed, resamples=500)
    return resolution(low, high)


@dataclass(frozen=True)
class RepetitionPlan:
    """The repetitions of a measurement that saves a baseline or is compared with one: at least `least`, then
    more while a gated metric's side is wider than `target` (side_resolution), at most `most` — and for at least
    `least_seconds` in all (at most `cap` repetitions)."""

    least: int
    most: int
    max_regression: float
    metrics: tuple[tuple[str, float | None], ...]  # (metric, the percentile its budget gates)
    least_seconds: float = 0.0

    @classmethod
    def of(cls, repeats: int, max_regression: float | None, metrics: list[tuple[str, float | None]],
           least_seconds: float = 0.0) -> RepetitionPlan:
        least = max(repeats, LEAST_REPETITIONS)
        return cls(least, max(least, MOST_REPETITIONS), max_regression or 0.10,
                   tuple((metric, pct) for metric, pct in metrics if scales_with_speed(metric)), least_seconds)

    @property
    def cap(self) -> int:
        """The most repetitions in all: CAP_REPETITIONS where the time floor may ask for more than `most`."""
        return max(self.most, CAP_REPETITIONS) if self.least_seconds > 0 else self.most

    @property
    def target(self) -> float:
        return 1.0 + self.max_regression * SETTLED_SHARE

    def widest(self, measurement: Measurement) -> float:
        """The widest gated metric's side_resolution (1.0 where nothing time-like is measured)."""
        return max((side_resolution(measurement, metric, pct) for metric, pct in self.metrics
                    if measurement.samples.get(metric)), default=1.0)

    def settled(self, measurement: Measurement) -> bool:
        """Whether the spread asks for no more repetitions (the time floor is the measuring loop's: min_time_s)."""
        return measurement.repetitions >= self.least and (measurement.repetitions >= self.most
                                                          or self.widest(measurement) <= self.target)

    def bounds(self, repetition_s: float, done: int = 0, elapsed_s: float = 0.0) -> tuple[int, int]:
        """The least and most repetitions the plan expects at `repetition_s` a repetition, `done` of them measured
        in `elapsed_s` (the time floor asks for more where later repetitions run faster)."""
        left_s = self.least_seconds - elapsed_s
        if left_s <= 0:  # the time floor is met (or there is none): the spread's bounds alone
            return self.least, self.most
        timed = done + math.ceil(left_s / repetition_s) if repetition_s > 0 else self.cap
        least = max(self.least, min(self.cap, timed))
        return least, max(least, self.most)

    def describe(self, repetition_s: float) -> str:
        """What the plan will cost at `repetition_s` a repetition."""
        least, most = self.bounds(repetition_s)
        count = f"{least}–{most}" if most > least else str(least)
        shortest, longest = f"{least * repetition_s:.0f}", f"{most * repetition_s:.0f}"
        cost = f"{shortest}–{longest} s" if longest != shortest else f"{shortest} s"  # not "7–7 s"
        cost = "under 1 s" if most * repetition_s < 0.5 else cost
        floor = f", {self.least_seconds:g} s at least" if self.least_seconds else ""
        return (f"{count} repetitions of about {repetition_s:.1f} s (until each gated figure's spread resolves "
                f"×{self.target:.3f}{floor}): {cost}")


def uses_stored_baseline(ctx: TestContext) -> bool:
    """Whether this run saves (--infergate-save-baseline) or compares with (--infergate-baseline) a stored one."""
    return ctx.options.save_baseline is not None or ctx.baseline is not None


def probe_wanted(ctx: TestContext) -> bool:
    """Whether this run's measurements take the calibration probe: a save does (a later run reads it), a
    comparison does where the baseline has it. Against an accepted run measured without it (a results file, an
    older baseline), measuring with it would measure differently: the probe's sampler takes a share of the cores,
    which a workload of millisecond steps feels (docs/measurements.md)."""
    if ctx.options.save_baseline is not None:
        return True
    return ctx.baseline is not None and any(entry.measurement.probe for entry in ctx.baseline.values())


def repetition_plan(budget: Budget, ctx: TestContext, repeats: int, min_time_s: float = 0.0) -> RepetitionPlan | None:
    """How many repetitions a measurement gated by `budget` takes when this run saves or compares a stored
    baseline: a stored baseline is the yardstick of every later run and the run compared with it is resampled
    against it, so each side repeats until its own spread is tight enough for the budget's max_regression
    (RepetitionPlan), for --infergate-min-time or the call's `min_time_s`, the longer. None: as the test asked
    (budgets alone)."""
    if not uses_stored_baseline(ctx):
        return None
    return RepetitionPlan.of(repeats, budget.max_regression,
                             [(metric, budget.percentile_of(metric)) for metric in budget.relative_metrics()],
                             max(ctx.options.min_time, min_time_s))


def until_settled(plan: RepetitionPlan | None, progress: context.Steps) -> Callable[[Measurement], bool] | None:
    """The measuring loop's stop rule for `plan`. It states what the plan will cost once a repetition is timed: the
    second (the first runs cold: a new user's plan read "about 1.0 s" a repetition, 0.45 s measured, and the time
    floor then asked for more than it said), or the first where that is already long work, named by `progress` (the
    loop's line on the terminal), which counts against the plan's bounds, re-estimated after every repetition."""
    if plan is None:
        return None
    started = last = time.monotonic()
    stated = False

    def settled(measurement: Measurement) -> bool:
        nonlocal last, stated
        now = time.monotonic()
        repetition_s, last = now - last, now
        if not stated and (measurement.repetitions >= 2 or repetition_s >= context.EVERY_S):
            context.report(f"{progress.subject}: {plan.describe(repetition_s)}")
            stated = True
        progress.replan(*plan.bounds(repetition_s, measurement.repetitions, now - started))
        return plan.settled(measurement)

    return settled
