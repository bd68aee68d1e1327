"""The records a stored comparison is made of: one side's repetitions of a metric as costs with the evidence beside
them (probes, the co-tenants' share, the load-free figures), a ratio with its interval, and how far the machine
moved between the two sides, and the verdict made of them (perf.stored decides with them; perf.busy where the
runner was busy; perf.speed_pass at the save's thread speed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_infergate.measurement import beyond_correction
from pytest_infergate.status import Status


@dataclass(frozen=True)
class Side:
    """One measurement's repetitions of one metric, oriented so that larger is worse (throughputs inverted)."""

    costs: list[float]
    during: list[float]  # the probe's time during each repetition (empty: not calibrated)
    quiet: list[float]  # before and after each repetition, no workload running (empty: not recorded)
    others: list[float] = field(default_factory=list)  # per repetition, the machine's share other processes took
    # per repetition, the share of its wall time the work would have taken with the CPUs to itself (Measurement.
    # load_free_share); empty: not measured
    load_free: list[float] = field(default_factory=list)
    cpu_threads: int = 0  # Measurement.cpu_threads: how exact load_free is (interference.load_free_residual)
    load_free_by: str = ""  # Measurement.load_free_by: what measured load_free
    per_request: bool = False  # a percentile of per-request figures (a latency), not a figure of the repetition
    # per repetition, the percentile of the requests' latencies with each request's own waiting taken out
    # (Measurement.load_free_samples: one thread on the CPU); empty: not measured so
    per_request_load_free: list[float] = field(default_factory=list)
    # per repetition, the engine thread's speed probe (perf.thread_speed) where both sides ran the same probe
    thread_probe: list[float] = field(default_factory=list)

    def load_free_costs(self) -> list[float] | None:
        """Each repetition's cost with the co-tenants' load taken out: a latency by each request's own waiting where
        measured (per_request_load_free), else the cost × the repetition's load-free share (for a per-request
        percentile the repetition's share then stands for each request's); None: not measured, or a repetition's
        share lies below the range the correction holds in (beyond_correction)."""
        if beyond_correction(self.load_free):
            return None
        if self.per_request_load_free:
            return list(self.per_request_load_free)
        if len(self.load_free) != len(self.costs) or min(self.load_free, default=0.0) <= 0:
            return None
        return [c * f for c, f in zip(self.costs, self.load_free)]


@dataclass(frozen=True)
class CostRatio:
    """Candidate/baseline cost ratio with its bootstrap interval, and the two sides' summaries in cost units."""

    ratio: float
    low: float
    high: float
    candidate_cost: float
    baseline_cost: float
    normalization: str  # "as measured", "by level" or "per repetition"


@dataclass(frozen=True)
class MachineChange:
    """How much slower the machine is now than at the baseline, by the calibration probe (1.2: 20% slower)."""

    ratio: float
    low: float
    high: float

    def beyond(self, threshold: float) -> bool:
        """The whole interval lies outside [1/threshold, threshold]: the machine changed more than the gate allows."""
        return self.low > threshold or self.high < 1.0 / threshold


@dataclass(frozen=True)
class StoredVerdict:
    """A stored comparison's verdict, made where it is decided (perf.stored, perf.busy on a busy runner,
    perf.speed_pass at the save's thread speed), its one sentence the `disagreement`; stored.compare_stored turns it
    into a Verdict."""

    status: Status
    measured: CostRatio
    machine: MachineChange | None
    disagreement: str  # why a decisive comparison was made inconclusive ("" if it was not)
    baseline_at_fault: bool = False  # the disagreement blames the baseline's runner: more of this run cannot help
    load_corrected: bool = False  # decided on the figures with the co-tenants' load taken out (load_free_failure)
    within_drift: bool = False  # slower, but no more than the runs' own drift (RUN_DRIFT): more repetitions cannot help
    at_thread_speed: bool = False  # `measured` is the comparison at the save's thread speed (perf.speed_pass)
    # blamed on a save the host slowed, yet its interval at the save's thread speed straddles the bar: more
    # repetitions of this run narrow it and may still pass it there (perf.speed_pass.held_to_save_speed)
    narrowable: bool = False
    # undecided beside the same co-tenant on both sides, the load-corrected comparison in words: those costs compare
    # like a quiet pair's, so the engine thread's speed may decide a pass (perf.busy.steady_co_tenant,
    # perf.speed_pass.at_thread_speed)
    steady: str = ""
    # Verdict.fail_bar: what the interval's low end must clear to fail on this runner: `measured`'s, or with
    # fail_bar_load_corrected the load-corrected comparison's (perf.busy)
    fail_bar: float | None = None
    fail_bar_load_corrected: bool = False
