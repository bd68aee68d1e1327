"""A calibration probe: how fast is this machine right now, measured without the libraries a perf gate is gating.

A stored baseline is compared with a measurement taken later, on a machine that may be busier (a shared CI box) or
warmer. The bench runs this probe right before and right after every repetition of a workload and keeps, per
repetition, the probe's time; the comparison then expresses each repetition in units of the probe measured next to
it (`normalize`), so that a machine that is x% slower now than when the baseline was saved slows the probe and the
workload alike and the ratio of the two cancels it.

The probe is fp32 GEMMs of the shapes a small transformer layer runs (a prefill-sized and a decode-sized matmul)
and a copy of an array larger than the caches, on numpy's own BLAS, not torch's: an upgrade of torch,
transformers or bitsandbytes (what a stored baseline gates) does not change it. It runs for tens of ms. It probes
the CPU; on a GPU device it is not run and the comparison is not normalized.
"""

from __future__ import annotations

import time
from functools import cache

from pytest_infergate.perf.metrics import METRICS

# The probe's name and version: a baseline's probe times are comparable only with the same probe's.
PROBE = "numpy-sgemm-copy/1"
# Metrics in time units scale with machine speed; throughputs inversely; memory, counts and fractions not at all.
LATENCY_METRICS = frozenset(name for name, (unit, _, _) in METRICS.items() if unit in ("ms", "s") and name != "load_s")
THROUGHPUT_METRICS = frozenset({"tokens_per_s", "requests_per_s", "goodput_per_s"})


@cache
def _operands():
    import numpy as np

    rng = np.random.default_rng(0)
    hidden, inner = 576, 1536  # a SmolLM-sized MLP; the shapes matter less than being BLAS-bound like the engine
    return {"prefill": rng.standard_normal((64, hidden), dtype=np.float32),
            "decode": rng.standard_normal((8, hidden), dtype=np.float32),
            "weight": rng.standard_normal((hidden, inner), dtype=np.float32),
            "src": np.ones(8 << 20, dtype=np.float32),  # 32 MiB: past the last-level cache of a CI runner
            "dst": np.empty(8 << 20, dtype=np.float32)}


def available() -> bool:
    try:
        _operands()
    except ImportError:  # numpy comes with transformers; without it the gate compares without normalization
        return False
    return True


def probe_seconds() -> float:
    """One run of the probe, in seconds (tens of ms on a 2-core CI runner): GEMMs, then an out-of-cache copy."""
    import numpy as np

    ops = _operands()
    start = time.perf_counter()
    for _ in range(12):
        ops["prefill"] @ ops["weight"]
    for _ in range(60):
        ops["decode"] @ ops["weight"]
    for _ in range(3):
        np.copyto(ops["dst"], ops["src"])
    return time.perf_counter() - start


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
