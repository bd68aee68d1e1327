"""What the machine did while a repetition ran, the evidence a perf gate reads beside the timings: how much of it
other processes took (the kernel's counts: machine busy time, a VM's steal included, less our own processes' CPU
time, as a share that reads the same on any number of cores) and how fast it is right now (the calibration probe:
fp32 GEMMs and a copy on numpy's BLAS, not torch's, run by a child process around each repetition, so an upgrade
under test does not change it). The gate keeps a failure on a busy runner only where the load-free figures fail
beyond what their correction can be off, and reads the probe to tell which way the machine moved; neither ever
makes a pass. Linux only (/proc). Why, with measurements: docs/explanation/perf-gates.md, docs/measurements.md."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pytest_infergate import process_meters
from pytest_infergate.measurement import LATENCY_METRICS, THROUGHPUT_METRICS

# How much slower other processes can make a measurement, at most, given the share of the machine they took: our
# threads get the rest (1 / (1 - share)), and the engine's threads, which wait on each other at every step, lose
# more than their share. Measured on the 2-vCPU VM with one busy-loop process per core (about half the machine):
# x4.1 on the engine's ITL, twice the share's x2; LOAD_PENALTY keeps twice that again as margin. A time worse
# than this bound is more than the load can explain, and stands as a failure on a busy runner too.
LOAD_PENALTY = 4.0
# How far the load-free estimate of a repetition (process_meters.team_progress_s) can stray from its quiet figure under
# co-tenant load: measured ×0.79-1.33 per repetition with one busy loop per core and ×1.19-1.58 with one busy loop
# on two cores (benchmarks/load_evidence.py, docs/measurements.md, AMD EPYC 2026-12-04). A load-free slowdown
# beyond threshold × this stands as a failure on a busy runner (perf.stored.load_free_failure).
LOAD_FREE_RESIDUAL = 1.6


# One computing thread's per-repetition error (busy/quiet ×0.94-1.11 under one busy loop per core,
# benchmarks/load_evidence.py --threads 1, AMD EPYC 2026-12-04)
LOAD_FREE_RESIDUAL_ONE_THREAD = 1.15


# what measured a load-free share (process_meters.LoadFreeTimer)
RUN_QUEUE, DEVICE_TIME = process_meters.RUN_QUEUE, process_meters.DEVICE_TIME


def load_corrected(by: str) -> str:
    """The evidence phrase of a figure with the co-tenants' load taken out: 'load-corrected by run-queue delay'.
    Verdicts recorded before `by` was were load-corrected by run-queue delay."""
    return f"load-corrected by {by or RUN_QUEUE}"


def load_free_residual(*measurements, paired: bool = False, baseline_quiet: bool = False) -> float:
    """How far a load-free estimate can be off for these measurements (Measurement or perf.stored.Side, by their
    cpu_threads). Against a stored baseline or a budget: a team's LOAD_FREE_RESIDUAL, on one thread too, unless
    only the candidate was busy (below). A repetition's load-free share stands for each of its requests'
    latencies there, and a time-sliced co-tenant does not stretch them evenly: with a baseline saved under one busy
    loop per core, unchanged code on one thread read ITL ×1.31 [1.11, 1.43] slower load-corrected (tiny-random-
    llama, docs/measurements.md), beyond one thread's per-repetition error. `paired` (an A/B: the sides measured
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


# The probe's name and version: a baseline's probe times are comparable only with the same probe's.
PROBE = "numpy-prefill-decode-copy/1"
MIN_INTERVAL_S = 0.25  # the sampler's pause between probes: at least this, and at least DUTY times the probe's time
DUTY = 19


@cache
def _operands():
    import numpy as np

    rng = np.random.default_rng(0)
    hidden, inner = 576, 1536  # a SmolLM-sized MLP
    return {"activations": rng.standard_normal((64, hidden), dtype=np.float32),  # a prefill chunk: compute-bound
            "weight": rng.standard_normal((hidden, inner), dtype=np.float32),
            "tokens": rng.standard_normal((8, 2048), dtype=np.float32),  # a decode step of 8 sequences ...
            "weights": rng.standard_normal((2048, 8192), dtype=np.float32),  # ... over 64 MiB: memory-bound
            "src": np.ones(4 << 20, dtype=np.float32),  # 16 MiB
            "dst": np.ones(4 << 20, dtype=np.float32)}  # written once: no page faults in the first probe


