"""The metrics a perf gate knows, and the Measurement that holds their samples. No pytest here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from pytest_infergate.stats import percentile

# metric -> (unit, higher_is_better, is a per-request distribution)
METRICS: dict[str, tuple[str, bool, bool]] = {
    "ttft_ms": ("ms", False, True),
    "tpot_ms": ("ms", False, True),
    "itl_ms": ("ms", False, True),
    "e2e_ms": ("ms", False, True),
    "queue_ms": ("ms", False, True),
    "tokens_per_s": ("tok/s", True, False),
    "requests_per_s": ("req/s", True, False),
    "peak_mem_mb": ("MiB", False, False),
    "kv_mem_mb": ("MiB", False, False),
    "load_s": ("s", False, False),
    "success_rate": ("fraction", True, False),  # endpoint runs: requests answered / requests sent
    "goodput_per_s": ("req/s", True, False),  # endpoint runs: requests that met every SLO, per second
    # endpoint capacity search: the highest load that still met the SLO (offered req/s; concurrency)
    "capacity_rps": ("req/s", True, False),
    "capacity_concurrency": ("requests", True, False),
    # the server's own /metrics, scraped around each endpoint load run (see endpoint/server_metrics.py)
    "kv_usage": ("fraction", False, False),  # peak KV-cache usage during the run
    # prompt tokens served from the prefix cache (also the engine's own, per repetition, with prefix_caching)
    "prefix_cache_hit_rate": ("fraction", True, False),
    "preemptions": ("count", False, False),  # requests preempted (or retracted) during the run
    "waiting_requests": ("requests", False, False),  # peak queue length during the run
    "running_requests": ("requests", True, False),  # peak batch (requests running at once) during the run
}
# Metrics in time units scale with the machine's speed, throughputs inversely; memory, counts and fractions not at
# all (the load time is the model's, not the workload's). What a busy runner or another machine can distort.
LATENCY_METRICS = frozenset(name for name, (unit, _, _) in METRICS.items() if unit in ("ms", "s") and name != "load_s")
THROUGHPUT_METRICS = frozenset({"tokens_per_s", "requests_per_s", "goodput_per_s"})
MEMORY_METRICS = frozenset(name for name, (unit, _, _) in METRICS.items() if unit == "MiB")


# Other processes taking a quarter of the machine's CPU time (half a CPU of two) slow a two-thread engine well
# beyond any max_regression a team sets; a quiet runner's background (logging, the CI agent) stays far below it.
BUSY_SHARE = 0.25

# What a repetition's load-free share was measured by (Measurement.load_free_by): on the CPU, the kernel's run-queue
# delays of our threads (process_meters.team_progress_s); on a CUDA device, the device's time in the engine's
# forwards by CUDA events, which CPU co-tenants hardly move (they slow the host's launches, not the kernels).
RUN_QUEUE = "run-queue delay"
DEVICE_TIME = "device time (CUDA events)"


def busy_share(per_repetition: list[float]) -> float | None:
    """The share others took on the median repetition when a busy runner's (BUSY_SHARE or more), else None
    (quiet, or not measured): Measurement.others_share, read by the gate (perf.interference says how it is measured)."""
    if not per_repetition:
        return None
    typical = median(per_repetition)
    return typical if typical >= BUSY_SHARE else None


# The least load-free share (of a repetition's wall time, the share its work would have taken with the CPUs to
# itself: Measurement.load_free_share) at which a load-corrected figure is used: the correction's residuals
# (perf.interference) were measured at shares of 0.25-0.5 (one busy loop per core), and far below them the estimate
# strays beyond them: a baseline saved with our one thread at 0.08-0.14 of its wall time (two busy loops and a
# niced two-thread job beside it on 2 cores) read unchanged code x2.08 [1.92, 2.28] slower load-corrected
# (docs/measurements.md). A side with a repetition below it is compared as measured.
LOAD_FREE_FLOOR = 0.2


def beyond_correction(shares: list[float]) -> bool:
    """Whether a repetition's load-free share lies below the range the load correction was measured in
    (LOAD_FREE_FLOOR): its load-corrected figures are then not used."""
    return bool(shares) and min(shares) < LOAD_FREE_FLOOR


def scales_with_speed(metric: str) -> bool:
    return metric in LATENCY_METRICS or metric in THROUGHPUT_METRICS


PERCENTILES = (50, 90, 95, 99, 99.9)
MAX_REQUEST_RECORDS = 5000  # per measurement: about 1 MB of JSON at 20 chunks a request


def percentile_suffix(pct: float) -> str:
    """The budget-key / summary suffix of a percentile: 95 -> "p95", 99.9 -> "p999"."""
    return "p" + f"{pct:g}".replace(".", "")


PERCENTILE_OF_SUFFIX = {percentile_suffix(p)[1:]: p for p in PERCENTILES}  # "999" -> 99.9


@dataclass
class Measurement:
    """Samples of each metric from one measured workload. Latency metrics hold one value per request (warm-up
    requests excluded); throughput and memory hold one value per repetition."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    repetitions: int = 0
    num_requests: int = 0
    num_failed: int = 0
    memory: dict[str, float] = field(default_factory=dict)  # weights / kv / other split, MiB
    engine: dict[str, Any] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # per-step timeline of the last repetition
    label: str = ""
    # Calibration (perf.calibration): the probe's name, its seconds next to each repetition, and per metric the
    # sample count after each repetition, so that every sample can be normalized by its own repetition's probe.
    probe: str = ""
    probe_s: list[float] = field(default_factory=list)
    # The probe right before and right after each repetition (geometric mean of the two), while no workload runs:
    # a steadier reading of the machine's level than the probes during it, which compete with the workload for
    # the cores. Empty in baselines saved before it was recorded.
    probe_quiet_s: list[float] = field(default_factory=list)
    # The engine thread's own speed probe (perf.thread_speed): its name (with the Python version) and per repetition
    # its seconds right before and after (geometric mean). Empty off the CPU and in older baselines.
    thread_probe: str = ""
    thread_probe_s: list[float] = field(default_factory=list)
    # Per repetition, the share of the machine's CPU time other processes took while it ran (perf.interference):
    # the direct evidence of a busy runner. Empty where not measured (not Linux, older baselines, endpoints).
    others_share: list[float] = field(default_factory=list)
    # Per repetition, the share of its wall time the workload would have taken with the CPUs to itself (process_meters.
    # team_progress_s / wall: 1.0 quiet, ~0.27 under one busy loop per core): a busy side's figures times it are
    # what the gate compares there. Empty where not measured.
    load_free_share: list[float] = field(default_factory=list)
    # what measured load_free_share (perf.interference.RUN_QUEUE on the CPU, DEVICE_TIME on a CUDA device)
    load_free_by: str = ""
    # The per-request latencies (ttft_ms, tpot_ms, itl_ms, e2e_ms, queue_ms) with each request's own run-queue wait
    # taken out (wait_clock.WaitClock: one computing thread on the CPU), parallel to `samples` (the same
    # repetition split); empty where a repetition was not measured so.
    load_free_samples: dict[str, list[float]] = field(default_factory=dict)
    # torch's threads while the workload ran on the CPU (0: not recorded, or not on the CPU). One thread makes the
    # load-free share exact up to cache effects; a team's is an estimate (perf.interference.load_free_residual).
    cpu_threads: int = 0
    # Endpoint load runs: one record per request (endpoint.load_run.request_record: when it left, its first token and
    # each chunk's arrival in seconds from the run's start, tokens, HTTP status, error class), at most
    # MAX_REQUEST_RECORDS per measurement, for the slow tail a percentile hides.
    requests: list[dict[str, Any]] = field(default_factory=list)
    repetition_ends: dict[str, list[int]] = field(default_factory=dict)

    def value(self, metric: str, pct: float | None = 50) -> float:
        values = self.samples.get(metric)
        if not values:
            raise KeyError(f"no samples of {metric} in this measurement")
        if METRICS[metric][2]:
            return percentile(values, pct or 50)
        return percentile(values, 50)

    def summary(self) -> dict[str, float]:
        out = {}
        for metric, values in self.samples.items():
            if not values:
                continue
            if METRICS[metric][2]:
                for pct in PERCENTILES:
                    out[f"{metric}_{percentile_suffix(pct)}"] = percentile(values, pct)
            else:
                out[metric] = percentile(values, 50)
        return out

    def load_free_source(self) -> str:
        """What measured the load-free shares (`load_free_by`); "" where none were measured. Measurements saved
        before it was recorded measured them by run-queue delay (on the CPU)."""
        return self.load_free_by or (RUN_QUEUE if self.load_free_share else "")

    def by_repetition(self, metric: str) -> list[list[float]] | None:
        """The samples of `metric` split by repetition, or None when this measurement did not record the split."""
        values, ends = self.samples.get(metric) or [], self.repetition_ends.get(metric) or []
        if not values or not ends or len(ends) != self.repetitions or ends != sorted(ends) or ends[-1] != len(values):
            return None
        return [values[start:end] for start, end in zip([0, *ends[:-1]], ends)]

    def load_free_by_repetition(self, metric: str) -> list[list[float]] | None:
        """The load-free samples of a per-request `metric` split by repetition as `samples` is (None: not measured
        for every repetition)."""
        values, reps = self.load_free_samples.get(metric) or [], self.by_repetition(metric)
        if reps is None or len(values) != sum(len(rep) for rep in reps):
            return None
        ends = self.repetition_ends[metric]
        return [values[start:end] for start, end in zip([0, *ends[:-1]], ends)]

    def end_repetition(self) -> None:
        """Close a repetition whose samples were just appended: count it, and where each metric's samples end."""
        self.repetitions += 1
        for metric, values in self.samples.items():
            ends = self.repetition_ends.setdefault(metric, [])
            if len(ends) == self.repetitions - 1:
                ends.append(len(values))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def note_per_repetition(values: list[float], value: float | None, repetitions: int) -> None:
    """Append one repetition's `value` to a per-repetition list of a Measurement (others_share, load_free_share);
    one repetition not measured (None) leaves the whole list unmeasured: the gate then has no evidence either way."""
    if value is not None and len(values) == repetitions:
        values.append(value)
    else:
        values.clear()


