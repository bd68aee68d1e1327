"""A stored comparison normalized by the engine thread's own speed (perf.thread_speed): each side's least-disturbed
cost over its least-disturbed probe reading, the repetitions resampled with their probes. It decides a pass that
the drift between two processes left undecided as measured; it never makes a failure and never overrules a pass
or a failure as measured. Why it is trusted that far, with the measurements: docs/explanation/perf-gates.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.stats import bootstrap_ratio_ci, least_disturbed

# The most the thread's speed may have moved between the save and the run for the normalization to stand: the
# largest move between fresh processes seen with nothing of ours changed (docs/measurements.md). A larger move is
# not the host's drift, and a normalization by it would lean on the probe more than it was ever checked.
MAX_SPEED_MOVE = 1.3


@dataclass(frozen=True)
class SpeedNormalized:
    """Candidate/baseline cost ratio at the baseline's thread speed, with its bootstrap interval."""

    ratio: float
    low: float
    high: float
    speed_move: float  # the thread's probe now over at the save (1.1: the thread ran 10% slower now)

    def sentence(self, threshold: float) -> str:
        way = "slower" if self.speed_move >= 1 else "faster"
        move = self.speed_move if self.speed_move >= 1 else 1 / self.speed_move
        return (f"the engine's thread ran ×{move:.3f} {way} than at the save (its speed probe, read before and after "
                f"each repetition); at the save's speed ×{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}], "
                f"within ×{threshold:.2f}")


def _at_probe_speed(pairs: list[tuple[float, float]]) -> float:
    return least_disturbed([cost for cost, _ in pairs]) / least_disturbed([probe for _, probe in pairs])


def normalized_pass(candidate_costs: list[float], candidate_probe: list[float], baseline_costs: list[float],
                    baseline_probe: list[float], threshold: float) -> SpeedNormalized | None:
    """The comparison at the save's thread speed where its whole interval lies within `threshold`; None where a
    side has no probe for each repetition, the speed moved beyond MAX_SPEED_MOVE, or the interval does not pass."""
    if len(candidate_probe) != len(candidate_costs) or len(baseline_probe) != len(baseline_costs) \
            or min(candidate_probe + baseline_probe, default=0.0) <= 0:
        return None
    move = least_disturbed(candidate_probe) / least_disturbed(baseline_probe)
    if not 1 / MAX_SPEED_MOVE <= move <= MAX_SPEED_MOVE:
        return None
    point, low, high = bootstrap_ratio_ci(list(zip(candidate_costs, candidate_probe)),
                                          list(zip(baseline_costs, baseline_probe)), _at_probe_speed)
    return SpeedNormalized(point, low, high, move) if high <= threshold else None
