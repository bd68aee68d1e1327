"""The served model's load tools beyond one load run (`infergate_endpoint.sweep()`, `.capacity()`,
`.synchronous_rps()`, docs/guides/endpoint.md): each point a load run of the test's ServedRuns, measured and gated as
any call of the bench is (gates.gating). No pytest here."""

from __future__ import annotations

from dataclasses import replace

from pytest_infergate.endpoint.capacity import search_capacity
from pytest_infergate.endpoint.capacity_records import CapacityResult, CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.load_run import LoadPattern
from pytest_infergate.endpoint.loadgen import sweep_patterns
from pytest_infergate.errors import InfergateError
from pytest_infergate.gates.endpoint import ServedRuns, failure_sample
from pytest_infergate.gates.gating import gate_measurement, gated, measure_planned
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.gate import PerfGate, PerfOutcome
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.stats import percentile
from pytest_infergate.status import ENDPOINT_CHECK, Finding, Status


def _measure_and_gate(runs: ServedRuns, requests, pattern: LoadPattern, slo, warmup: int, label: str, tags: dict | None
                      ) -> tuple[Measurement, PerfOutcome]:
    """(Measurement, PerfOutcome) of one load run, recorded with the test's result; failing is the caller's."""
    run = runs.load_run(runs.with_test_extras(requests), pattern, runs.slo(slo), label, tags)
    measurement, gate = measure_planned(runs.ctx, run, warmup, 1)
    return measurement, gated(runs.ctx, runs.target, run, measurement, gate)


def synchronous_rps(runs: ServedRuns, requests=None, *, warmup: int = 1) -> float:
    """Answered requests per second with one request at a time (measured once a session per workload and
    server): a suite's request rates sized from it pass on a small server and stress a big one (a fixed
    rate answers few requests on a server slower than it, docs/guides/endpoint.md). Fails the test when the
    server answered none."""
    requests = runs.with_test_extras(requests if requests is not None else runs.default_workload())
    try:
        run = runs.bench.synchronous_run(requests, runs.slo(None), warmup)
    except InfergateError as exc:
        runs.ctx.fail(f"{runs.ctx.test_id}: the synchronous run (one request at a time) failed: {exc}")
    rate = percentile(run.samples.get("requests_per_s") or [0.0], 50)
    if run.num_failed or not rate > 0:
        runs.ctx.fail(f"{runs.ctx.test_id}: the synchronous run (one request at a time) answered "
                      f"{run.num_requests - run.num_failed} of {run.num_requests} requests, so no load can be "
                      f"sized from it (check the server's log){failure_sample(run)}")
    runs.ctx.say(Finding(ENDPOINT_CHECK, runs.ctx.test_id, f"loads sized from the server's synchronous rate, "
                         f"{rate:.3g} req/s ({run.num_requests} requests one at a time)", status=Status.PASS))
    return rate


def sweep(runs: ServedRuns, requests=None, *, rates=None, concurrencies=None, points: int = 6, burstiness: float = 1.0,
          slo=None, warmup: int = 1, warmup_s: float = 0.0, cooldown_s: float = 0.0, label: str = "sweep",
          names: list[str] | None = None):
    """One load run per request rate (Poisson, or gamma with `burstiness`) or per concurrency, each recorded
    and gated with the test's budgets; the test fails after the whole sweep if any point failed. Returns
    [(LoadPattern, Measurement)]. With neither `rates` nor `concurrencies`, the sweep profile (guidellm's
    `--profile sweep`, endpoint/sweep.py): synchronous, throughput, then `points` - 2 Poisson rates evenly
    between, with the knee and the best goodput marked in the records. `warmup_s` / `cooldown_s`: seconds of
    each run whose requests are sent but not counted (LoadPattern). `names`: each point's name in its
    measurement key (default: its rate or concurrency; name points whose rates follow the server's speed, so
    that a baseline finds them)."""
    requests = requests if requests is not None else runs.default_workload()
    window = dict(warmup_s=warmup_s, cooldown_s=cooldown_s)
    if rates is None and concurrencies is None:
        return _sweep_profile(runs, requests, points, slo, warmup, window, label)
    out, failures = [], []
    try:
        patterns = [replace(p, **window) for p in sweep_patterns(rates, concurrencies, burstiness)]
    except InfergateError as exc:
        runs.ctx.fail(str(exc))
    if names is not None and len(names) != len(patterns):
        runs.ctx.fail(f"{runs.ctx.test_id}: sweep(names=...) names {len(names)} points, the sweep has "
                      f"{len(patterns)}: give one name per rate or concurrency")
    for index, pattern in enumerate(patterns):
        point = (f"{label}-{names[index]}" if names is not None else f"{label}-rate{pattern.rate_per_s:g}"
                 if rates else f"{label}-c{pattern.concurrency}")
        measurement, outcome = _measure_and_gate(runs, requests, pattern, slo, warmup if index == 0 else 0,
                                                      point, {"experiment": label})
        out.append((pattern, measurement))
        if outcome.failed:
            failures.append(f"{point}:\n{outcome.message()}")
    if failures:
        runs.ctx.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures))
    return out


