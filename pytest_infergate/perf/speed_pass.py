"""A stored comparison at the save's speed of the engine's own thread (perf.thread_speed's probe, read before and
after each repetition): each side's least-disturbed cost over its least-disturbed probe reading, the repetitions
resampled with their probes. It decides a pass that the drift between two processes left undecided as measured; it
never makes a failure. Where the thread's speed moved between the two, a decided verdict must hold at the save's
speed too: a save on a host that slowed its process makes a later run read fast (and would let a regression of that
size through as measured), a run on a host that slowed its process reads slow. Why it is trusted that far, with the
measurements: docs/explanation/perf-gates.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.measurement import busy_share
from pytest_infergate.perf.sides import CostRatio, Side, StoredVerdict
from pytest_infergate.stats import bootstrap_ratio_ci, least_disturbed
from pytest_infergate.status import Status

# The most the thread may have run slower now than at the save for the normalization to stand: the probe read up to
# ×1.13 apart over ten quiet fresh processes, ×1.34 beside a co-tenant (docs/measurements.md), and what else slows
# the run's own thread (a tracer a dependency installs) would be normalized away within this move. Where the thread
# ran *faster* now there is no such limit: the normalization then only raises the ratio (the baseline's costs are
# scaled down by its slower thread), so it can confirm a pass as measured, never make one — which is what a save on a
# host that slowed that process (beside a co-tenant its probe read ×1.5–1.6 slower, docs/measurements.md) needs
# before the runs compared with it can pass.
MAX_SPEED_MOVE = 1.25
# The normalized figure of unchanged code still varies between fresh processes (tokens/s × probe: c.v. 3%, quiet and
# beside a co-tenant, docs/measurements.md), and the interval of one pair of processes does not hold that: a pass at
# the save's thread speed must lie within the threshold by this factor as well, as a failure against a stored
# baseline must lie beyond it by the runs' drift (perf.stored.RUN_DRIFT).
SPEED_RESIDUAL = 1.03
# The thread's speed moved between the save and the run by more than this (the probe's own spread between quiet
# processes, ×1.13 at most over ten): a decided verdict must hold at the save's speed too (held_to_save_speed).
SLOWER_SAVE = 1.08


@dataclass(frozen=True)
class SpeedNormalized:
    """Candidate/baseline cost ratio at the baseline's thread speed, with its bootstrap interval."""

    ratio: float
    low: float
    high: float
    speed_move: float  # the thread's probe now over at the save (1.1: the thread ran 10% slower now)

    def passes(self, threshold: float) -> bool:
        return self.high <= threshold / SPEED_RESIDUAL

    def may_pass(self, threshold: float) -> bool:
        """More repetitions could still pass it: its interval reaches the bar `passes` holds it to."""
        return self.low <= threshold / SPEED_RESIDUAL

    def describe(self, interval: bool = True) -> str:
        """The move and the comparison at the save's speed; without its `interval` where the verdict's own sentence
        states it (a pass at the save's speed), so that each interval is said once."""
        way = "slower" if self.speed_move >= 1 else "faster"
        move = self.speed_move if self.speed_move >= 1 else 1 / self.speed_move
        at_speed = f" ×{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}]" if interval else ""
        return (f"the engine's thread ran ×{move:.3f} {way} than at the save (its speed probe, read before and after "
                f"each repetition); at the save's speed{at_speed}")

    def sentence(self, threshold: float, interval: bool = True) -> str:
        within = "within" if self.passes(threshold) else "not within"
        return (f"{self.describe(interval)}{',' if interval else ''} {within} ×{threshold / SPEED_RESIDUAL:.3f} (the "
                f"threshold ÷ the probe's own spread ×{SPEED_RESIDUAL})")


def _at_probe_speed(pairs: list[tuple[float, float]]) -> float:
    return least_disturbed([cost for cost, _ in pairs]) / least_disturbed([probe for _, probe in pairs])


def speed_move(candidate_costs: list[float], candidate_probe: list[float], baseline_costs: list[float],
               baseline_probe: list[float]) -> float | None:
    """How much slower the engine's thread ran now than at the save (its least-disturbed probe readings); None where
    a side has no probe for each repetition."""
    if len(candidate_probe) != len(candidate_costs) or len(baseline_probe) != len(baseline_costs) \
            or min(candidate_probe + baseline_probe, default=0.0) <= 0:
        return None
    return least_disturbed(candidate_probe) / least_disturbed(baseline_probe)


def speed_normalized(candidate_costs: list[float], candidate_probe: list[float], baseline_costs: list[float],
                     baseline_probe: list[float]) -> SpeedNormalized | None:
    """The comparison at the save's thread speed; None where a side has no probe for each repetition."""
    move = speed_move(candidate_costs, candidate_probe, baseline_costs, baseline_probe)
    return None if move is None else _at_save_speed(candidate_costs, candidate_probe, baseline_costs, baseline_probe,
                                                    move)


def _at_save_speed(candidate_costs: list[float], candidate_probe: list[float], baseline_costs: list[float],
                   baseline_probe: list[float], move: float) -> SpeedNormalized:
    """The bootstrap of speed_normalized, the repetitions resampled with their probes (`move`: speed_move's)."""
    point, low, high = bootstrap_ratio_ci(list(zip(candidate_costs, candidate_probe)),
                                          list(zip(baseline_costs, baseline_probe)), _at_probe_speed)
    return SpeedNormalized(point, low, high, move)


