"""How much of the machine other processes took while a repetition ran: the direct evidence of a busy runner. A
timing cannot tell a slow change from a busy machine; the kernel can: over one repetition, the machine's busy time
(a VM's steal included) less our own processes' CPU time (this one and the calibration probe's sampler) is what
other jobs took, kept as a share of the machine's CPU time so that it reads the same on any number of cores. The
gate (perf.stored, perf.outcome) keeps a failure on a busy runner only where the figures with the load taken out
(run-queue delay, device time) fail beyond what that correction can be off; a pass is never made by it. Not
measured elsewhere than Linux (no /proc). Why, with the measurements: docs/explanation/perf-gates.md, 'The kernel's
evidence comes first'; docs/measurements.md, 'The README's main command under a CPU hog, with the kernel's
evidence'."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytest_infergate import process_meters

# How much slower other processes can make a measurement, at most, given the share of the machine they took: our
# threads get the rest (1 / (1 - share)), and the engine's threads, which wait on each other at every step, lose
# more than their share: one busy-loop process per core (about half the machine) slows the engine's ITL about twice
# as much as the share's x2 (docs/explanation/perf-gates.md); LOAD_PENALTY keeps twice that again as margin. A time
# worse than this bound is more than the load can explain, and stands as a failure on a busy runner too.
LOAD_PENALTY = 4.0
# How far the load-free estimate of a repetition (process_meters.team_progress_s) can stray from its quiet figure under
# co-tenant load, as benchmarks/load_evidence.py measures it per repetition under one busy loop per core and one on
# two cores (docs/measurements.md, "What co-tenant load distorts"). A load-free slowdown
# beyond threshold × this stands as a failure on a busy runner (perf.stored.load_free_failure).
LOAD_FREE_RESIDUAL = 1.6


# One computing thread's per-repetition error under one busy loop per core (benchmarks/load_evidence.py --threads 1;
# docs/measurements.md, "One torch thread against two under a CPU hog")
LOAD_FREE_RESIDUAL_ONE_THREAD = 1.15


# What a user can do about a busy runner, said by every verdict a runner's load left undecided: actions a CI job can
# take, where nobody picks the runner ("a quiet runner" is none).
IN_ONE_RUN = ("compare in one run, where the load hits both sides alike (--infergate-baseline-python "
              "OLD_ENV/bin/python for a library change, infergate_bench.ab() for a model, precision or config)")
_RERUN_JOB = "rerun the job (each run reads the runner's load anew)"
RERUN = f"{_RERUN_JOB}, or {IN_ONE_RUN}"
# the same where nothing the baseline records changed: there is no other side to compare in one run
RERUN_UNCHANGED = f"{_RERUN_JOB}, or measure more (a larger `min_time_s=` in the `infergate_bench(...)` call)"
# a baseline saved under load: slower than the code is, so a failure against it stands; a pass needs the same steady
# load beside the later run too (perf.busy.steady_co_tenant), which a quiet runner never has
# the same promise as every comparison's baseline line (perf.baseline.BaselineEntry.provenance), in other words
UNDER_LOAD = ("later runs fail a slowdown larger than what that load took from it, and pass only beside a steady "
              "load like the save's")
RESAVE = ("re-save the baseline in a later run, which may find the runner quieter (--infergate-save-baseline; in "
          f"CI, delete the baseline file on the default branch: docs/guides/ci.md), or, where the runner is always "
          f"busy, {IN_ONE_RUN}")

# what measured a load-free share (process_meters.LoadFreeTimer)
RUN_QUEUE, DEVICE_TIME = process_meters.RUN_QUEUE, process_meters.DEVICE_TIME


def load_corrected(by: str) -> str:
    """The evidence phrase of a figure with the co-tenants' load taken out: 'load-corrected by run-queue delay'.
    Verdicts recorded before `by` was were load-corrected by run-queue delay."""
    return f"load-corrected by {by or RUN_QUEUE}"


def load_free_residual(*measurements, paired: bool = False, baseline_quiet: bool = False) -> float:
    """How far a load-free estimate can be off for these measurements (Measurement or perf.sides.Side, by their
    cpu_threads). Against a stored baseline or a budget: a team's LOAD_FREE_RESIDUAL, on one thread too, unless
    only the candidate was busy (below). A repetition's load-free share stands for each of its requests'
    latencies there, and a time-sliced co-tenant does not stretch them evenly: against a baseline saved under a
    co-tenant, unchanged code on one thread can read slower load-corrected beyond one thread's per-repetition error
    (docs/measurements.md). `paired` (an A/B: the sides measured
    round by round under the same load) with every side on one CPU thread (Measurement.cpu_threads): the load's
    unevenness hits both sides of a round alike and the interval over the rounds bounds the rest, so no margin is
    added (a team's stalls differ between the sides: its residual stays). `baseline_quiet` (a stored baseline
    saved on a quiet runner, only this run busy) on one thread: the correction can only understate the busy
    candidate's latencies (hiding a slowdown, never making one), so one thread's per-repetition error is the
    margin."""
    # device time by CUDA events is not measured against a quiet device yet (benchmarks/load_evidence.py --device
    # cuda, run by benchmarks/gpu_check.sh): a team's margin until it is
    one_thread = bool(measurements) and all(m.cpu_threads == 1 for m in measurements)
    if not one_thread:
        return LOAD_FREE_RESIDUAL
    return 1.0 if paired else LOAD_FREE_RESIDUAL_ONE_THREAD if baseline_quiet else LOAD_FREE_RESIDUAL


@dataclass(frozen=True)
class Snapshot:
    machine_busy: int  # clock ticks, all CPUs: user, nice, system, irq, softirq and steal
    machine_total: int  # the same plus idle and iowait
    ours: int  # clock ticks of our processes (every thread)


def _machine_ticks() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already inside user
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _process_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow its last ')'
    rest = text[text.rfind(")") + 2:].split()
    return int(rest[11]) + int(rest[12])  # utime, stime: fields 14 and 15 of proc(5)


def snapshot(pids: list[int]) -> Snapshot | None:
    """The machine's and our processes' CPU time now; None where /proc cannot tell (not Linux)."""
    machine = _machine_ticks()
    if machine is None:
        return None
    ours = 0
    for pid in pids:
        ticks = _process_ticks(pid)
        if ticks is None and pid == os.getpid():
            return None
        ours += ticks or 0
    return Snapshot(machine[0], machine[1], ours)


def others_share(before: Snapshot | None, after: Snapshot | None) -> float | None:
    """The share of the machine's CPU time (0-1, all CPUs together) that other processes and the hypervisor's
    other guests took between the two snapshots; None when not measured or too short to tell (a few clock ticks:
    a tick is 10 ms of one CPU, so a repetition of tens of ms reads coarsely; the gate takes the median)."""
    if before is None or after is None:
        return None
    total = after.machine_total - before.machine_total
    if total < 4:
        return None
    others = (after.machine_busy - before.machine_busy) - (after.ours - before.ours)
    return min(1.0, max(0.0, others / total))


def explainable_slowdown(share: float) -> float:
    """The largest slowdown other processes taking `share` of the machine can cause (see LOAD_PENALTY)."""
    return LOAD_PENALTY / max(1e-9, 1.0 - share)


def taken(share: float) -> str:
    """'52% of the machine's CPU time (1.0 of 2 CPUs)'."""
    cpus = os.cpu_count() or 1
    return f"{share:.0%} of the machine's CPU time ({share * cpus:.1f} of {cpus} CPUs)"


def describe(share: float) -> str:
    """'other processes took 52% of the machine's CPU time (1.0 of 2 CPUs)'."""
    return f"other processes took {taken(share)}"