def available() -> bool:
    try:
        _operands()
    except ImportError:  # numpy comes with transformers; without it the gate compares without normalization
        return False
    return True


def probe_seconds() -> float:
    """One run of the probe, in seconds (about 25 ms on one idle core): what the engine's forward passes do, on
    numpy's BLAS: prefill-sized GEMMs, decode-sized GEMMs that stream a 64 MiB weight matrix (more than a CI job's
    share of a last-level cache), and a copy. Long enough to span several scheduler time slices, so on a busy
    machine it reads the CPU share and memory bandwidth it gets."""
    import numpy as np

    ops = _operands()
    start = time.monotonic()
    for _ in range(4):
        ops["activations"] @ ops["weight"]
    for _ in range(2):
        ops["tokens"] @ ops["weights"]
    np.copyto(ops["dst"], ops["src"])
    return time.monotonic() - start


def sample_forever() -> None:
    """The sampler child's loop: a probe every so often and one whenever a line arrives on stdin; `start_s
    duration_s` per probe on stdout; ends when stdin closes or the parent goes away."""
    import select

    parent, interval = os.getppid(), MIN_INTERVAL_S
    probe_seconds()  # the first run pays for loading BLAS kernels and touching memory, not for the machine's speed
    while os.getppid() == parent:
        asked, _, _ = select.select([sys.stdin], [], [], interval)
        if asked and not os.read(sys.stdin.fileno(), 4096):
            return
        start = time.monotonic()
        seconds = probe_seconds()
        try:
            sys.stdout.write(f"{start!r} {seconds!r}\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            return
        interval = max(MIN_INTERVAL_S, DUTY * seconds)


class Sampler:
    """A child process that runs the probe every MIN_INTERVAL_S or more, and at once when asked (`probe_now`), on
    `threads` BLAS threads (the engine's torch threads: the probe then competes for the cores as the workload does).
    time.monotonic is one clock for both processes on Linux and macOS."""

    def __init__(self, threads: int | None = None):
        root = str(Path(__file__).resolve().parents[2])
        code = (f"import sys; sys.path.insert(0, {root!r}); "
                "from pytest_infergate.perf.interference import sample_forever; sample_forever()")
        env = dict(os.environ)
        if threads:
            env.update({name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
        self._samples: list[tuple[float, float]] = []
        self._ended = False
        self._arrived = threading.Condition()
        self._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, env=env)
        self._reader = threading.Thread(target=self._read, name="infergate-probe-sampler", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self._process.stdout:
                start, seconds = map(float, line.split())
                with self._arrived:
                    self._samples.append((start, seconds))
                    self._arrived.notify_all()
        finally:
            with self._arrived:
                self._ended = True
                self._arrived.notify_all()

    @property
    def pid(self) -> int:
        return self._process.pid

    def probe_now(self, timeout_s: float = 60.0) -> float | None:
        """Run the probe now and wait for it; returns when it began, or None when the sampler does not answer
        (numpy missing, the child gone): the repetition is then not calibrated."""
        asked = time.monotonic()
        try:
            self._process.stdin.write("now\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        with self._arrived:
            self._arrived.wait_for(lambda: self._ended or (self._samples and self._samples[-1][0] >= asked), timeout_s)
            return self._samples[-1][0] if self._samples and self._samples[-1][0] >= asked else None

    def between(self, first: float, last: float) -> list[float]:
        """The probe times of the probes that began from `first` to `last`, both included."""
        with self._arrived:
            self._samples = [s for s in self._samples if s[0] >= first - 600.0]  # older ones are never asked for
            return [seconds for began, seconds in self._samples if first <= began <= last]

    def close(self) -> None:
        for stream in (self._process.stdin, self._process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def repetition_probe(values: list[float]) -> float:
    """The machine's speed over one repetition: geometric mean of the probes right before, during and right after."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def scale(metric: str, probe_s: float, reference_s: float) -> float:
    """Factor that turns a value of `metric` measured while the probe took `probe_s` into the value it would have
    had on the machine whose probe took `reference_s`: latencies scale with the probe, throughputs against it,
    everything else (memory, counts, fractions) is left alone."""
    if metric in LATENCY_METRICS:
        return reference_s / probe_s
    if metric in THROUGHPUT_METRICS:
        return probe_s / reference_s
    return 1.0