def normalized_pass(candidate_costs: list[float], candidate_probe: list[float], baseline_costs: list[float],
                    baseline_probe: list[float], threshold: float) -> SpeedNormalized | None:
    """The comparison at the save's thread speed where its whole interval lies within `threshold` / SPEED_RESIDUAL;
    None where a side has no probe for each repetition, the thread ran slower now by more than MAX_SPEED_MOVE, or
    the interval does not pass."""
    at_speed = speed_normalized(candidate_costs, candidate_probe, baseline_costs, baseline_probe)
    if at_speed is None or at_speed.speed_move > MAX_SPEED_MOVE or not at_speed.passes(threshold):
        return None
    return at_speed


def _passed_at_speed(verdict: StoredVerdict, at_speed: SpeedNormalized, threshold: float, evidence: str,
                     load_corrected: bool) -> StoredVerdict:
    measured = verdict.measured
    before = evidence or f"×{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}] as measured"
    # the ratio is the normalized one; the two figures stay each side's own (the candidate's as it was measured)
    return StoredVerdict(Status.PASS, CostRatio(at_speed.ratio, at_speed.low, at_speed.high, measured.candidate_cost,
                                                 measured.baseline_cost, "at the save's thread speed"),
                         verdict.machine, f"{before}; {at_speed.sentence(threshold, interval=False)}",
                         load_corrected=load_corrected,
                         at_thread_speed=True)


def at_thread_speed(verdict: StoredVerdict, candidate_costs: list[float], baseline_costs: list[float],
                    candidate: Side, baseline: Side, threshold: float, steady_evidence: str = "") -> StoredVerdict:
    """`verdict`, or a pass where the costs (as measured, or load-corrected beside a steady co-tenant) pass at the
    save's thread speed (normalized_pass); the pass rests on that comparison, and says both."""
    at_speed = normalized_pass(candidate_costs, candidate.thread_probe, baseline_costs, baseline.thread_probe,
                               threshold)
    if at_speed is None:
        return verdict
    return _passed_at_speed(verdict, at_speed, threshold, steady_evidence, bool(steady_evidence))


def held_to_save_speed(verdict: StoredVerdict, candidate_costs: list[float], baseline_costs: list[float],
                       candidate: Side, baseline: Side, threshold: float, fail_bound: float,
                       evidence: str = "") -> StoredVerdict:
    """A decided verdict where the thread's speed moved between the save and the run by more than SLOWER_SAVE (the
    probe's own spread), held to the save's thread speed. A pass where the save's thread ran slower stands only at
    that speed (said so), else it is inconclusive, blaming the save: the baseline's figures are slower than the code
    it measured, and a regression as large would pass against them as measured. A failure where this run's thread
    ran slower stands only where it also lies beyond `fail_bound` at the save's speed, else it is inconclusive: the
    host slowed this run's process (beside a co-tenant a process read ×1.5 slower, kernel and all, while its thread's
    probe followed it, docs/measurements.md). Where neither side's kernel saw the runner busy (no co-tenant's load to
    take out) and the thread ran slower now by no more than MAX_SPEED_MOVE, such a failure passes where it passes at
    the save's speed as at_thread_speed passes an undecided one: the host ran this whole process slow, and the code
    is no slower at the thread's speed. A slowdown of the thread itself beyond that move (a tracer a dependency
    installs) is left undecided, never passed."""
    if verdict.at_thread_speed or verdict.status == Status.INCONCLUSIVE:
        return verdict
    move = speed_move(candidate_costs, candidate.thread_probe, baseline_costs, baseline.thread_probe)
    # only a pass against a slower save, or a failure of a slower run, is held (the bootstrap runs for those alone)
    save_slower, run_slower = move is not None and move * SLOWER_SAVE < 1.0, move is not None and move > SLOWER_SAVE
    if not (save_slower if verdict.status == Status.PASS else run_slower):
        return verdict
    at_speed = _at_save_speed(candidate_costs, candidate.thread_probe, baseline_costs, baseline.thread_probe, move)
    if verdict.status == Status.PASS:
        if at_speed.passes(threshold):
            return _passed_at_speed(verdict, at_speed, threshold, evidence, verdict.load_corrected)
        return StoredVerdict(Status.INCONCLUSIVE, verdict.measured, verdict.machine,
                             f"{at_speed.sentence(threshold)}: the host slowed the save's process, so its figures are "
                             "no yardstick", baseline_at_fault=True,
                             load_corrected=verdict.load_corrected,
                             narrowable=at_speed.may_pass(threshold))
    if at_speed.low > fail_bound:
        return verdict
    quiet = busy_share(candidate.others) is None and busy_share(baseline.others) is None
    if quiet and move <= MAX_SPEED_MOVE and at_speed.passes(threshold):
        return _passed_at_speed(verdict, at_speed, threshold, evidence, verdict.load_corrected)
    return StoredVerdict(Status.INCONCLUSIVE, verdict.measured, verdict.machine,
                         f"{evidence + '; ' if evidence else ''}{at_speed.describe()}, not beyond ×{fail_bound:.2f}: "
                         "the host slowed this run's process (a busy runner), so the slowdown cannot be told from it",
                         load_corrected=verdict.load_corrected)
