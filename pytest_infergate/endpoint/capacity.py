"""Capacity under an SLO, as `vllm bench sweep serve_sla` and guidellm's SLO search find it: the highest request
rate (or concurrency) at which a deployment still serves `target_goodput` of its requests within the SLO. A bounded
search: a coarse ascending sweep (doubling) up to the first failing point, then bisection until the last passing and
first failing points are `resolution` apart. Each point sends enough requests for `point_s` seconds (at least
`min_requests`) and stops once decided: it missed the SLO more often than the target allows, or, after
`min_requests`, the 95% interval of what it sent lies wholly above the target even if every request still in flight
misses (the requests that end first are the fast ones). The search stops within `budget_s`
(a point it cuts decides nothing); every request of every point ends in one counted outcome. Guide:
docs/guides/endpoint.md, 'Capacity under an SLO'. What it asks and finds, as records: endpoint.capacity_records.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from pytest_infergate import context
from pytest_infergate.endpoint.capacity_records import CapacityPoint, CapacityResult, CapacitySpec
from pytest_infergate.endpoint.client import NOT_SENT, EndpointClient, EndpointConfig, item_ids, warmup_request
from pytest_infergate.endpoint.load_run import LoadRun
from pytest_infergate.endpoint.loadgen import _run, coerce_items, run_load_async
from pytest_infergate.errors import OptionError
from pytest_infergate.measurement import PERCENTILES, percentile_suffix
from pytest_infergate.stats import percentile
from pytest_infergate.workloads.traffic import Session


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if not total:
        return 0.0, 1.0
    p = successes / total
    center = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, center - half), min(1.0, center + half)


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
    # lay above the target with every request then in flight counted as a miss)
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

        def decided(done, in_flight: int) -> bool:
            """Missed more often than the target allows, or met it at 95% even if every request still in flight
            misses: those that end first are the fast ones, and the ones still out may be the slow ones."""
            met = sum(1 for r in done if spec.slo.met(r))
            return (len(done) - met > allowed or len(done) >= spec.min_requests
                    and wilson(met, len(done) + in_flight)[0] > spec.target_goodput)

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