def add_request_latencies(samples: dict[str, list[float]], ttft_s: float | None, tpot_s: float | None,
                          itl_s: list[float], e2e_s: float, queue_s: float | None = None) -> None:
    """One finished request's latencies, in ms, into a Measurement's samples (engine and endpoint alike)."""
    if ttft_s is not None:
        samples.setdefault("ttft_ms", []).append(ttft_s * 1000)
    if tpot_s is not None:
        samples.setdefault("tpot_ms", []).append(tpot_s * 1000)
    samples.setdefault("itl_ms", []).extend(x * 1000 for x in itl_s)
    samples.setdefault("e2e_ms", []).append(e2e_s * 1000)
    if queue_s is not None:
        samples.setdefault("queue_ms", []).append(queue_s * 1000)


def every_request_failed(m: Measurement) -> str | None:
    """Why no budget can be checked on `m` where the engine rejected every one of its requests (a local target's
    unusable measurement: gates.targets), else None."""
    if not (m.num_requests and m.num_failed >= m.num_requests):
        return None
    why = ", ".join(f"{reason}: {count}" for reason, count in (m.engine.get("failed_requests") or {}).items())
    return (f"every one of the {m.num_requests} requests failed{f' ({why})' if why else ''}, so no budget can be "
            "checked; a rejected request's prompt is longer than the engine takes (max_input_tokens / "
            "max_model_len) or its KV cannot fit")
