"""A stored comparison where the kernel saw other processes keep a side's runner busy (perf.interference): the
direct evidence of load, read before the calibration probe's indirect one. Busy now: only a pass as measured stands,
or a slowdown beyond what the load can explain; busy at the save: only a failure; busy on both sides alike (a steady
co-tenant): the load-corrected figures decide both ways; unevenly: nothing does.
"""

from __future__ import annotations

from pytest_infergate import units
from pytest_infergate.measurement import busy_share
from pytest_infergate.perf import interference
from pytest_infergate.perf.sides import CostRatio, Side, StoredVerdict
from pytest_infergate.stats import bootstrap_ratio_ci, harrell_davis, least_disturbed, resolution
from pytest_infergate.status import Status


def busy_sides(candidate: Side, baseline: Side, measured: CostRatio, status: Status, threshold: float,
               drift_bound: float) -> StoredVerdict | None:
    """The verdict where the kernel saw other processes keep either side's runner busy (perf.interference): the
    direct evidence, before the probe's indirect one. Busy now: only a pass as measured stands; busy at the save:
    only a failure; busy on both sides: nothing does. None: neither side measured busy. Its `measured` is the
    comparison as measured, its `machine` left to the caller (the calibration probe's move); `drift_bound`: what a
    failure as measured must clear between two runs of a quiet runner (perf.stored.RUN_DRIFT). An undecided one
    carries the bar a failure needs here: the load-corrected figures' where they were measured (the route a
    slowdown fails by on a busy runner), else what the load can explain as measured."""
    now, then = busy_share(candidate.others), busy_share(baseline.others)
    if now is None and then is None:
        return None
    corrected, residual = load_free_comparison(candidate, baseline), stored_residual(candidate, baseline)
    corrected_bar = threshold * residual if corrected else None
    failed = load_free_failure(candidate, corrected, threshold, residual, measured.ratio, now, then)
    if failed is not None:
        return StoredVerdict(Status.FAIL, _decided_on(corrected, measured), None, failed, load_corrected=True)
    if now is not None and then is None:
        if status == Status.PASS or (status == Status.FAIL and measured.low > interference.explainable_slowdown(now)):
            return StoredVerdict(status, measured, None, "")  # passed despite the load, or beyond what it explains
        as_measured_bar = max(interference.explainable_slowdown(now), drift_bound)
        return StoredVerdict(Status.INCONCLUSIVE, measured, None,
                             f"the runner was busy: {interference.describe(now)} during this run, so a slowdown as "
                             f"measured (×{measured.ratio:.3f}) cannot be told from the machine's load"
                             f"{_not_beyond(candidate, corrected, threshold, residual)}",
                             fail_bar=corrected_bar or as_measured_bar, fail_bar_load_corrected=bool(corrected_bar))
    if then is not None and now is None:
        if status == Status.FAIL:
            return StoredVerdict(status, measured, None, "")
        return StoredVerdict(Status.INCONCLUSIVE, measured, None,
                             f"the baseline was saved on a busy runner: {interference.describe(then)} while it was "
                             f"measured, so what its figures took from that load may hide a slowdown in this run's "
                             f"ratio (×{measured.ratio:.3f})",
                             baseline_at_fault=True, fail_bar=drift_bound)
    steady = steady_co_tenant(candidate, baseline, measured, threshold, now, then, corrected)
    if steady is not None:
        return steady
    return StoredVerdict(Status.INCONCLUSIVE, measured, None,
                         f"the runner was busy on both sides, unevenly: {interference.describe(now)} during this run "
                         f"and {interference.taken(then)} while the baseline was saved"
                         f"{_not_beyond(candidate, corrected, threshold, residual)}",
                         baseline_at_fault=True, fail_bar=corrected_bar, fail_bar_load_corrected=bool(corrected_bar))


