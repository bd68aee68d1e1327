"""A calibration probe: how fast is this machine right now, measured without the libraries a perf gate is gating.

A stored baseline is compared with a measurement taken later, on a machine that may be busier (a shared CI box) or
warmer. Every repetition of a workload gets the probe's time *during* it: a child process (`Sampler`) runs the
probe every so often while the workload runs, and the bench runs it once more right before and right after; the
repetition's figure is the geometric mean of those. The comparison then expresses each repetition in units of its
own probe time (`scale`), so a machine that is x% slower now than when the baseline was saved slows the probe and
the workload alike and the ratio of the two cancels it.

Why during and not only around: on a loaded 2-core machine a repetition of the gate_power workload took 50-300 s
and the load changed within it; the probe right before and right after tracked the repetition's speed with r=0.26
over 12 repetitions, the probe sampled through it with r=0.85 (benchmarks, see the baseline-drift notes).

The probe is fp32 GEMMs of the shape of a small transformer's MLP (multi-threaded, like the engine's own) and a
copy of an array larger than the caches, on numpy's own BLAS, not torch's: an upgrade of torch, transformers or
bitsandbytes (what a stored baseline gates) does not change it. One run takes a few ms on an idle machine; the
sampler keeps its share of the machine under 5%. It probes the CPU; on a GPU device it is not run and the
comparison is not normalized.

What the probe sampled during a repetition includes the workload's own pressure on the cores; it is the same for
an unchanged workload and for one doing more of the same work. A candidate that leaves the cores idle for part of
its time (sleeps, waits) lets the probe run faster, so its slowdown reads somewhat larger once normalized.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path

from pytest_infergate.perf.metrics import METRICS

# The probe's name and version: a baseline's probe times are comparable only with the same probe's.
PROBE = "numpy-sgemm-copy/2"
# Metrics in time units scale with machine speed; throughputs inversely; memory, counts and fractions not at all.
LATENCY_METRICS = frozenset(name for name, (unit, _, _) in METRICS.items() if unit in ("ms", "s") and name != "load_s")
THROUGHPUT_METRICS = frozenset({"tokens_per_s", "requests_per_s", "goodput_per_s"})
MIN_INTERVAL_S = 0.25  # the sampler's pause between probes: at least this, and at least DUTY times the probe's time
DUTY = 19


@cache
def _operands():
    import numpy as np

    rng = np.random.default_rng(0)
    hidden, inner = 576, 1536  # a SmolLM-sized MLP; the shapes matter less than being BLAS-bound like the engine
    return {"activations": rng.standard_normal((64, hidden), dtype=np.float32),
            "weight": rng.standard_normal((hidden, inner), dtype=np.float32),
            "src": np.ones(4 << 20, dtype=np.float32),  # 16 MiB: past the last-level cache of a CI runner
            "dst": np.empty(4 << 20, dtype=np.float32)}


def available() -> bool:
    try:
        _operands()
    except ImportError:  # numpy comes with transformers; without it the gate compares without normalization
        return False
    return True


def probe_seconds() -> float:
    """One run of the probe, in seconds (a few ms on an idle 2-core CI runner): GEMMs, then an out-of-cache copy."""
    import numpy as np

    ops = _operands()
    start = time.monotonic()
    for _ in range(3):
        ops["activations"] @ ops["weight"]
    np.copyto(ops["dst"], ops["src"])
    return time.monotonic() - start


def sample_forever() -> None:
    """The sampler child's loop: `start_s duration_s` per probe on stdout, until the parent goes away."""
    parent = __import__("os").getppid()
    while __import__("os").getppid() == parent:
        start = time.monotonic()
        seconds = probe_seconds()
        try:
            sys.stdout.write(f"{start!r} {seconds!r}\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            return
        time.sleep(max(MIN_INTERVAL_S, DUTY * seconds))


class Sampler:
    """A child process running the probe every MIN_INTERVAL_S or more (time.monotonic is one clock for both
    processes on Linux and macOS); `during(start, end)` returns the probe times that began in that span."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])
        code = (f"import sys; sys.path.insert(0, {root!r}); "
                "from pytest_infergate.perf.calibration import sample_forever; sample_forever()")
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                         stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, name="infergate-probe-sampler", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            start, seconds = map(float, line.split())
            with self._lock:
                self._samples.append((start, seconds))

    def during(self, start: float, end: float) -> list[float]:
        with self._lock:
            self._samples = [s for s in self._samples if s[0] >= start - 60.0]  # older ones are never asked for
            return [seconds for began, seconds in self._samples if start <= began and began + seconds <= end]

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


def repetition_probe(before: float, during: list[float], after: float) -> float:
    """The machine's speed over one repetition: geometric mean of the probe right before, during and right after."""
    values = [before, *during, after]
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


def normalizes(metric: str) -> bool:
    return metric in LATENCY_METRICS or metric in THROUGHPUT_METRICS
