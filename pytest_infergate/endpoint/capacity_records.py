"""A capacity search's records (endpoint.capacity runs the search): what it asks (`CapacitySpec`: the SLO, the
target goodput, rate or concurrency, bounds and budgets), each load it measured (`CapacityPoint`), what it found
(`CapacityResult`, written to and read back from a Measurement's JSON), and the search as a Measurement
(`capacity_measurement`) for budgets and the report."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pytest_infergate.endpoint.load_run import LoadPattern, LoadRun, Slo
from pytest_infergate.errors import OptionError
from pytest_infergate.measurement import Measurement, add_request_latencies

SEARCHES = ("rate", "concurrency")
REQUESTS_PER_SLOT = 4  # a concurrency point sends this many requests per slot


@dataclass(frozen=True)
class CapacitySpec:
    slo: Slo
    target_goodput: float = 0.99
    search: str = "rate"
    bounds: tuple[float, float] = (1.0, 64.0)
    budget_s: float = 300.0
    point_s: float = 10.0
    min_requests: int = 20
    resolution: float = 0.1  # bisection stops when the failing load is within 10% of the passing one

    def __post_init__(self):
        if self.slo.is_empty:
            raise OptionError("capacity needs an SLO: pass slo={'ttft_ms': ...} or mark the test with infergate_slo")
        if self.search not in SEARCHES:
            raise OptionError(f"capacity search={self.search!r} must be one of {', '.join(SEARCHES)}")
        if not 0 < self.target_goodput <= 1:
            raise OptionError(f"capacity target_goodput={self.target_goodput!r} must be a fraction in (0, 1]")
        low, high = self.bounds
        if not 0 < low <= high:
            raise OptionError(f"capacity bounds={self.bounds!r} must be (low, high) with 0 < low <= high")
        if self.search == "concurrency" and (int(low) != low or int(high) != high):
            raise OptionError(f"capacity bounds={self.bounds!r}: a concurrency search takes whole numbers")
        for name in ("budget_s", "point_s", "resolution"):
            if not getattr(self, name) > 0:
                raise OptionError(f"capacity {name}={getattr(self, name)!r} must be positive")
        if self.min_requests < 1:
            raise OptionError(f"capacity min_requests={self.min_requests!r} must be at least 1")

    def pattern(self, load: float) -> LoadPattern:
        return LoadPattern(rate_per_s=load) if self.search == "rate" else LoadPattern(concurrency=int(load))

    def num_requests(self, load: float) -> int:
        wanted = load * self.point_s if self.search == "rate" else load * REQUESTS_PER_SLOT
        return max(self.min_requests, math.ceil(wanted))

    def grid(self) -> list[float]:
        low, high = self.bounds
        loads, load = [], low
        while load < high:
            loads.append(load)
            load *= 2
        return loads + [high]

    def between(self, passing: float, failing: float) -> float | None:
        """The next load to try, or None when the bracket is as narrow as wanted."""
        if self.search == "concurrency":
            return None if failing - passing <= 1 else float((int(passing) + int(failing)) // 2)
        return None if failing <= passing * (1 + self.resolution) else math.sqrt(passing * failing)


@dataclass
class CapacityPoint:
    load: float  # offered requests/s (rate search) or requests in flight (concurrency search)
    requests: int  # sent (the ones a stop cancelled are not counted)
    met: int  # succeeded within the SLO
    attainment: float
    ci: tuple[float, float]  # 95% Wilson interval of the attainment
    passed: bool | None  # None: cut by the time budget before it decided
    stopped: str  # "", "clearly over" (missed more than the target allows), "clearly met", "time budget"
    duration_s: float
    throughput_rps: float  # answered requests per second
    goodput_rps: float
    errors: dict[str, int] = field(default_factory=dict)  # failed requests by kind
    cancelled: int = 0  # in flight when the point stopped (not counted above)
    latency_ms: dict[str, float] = field(default_factory=dict)  # ttft_ms_p50, ..., e2e_ms_p999
    server: dict[str, float] = field(default_factory=dict)  # server /metrics figures of the point
    # the attainment's interval contains the target even after re-measuring: the SLO can be neither confirmed
    # nor refuted at this load; the search treats it as not passing (the capacity it reports is a resolved one)
    unresolved: bool = False
    remeasured: int = 0  # more batches of requests pooled into this point while its interval held the target

    @property
    def verdict(self) -> str:
        """pass / fail / unresolved (the target inside the interval) / undecided (cut by the time budget)."""
        if self.unresolved:
            return "unresolved"
        return {True: "pass", False: "fail", None: "undecided"}[self.passed]

    @classmethod
    def from_dict(cls, data: dict) -> CapacityPoint:
        point = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        point.ci = tuple(point.ci)
        return point


@dataclass
class CapacityResult:
    spec: CapacitySpec
    points: list[CapacityPoint]  # in the order measured
    capacity: float | None  # the highest passing load; None when even the lowest failed
    capacity_rps: float | None  # the rate (rate search) or the throughput at that concurrency
    bracket: tuple[float | None, float | None]  # (highest passing, lowest failing) load: where the knee lies
    reason: str  # why the search ended
    elapsed_s: float
    best_run: LoadRun | None = field(default=None, repr=False)  # the highest passing point's requests

    @property
    def best(self) -> CapacityPoint | None:
        passing = [p for p in self.points if p.passed]
        return max(passing, key=lambda p: p.load) if passing else None

    def describe(self) -> str:
        unit = "req/s" if self.spec.search == "rate" else "in flight"
        if self.capacity is None:
            return f"capacity: none within bounds {self.spec.bounds} ({self.reason})" + self._unresolved_text()
        point = self.best
        rps = "" if self.spec.search == "rate" else f" ({self.capacity_rps:.4g} req/s)"
        return (f"capacity {self.capacity:.4g} {unit}{rps}: SLO met by "
                f"{point.attainment:.1%} (95% CI {point.ci[0]:.1%}-{point.ci[1]:.1%}) of {point.requests} requests, "
                f"target {self.spec.target_goodput:.1%}; "
                + (f"knee between {self.bracket[0]:.4g} and {self.bracket[1]:.4g}" if self.bracket[1] is not None
                   else "no knee within the bounds")
                + f"; {self.reason}; "
                f"{len(self.points)} points in {self.elapsed_s:.1f}s" + self._unresolved_text())

    def _unresolved_text(self) -> str:
        unresolved = [p for p in self.points if p.unresolved]
        if not unresolved:
            return ""
        return "; unresolved (the SLO target inside the interval, not counted as passing): " + ", ".join(
            f"{p.load:.4g} ({p.attainment:.1%}, CI {p.ci[0]:.1%}-{p.ci[1]:.1%}, {p.requests} requests)"
            for p in unresolved)

    def to_dict(self) -> dict:
        spec = asdict(self.spec)
        spec["slo"] = asdict(self.spec.slo)
        return {"spec": spec, "points": [asdict(p) for p in self.points], "capacity": self.capacity,
                "capacity_rps": self.capacity_rps, "bracket": list(self.bracket), "reason": self.reason,
                "elapsed_s": self.elapsed_s, "description": self.describe()}

    @classmethod
    def from_dict(cls, data: dict) -> CapacityResult:
        """Read back what `to_dict` wrote (a Measurement's `engine["capacity"]`); the requests are not kept."""
        spec = dict(data["spec"])
        spec["slo"] = Slo(**spec["slo"])
        spec["bounds"] = tuple(spec["bounds"])
        return cls(CapacitySpec(**spec), [CapacityPoint.from_dict(p) for p in data.get("points", [])],
                   data.get("capacity"), data.get("capacity_rps"), tuple(data.get("bracket") or (None, None)),
                   data.get("reason", ""), float(data.get("elapsed_s", 0.0)))



def capacity_measurement(result: CapacityResult, label: str = "capacity") -> Measurement:
    """The search as a Measurement: `capacity_rps` (and `capacity_concurrency`) for budgets such as
    min_capacity_rps, 0 when no load passed; the latencies, goodput and server figures of the highest passing
    point (its success rate, or the lowest point's when none passed); the whole search in
    `engine["capacity"]` (every point: load, attainment and its CI, goodput, latency percentiles, server figures)
    for the report's goodput / latency vs load chart with the knee marked."""
    measurement = Measurement(label=label)
    measurement.samples["capacity_rps"] = [result.capacity_rps or 0.0]
    if result.spec.search == "concurrency":
        measurement.samples["capacity_concurrency"] = [result.capacity or 0.0]
    best = result.best
    if result.best_run is not None:
        for r in result.best_run.succeeded:
            add_request_latencies(measurement.samples, r.ttft_s, r.tpot_s, r.itl_s, r.e2e_s)
    shown = best or (result.points[0] if result.points else None)  # no passing load: the lowest one tried
    if shown is not None and shown.requests:
        measurement.samples["success_rate"] = [(shown.requests - sum(shown.errors.values())) / shown.requests]
    if best is not None:
        measurement.samples["goodput_per_s"] = [best.goodput_rps]
        measurement.samples["requests_per_s"] = [best.throughput_rps]
        for name, value in best.server.items():
            measurement.samples[name] = [value]
    measurement.repetitions = 1
    measurement.num_requests = sum(p.requests for p in result.points)
    measurement.num_failed = sum(sum(p.errors.values()) for p in result.points)
    measurement.engine.update(capacity=result.to_dict(), pattern=f"capacity search ({result.spec.search})",
                              slo=asdict(result.spec.slo))
    return measurement