# Two busy sides had "the same" co-tenant when the others' shares of the machine differ by at most SAME_LOAD_SHARE
# and our threads' load-free shares (the share of wall time they would have needed alone) by at most a factor
# SAME_LOAD_FACTOR: one busy loop beside the run at the save and at the compare, as a steady neighbour on a shared
# runner keeps.
SAME_LOAD_SHARE = 0.15
SAME_LOAD_FACTOR = 1.25


def steady_co_tenant(candidate: Side, baseline: Side, measured: CostRatio, threshold: float, now: float,
                     then: float, corrected: tuple[float, float, float] | None) -> StoredVerdict | None:
    """Both sides ran beside the same co-tenant (SAME_LOAD_SHARE, SAME_LOAD_FACTOR): the load hit them alike, so
    their load-free costs (Side.load_free_costs) compare like a quiet pair's and decide both ways — a pass where the
    whole interval lies within the threshold, a failure beyond the threshold times the correction's per-repetition
    error (interference.load_free_residual: a steady load stretches both sides' latencies alike, so a team's or one
    thread's error applies, not the uneven-load margin). `corrected`: load_free_comparison's. None: the loads
    differ, or were not measured alike."""
    if corrected is None:
        return None
    free_now, free_then = harrell_davis(candidate.load_free, 0.5), harrell_davis(baseline.load_free, 0.5)
    if abs(now - then) > SAME_LOAD_SHARE or max(free_now, free_then) > SAME_LOAD_FACTOR * min(free_now, free_then):
        return None
    point, low, high = corrected
    residual = preempted_margin(candidate, interference.load_free_residual(candidate, baseline, baseline_quiet=True))
    how = (f"{interference.load_corrected(candidate.load_free_by)}, both sides beside the same co-tenant "
           f"({interference.taken(now)} now, {interference.taken(then)} at the save; our threads had "
           f"{free_now:.0%} and {free_then:.0%} of the CPU they needed): ×{point:.3f} [{low:.3f}, {high:.3f}]")
    as_measured = f" (×{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}] as measured)"
    # a pass or a failure carries the load-corrected interval (_decided_on), whose noise its details say: not again
    if high <= threshold:
        return StoredVerdict(Status.PASS, _decided_on(corrected, measured), None, how + as_measured,
                             load_corrected=True)
    if low > threshold * residual:
        return StoredVerdict(Status.FAIL, _decided_on(corrected, measured), None,
                             f"{how}{as_measured}, beyond {_corrected_bar(candidate, threshold, residual)}",
                             load_corrected=True)
    how += f", noise {units.noise(resolution(low, high))}"  # the verdict carries the measured interval's
    return StoredVerdict(Status.INCONCLUSIVE, measured, None, f"{how}: not beyond "
                         f"{_corrected_bar(candidate, threshold, residual)}, nor within the limit "
                         f"{units.ratio(threshold)}", steady=how,
                         fail_bar=threshold * residual, fail_bar_load_corrected=True)


def _decided_on(corrected: tuple[float, float, float], measured: CostRatio) -> CostRatio:
    """A verdict decided on the load-corrected comparison carries its figures, so that its one sentence shows the
    interval that decided (a new user read "×1.09 [1.02–1.11], limit ×1.1: PASS", passed on [1.010, 1.087]); the two
    sides' figures stay as measured, as at the save's thread speed (perf.speed_pass)."""
    point, low, high = corrected
    return CostRatio(point, low, high, measured.candidate_cost, measured.baseline_cost, "load-corrected")


def load_free_comparison(candidate: Side, baseline: Side) -> tuple[float, float, float] | None:
    """The two sides' costs with the co-tenants' load taken out (Side.load_free_costs) compared: the ratio of their
    fastest repetitions and its bootstrap interval; None where not measured on both sides, or by different evidence
    (run-queue delay vs device time)."""
    cand, base = candidate.load_free_costs(), baseline.load_free_costs()
    if cand is None or base is None or candidate.load_free_by != baseline.load_free_by:
        return None
    return bootstrap_ratio_ci(cand, base, least_disturbed)


