"""Capacity under an SLO, as `vllm bench sweep serve_sla` and guidellm's SLO search find it: the highest request
rate (or concurrency) at which a deployment still serves `target_goodput` of its requests within the SLO. A bounded
search: a coarse ascending sweep (doubling) up to the first failing point, then bisection until the last passing and
first failing points are `resolution` apart. Each point sends enough requests for `point_s` seconds (at least
`min_requests`) and stops once decided: it missed the SLO more often than the target allows, or, after
`min_requests`, the 95% interval of what it sent lies wholly above the target. The search stops within `budget_s`
(a point it cuts decides nothing); every request of every point ends in one counted outcome. Guide:
docs/guides/endpoint.md, 'Capacity under an SLO'.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace

from pytest_infergate import context
from pytest_infergate.endpoint.client import NOT_SENT, EndpointClient, EndpointConfig, item_ids, warmup_request
from pytest_infergate.endpoint.loadgen import LoadPattern, LoadRun, Slo, _run, coerce_items, run_load_async
from pytest_infergate.errors import OptionError
from pytest_infergate.measurement import PERCENTILES, Measurement, add_request_latencies, percentile_suffix
from pytest_infergate.stats import percentile
from pytest_infergate.workloads.traffic import Session

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


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if not total:
        return 0.0, 1.0
    p = successes / total
    center = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, center - half), min(1.0, center + half)


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


MAX_REMEASURE = 1  # pooled batches added to a point whose interval holds the target


def straddles(met: int, sent: int, target: float) -> bool:
    """Some requests met the SLO and some did not, and the attainment's interval holds the target: at this many
    requests it cannot be told from it. A run where every request met the SLO (or none did) is decided by the
    count: it is the best evidence that many requests can give (confirming 90% at 95% confidence without a miss
    would take 29 requests, 99% 299), and the verdict says how many there were."""
    if not 0 < target < 1 or not 0 < met < sent:
        return False
    low, high = wilson(met, sent)
    return low < target < high


def _pooled(first: LoadRun, more: LoadRun) -> LoadRun:
    return LoadRun(first.pattern, first.results + more.results, first.duration_s + more.duration_s, first.slo,
                   more.server_metrics or first.server_metrics, more.stopped, first.started)


def _point(spec: CapacitySpec, load: float, run: LoadRun) -> CapacityPoint:
    sent = run.sent
    met = sum(spec.slo.met(r) for r in sent)
    attainment = met / len(sent) if sent else 0.0
    ci = wilson(met, len(sent)) if sent else (0.0, 1.0)
    # a stop decides the point either way: clearly over (missed more than allowed), or clearly met (the interval
    # of what was sent lies above the target)
    clearly_met = run.stopped == "stopped early" and ci[0] > spec.target_goodput
    clearly_over = run.stopped == "stopped early" and not clearly_met
    if run.stopped == "deadline":
        passed = None
    else:
        passed = not clearly_over and bool(sent) and attainment >= spec.target_goodput
    ok = [r for r in sent if r.ok]
    latency = {}
    for name, values in (("ttft_ms", [r.ttft_s for r in ok]), ("tpot_ms", [r.tpot_s for r in ok]),
                         ("e2e_ms", [r.e2e_s for r in ok])):
        values = [v * 1000 for v in values if v is not None]
        for pct in PERCENTILES if values else ():
            latency[f"{name}_{percentile_suffix(pct)}"] = percentile(values, pct)
    duration = run.duration_s or 1e-9
    if passed is not None and not run.stopped and straddles(met, len(sent), spec.target_goodput):
        passed = False  # not shown to meet the target: never a capacity until resolved (see `unresolved`)
    return CapacityPoint(load, len(sent), met, attainment, ci, passed,
                         "clearly met" if clearly_met else "clearly over" if clearly_over else
                         {"deadline": "time budget"}.get(run.stopped, ""),
                         run.duration_s, len(ok) / duration, met / duration,
                         {k: v for k, v in run.errors.items() if k not in NOT_SENT},
                         len(run.results) - len(sent), latency,
                         run.server_metrics.figures() if run.server_metrics is not None else {})


def search_capacity(config: EndpointConfig, requests: list, spec: CapacitySpec, warmup: int = 1,
                    on_point=None) -> CapacityResult:
    """Run the search (see the module docstring) with `requests` cycled through as each point needs them.
    `on_point(CapacityPoint, LoadRun)` is called after each point (e.g. to record it)."""
    items = coerce_items(requests, config.api)
    if not items:
        raise OptionError("capacity needs at least one request to send")

    async def main() -> CapacityResult:
        async with EndpointClient(config) as client:
            if client.model is None:
                await client.discover_model()
            for item in items[:warmup]:
                await client.send(warmup_request(item, client.config.api))
            return await _search(client, items, spec, on_point)

    return _run(main())


async def _search(client: EndpointClient, items: list, spec: CapacitySpec, on_point) -> CapacityResult:
    start = time.perf_counter()
    deadline = start + spec.budget_s
    points: list[CapacityPoint] = []
    runs: dict[float, LoadRun] = {}

    async def measure(load: float) -> CapacityPoint:
        count = spec.num_requests(load)
        batch = [_renamed(items[i % len(items)], f"c{len(points)}-{i}") for i in range(count)]
        planned = sum(len(item_ids(item)) for item in batch)  # a session sends one request per turn
        allowed = math.floor((1 - spec.target_goodput) * planned + 1e-9)

        def decided(done) -> bool:
            met = sum(1 for r in done if spec.slo.met(r))
            return (len(done) - met > allowed
                    or len(done) >= spec.min_requests and wilson(met, len(done))[0] > spec.target_goodput)

        run = await run_load_async(client, batch, spec.pattern(load), spec.slo, stop=decided,
                                   deadline=deadline)
        point, remeasured = _point(spec, load, run), 0
        # a point stopped early is decided: clearly over by its count, or clearly met by its interval
        while (straddles(point.met, point.requests, spec.target_goodput) and not point.stopped
               and remeasured < MAX_REMEASURE and time.perf_counter() < deadline):
            remeasured += 1  # the same load again, pooled: more requests narrow the interval
            again = [_renamed(items[i % len(items)], f"c{len(points)}-r{remeasured}-{i}") for i in range(count)]
            run = _pooled(run, await run_load_async(client, again, spec.pattern(load), spec.slo,
                                                    deadline=deadline))
            point = _point(spec, load, run)
        point.remeasured = remeasured
        point.unresolved = not point.stopped and straddles(point.met, point.requests, spec.target_goodput)
        points.append(point)
        context.report(f"capacity point {load:g}: {point.verdict}, SLO met by {point.attainment:.0%} of "
                        f"{point.requests}; {max(0.0, deadline - time.perf_counter()):.0f} s of the search's budget "
                        "left")
        runs[load] = run
        if on_point is not None:
            on_point(point, run)
        return point

    async def verdict(load: float) -> bool | None:
        """Whether `load` passed; None when the time budget ran out before it decided."""
        if time.perf_counter() >= deadline:
            return None
        return (await measure(load)).passed

    passing, failing, reason = None, None, ""
    for load in spec.grid():  # coarse: doubling up to the first failing point
        passed = await verdict(load)
        if passed is None:
            reason = "time budget spent"
            break
        if not passed:
            failing = load
            break
        passing = load
    else:
        reason = f"the upper bound {spec.bounds[1]:g} passed: the capacity is at least that"
    while not reason and passing is not None:  # bisection between the last pass and the first failure
        load = spec.between(passing, failing)
        passed = None if load is None else await verdict(load)
        if passed is None:
            reason = "bracket resolved" if load is None else "time budget spent"
        else:
            passing, failing = (load, failing) if passed else (passing, load)
    if not reason:
        reason = f"the lowest load {spec.bounds[0]:g} already misses the SLO"
    best = next((p for p in points if p.load == passing and p.passed), None)
    capacity_rps = None if best is None else (passing if spec.search == "rate" else best.throughput_rps)
    return CapacityResult(spec, points, passing, capacity_rps, (passing, failing), reason,
                          time.perf_counter() - start, runs.get(passing) if best is not None else None)


def _renamed(item, name: str):
    return replace(item, session_id=name) if isinstance(item, Session) else replace(item, request_id=name)


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
