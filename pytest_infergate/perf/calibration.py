"""A calibration probe: how fast is this machine right now, measured without the libraries a perf gate is gating.

A child process (`Sampler`) runs the probe — fp32 GEMMs shaped like a small transformer's prefill and decode (the
decode ones stream a 64 MiB matrix) and a copy, on numpy's BLAS, not torch's, so an upgrade under test does not
change it — right before each repetition of a workload, every so often during it, and right after it. perf.stored
reads the probe's level now against the baseline's to tell which way the machine moved; it never scales a verdict.
On a GPU it is not run. Why this probe, and how well it tracks the workload: docs/measurements.md.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path

from pytest_infergate.measurement import LATENCY_METRICS, THROUGHPUT_METRICS

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
                "from pytest_infergate.perf.calibration import sample_forever; sample_forever()")
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