def load_free_failure(candidate: Side, corrected: tuple[float, float, float] | None, threshold: float,
                      residual: float, measured_ratio: float, now: float | None, then: float | None) -> str | None:
    """A slowdown on a busy runner that the load cannot have made: the load-corrected comparison (`corrected`,
    load_free_comparison) failing only when its whole interval lies beyond the threshold times the estimate's
    measured `residual` (stored_residual: measured between runs, so the runs' own drift, RUN_DRIFT, is in it).
    Returns the reason, naming the load on each busy side (`now`, `then`: busy_share's) and the evidence, or None
    (not measured on both sides, or not beyond)."""
    if corrected is None or corrected[1] <= threshold * residual:
        return None
    point, low, high = corrected
    return (f"{interference.load_corrected(candidate.load_free_by)}: ×{point:.3f} [{low:.3f}, {high:.3f}] slower "
            f"with the co-tenants' load taken out (×{measured_ratio:.3f} as measured; {_loads(now, then)}), "
            f"beyond {_corrected_bar(candidate, threshold, residual)}")


def _loads(now: float | None, then: float | None) -> str:
    """Which side the co-tenants loaded, and by how much: 'other processes took 58% … during this run and 57% … at
    the save'."""
    if now is not None and then is not None:
        return (f"other processes took {interference.taken(now)} during this run and {interference.taken(then)} at "
                "the save")
    if now is not None:
        return f"{interference.describe(now)} during this run"
    return f"{interference.describe(then or 0.0)} while the baseline was saved"


def _not_beyond(candidate: Side, corrected: tuple[float, float, float] | None, threshold: float,
                residual: float) -> str:
    """What the load-corrected comparison read where it did not fail, for an undecided verdict's note."""
    if corrected is None:
        return ""
    point, low, high = corrected
    return (f"; {interference.load_corrected(candidate.load_free_by)}: ×{point:.3f} [{low:.3f}, {high:.3f}], not "
            f"beyond {_corrected_bar(candidate, threshold, residual)}")


def _corrected_bar(candidate: Side, threshold: float, residual: float) -> str:
    """'×1.27 (the limit ×1.1 × 1.15, the load correction's own error)', or where the margin is what the load may
    add to our thread's own CPU time, that (a new user read two "load correction's errors", 2.0 and 1.6)."""
    what = "what the load may add to our thread's CPU time" if residual >= BUSY_CPU_INFLATION \
        else "the load correction's own error"
    return (f"×{threshold * residual:.2f} (the limit {units.ratio(threshold)} × {residual}, {what}"
            f"{_why_margin(candidate, residual)})")


def stored_residual(candidate: Side, baseline: Side) -> float:
    """How far two load-corrected sides of a stored comparison can be off: one thread's per-repetition error
    (interference.LOAD_FREE_RESIDUAL_ONE_THREAD) where both ran on one CPU thread and the figure is the repetition's
    own (a throughput), each request's own (WaitClock), or only the candidate was busy; else a team's margin
    (LOAD_FREE_RESIDUAL): a busy baseline's per-request percentile scaled by its repetition's share understates it
    unevenly, since a time-sliced co-tenant stretches a few requests a lot and most not at all (unchanged code read
    ITL ×1.31 [1.11, 1.43] slower that way, docs/measurements.md). Understating a busy *candidate* the same way can
    only hide a slowdown, never make one: one thread's error is its margin. A candidate the kernel saw busy keeps
    BUSY_CPU_INFLATION whether or not it waited for a CPU (busy_cpu_margin)."""
    one_thread = candidate.cpu_threads == 1 and baseline.cpu_threads == 1
    whole = not candidate.per_request or bool(candidate.per_request_load_free and baseline.per_request_load_free)
    exact = one_thread and (whole or busy_share(baseline.others) is None)
    return busy_cpu_margin(candidate, interference.LOAD_FREE_RESIDUAL_ONE_THREAD if exact
                           else interference.LOAD_FREE_RESIDUAL)