def _sweep_profile(runs: ServedRuns, requests, points: int, slo, warmup: int, window: dict, label: str):
    """Every point measured first, then each recorded and gated: the knee and the best goodput are known only
    at the end, and a record is written once."""
    from pytest_infergate.endpoint import sweep

    requests, slo = runs.with_test_extras(requests), runs.slo(slo)  # the rates path: in _measure_and_gate
    measured: list[tuple[sweep.SweepPoint, Measurement, PerfGate, PerfRecord]] = []

    def run(role: str, pattern: LoadPattern, name: str) -> sweep.SweepPoint:
        load = runs.load_run(requests, pattern, slo, f"{label}-{name}", None)
        measurement, gate = measure_planned(runs.ctx, load, warmup if not measured else 0, 1, rewarmup=0)
        point = sweep.SweepPoint.of(role, pattern, measurement.samples)
        measured.append((point, measurement, gate, load.record))
        return point

    try:
        sweep.rates_between(1.0, 2.0, points)  # the point count, checked before any load is sent
        synchronous = run(sweep.SYNCHRONOUS, LoadPattern(concurrency=1, **window), "sync")
        ceiling = run(sweep.THROUGHPUT, LoadPattern(concurrency=runs.bench.config.max_concurrency, **window),
                      "throughput")
        # named by their place, not their rate: the rates follow the server's speed, a baseline key must not
        rates = sweep.rates_between(synchronous.achieved_rps, ceiling.achieved_rps, points)
        for index, rate in enumerate(rates, 1):
            run(sweep.RATE, LoadPattern(rate_per_s=rate, **window), f"rate-{index}-of-{len(rates)}")
    except InfergateError as exc:
        runs.ctx.fail(f"{runs.ctx.test_id}: {exc}")
    found = [point for point, _, _, _ in measured]
    knee, best, line = sweep.knee(found), sweep.best_goodput(found), sweep.describe(found)
    failures = []
    for point, measurement, gate, record in measured:
        tags = {"experiment": label, "sweep": point.role, "knee": point is knee, "best_goodput": point is best}
        record = replace(record, measurement=measurement, tags={**record.tags, **tags})
        outcome = gate_measurement(runs.ctx, runs.target, record, notes=[line], gate=gate)
        if outcome.failed:
            failures.append(f"{record.label}:\n{outcome.message()}")
    if failures:
        runs.ctx.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures))
    return [(point.pattern, measurement) for point, measurement, _, _ in measured]


def capacity(runs: ServedRuns, requests=None, *, slo=None, target_goodput: float = 0.99, search: str = "rate",
             bounds=None, budget_s: float = 300.0, point_s: float = 10.0, min_requests: int = 20,
             resolution: float = 0.1, warmup: int = 1, label: str = "capacity") -> CapacityResult:
    """The highest request rate (`search="rate"`, Poisson arrivals) or concurrency at which the server still
    meets the SLO (`slo`, or the `infergate_slo` marker) for `target_goodput` of the requests: a coarse
    doubling sweep over `bounds` (default 0.5-64 req/s, or 1 to --infergate-endpoint-concurrency), then
    bisection to `resolution`; each point sends enough requests for `point_s` seconds (at least
    `min_requests`) and stops once it is decided (it can no longer pass, or its interval lies above the target);
    the search stops within `budget_s`. Recorded and
    gated like a load run: `min_capacity_rps=12` in the test's budget fails it below 12 req/s."""
    requests = runs.with_test_extras(requests if requests is not None else runs.default_workload())
    if bounds is None:
        bounds = (0.5, 64.0) if search == "rate" else (1, runs.bench.config.max_concurrency)
    try:
        spec = CapacitySpec(runs.slo(slo), target_goodput, search, tuple(bounds), budget_s, point_s,
                            min_requests, resolution)
        result = search_capacity(runs.bench.config, requests, spec, warmup)
    except InfergateError as exc:
        runs.ctx.fail(f"{runs.ctx.test_id}: {exc}")
    measurement = capacity_measurement(result, label)
    record = runs.record(label, measurement, {"experiment": "capacity", "search": search})
    outcome = gate_measurement(runs.ctx, runs.target, record, notes=[result.describe()])
    if outcome.failed:
        runs.ctx.fail(f"infergate capacity gate failed for {runs.ctx.measurement_key(label)}:\n"
                      f"{outcome.message()}\n{result.describe()}")
    return result