# A busy side's load-corrected cost is, on the CPU, its threads' time on a CPU (one thread: wall time less its
# run-queue wait), and that time grows with every preemption: the co-tenants evict the engine's working set from the
# caches they share, and each of its time slices starts by refilling them. Beside busy loops, memory streams and
# torch jobs the tiny model's CPU time per token read ×0.95-2.10 its quiet figure at the median, ×2.10 beside two
# memory streams, while the quiet figure itself moved ×0.86-1.29 between minutes (benchmarks/preempted_cpu_time.py,
# docs/measurements.md, "A preempted thread's CPU time"), and unchanged code compared with a save beside other CI
# jobs read ×1.92 [1.64, 2.29] slower load-corrected. So a candidate that waited for a CPU for a real share of its
# time (its median repetition's load-free share below PREEMPTED_SHARE) fails load-corrected only beyond the
# threshold × BUSY_CPU_INFLATION. Against a save its co-tenants did not share, so does a busy candidate that hardly
# waited (busy_cpu_margin): beside two processes streaming memory half the time our thread waited a few percent of
# its time and its CPU time still grew ×1.22-1.65 (benchmarks/preempted_cpu_time.py), and unchanged code compared
# with a quiet save read tokens/s ×1.561 [1.486, 1.672] slower load-corrected, 1 trial in 10 (benchmarks/
# figure_power.py --arm half-streams-run; docs/measurements.md). Beside the same co-tenant on both sides (perf.busy.
# steady_co_tenant) the caches are refilled on both, and only a preempted candidate keeps the larger margin. The
# device's time (CUDA events) is not a CPU's, so not inflated so.
BUSY_CPU_INFLATION = 2.0
PREEMPTED_SHARE = 0.9


def preempted(side: Side) -> bool:
    """Whether `side`'s load-corrected costs may be inflated by its preemptions (BUSY_CPU_INFLATION)."""
    return side.load_free_by == interference.RUN_QUEUE and bool(side.load_free) \
        and harrell_davis(side.load_free, 0.5) < PREEMPTED_SHARE


def preempted_margin(candidate: Side, residual: float) -> float:
    """`residual`, or BUSY_CPU_INFLATION where the busy candidate was preempted: its CPU time may have grown that
    much with no change to the code."""
    return max(residual, BUSY_CPU_INFLATION) if preempted(candidate) else residual


def busy_cpu_margin(candidate: Side, residual: float) -> float:
    """`residual`, or BUSY_CPU_INFLATION where the candidate's load was taken out by run-queue delay and the kernel
    saw it busy or it was preempted: its CPU time may have grown that much with no change to the code."""
    busy = candidate.load_free_by == interference.RUN_QUEUE and busy_share(candidate.others) is not None
    return max(residual, BUSY_CPU_INFLATION) if busy else preempted_margin(candidate, residual)


def _why_margin(candidate: Side, residual: float) -> str:
    """Why the margin is BUSY_CPU_INFLATION, with the share that made it so: beside the same co-tenant one run's bar
    read ×1.26 and the next ×2.2 as our thread's share crossed PREEMPTED_SHARE (96% and 89%), unexplained."""
    if residual < BUSY_CPU_INFLATION:
        return ""
    waited = 1.0 - harrell_davis(candidate.load_free, 0.5)
    if preempted(candidate):
        return (f": our thread waited for a CPU {waited:.0%} of its time this run (over {1 - PREEMPTED_SHARE:.0%}), "
                "and a preempted thread's CPU time grows as it refills its caches")
    return (f": the co-tenants of this run may fill the caches our thread shares with them, which grows its CPU time "
            f"though it waited for a CPU only {waited:.0%} of its time (beside such a load, unchanged code has read up "
            "to ×1.56 slower, load-corrected: docs/measurements.md)")
