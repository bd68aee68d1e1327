"""Load patterns against an endpoint, as `vllm bench serve` and guidellm drive them: a fixed number of requests
in flight (closed loop), a request rate with Poisson or gamma-bursty arrivals (open loop, optionally capped
in flight), a recorded trace replayed on its own timestamps, and sweeps over either. Goodput counts the requests
that met every SLO. The server's Prometheus metrics are scraped around every run (endpoint/server_metrics.py).
`EndpointBench` turns a workload's load runs into a Measurement (endpoint.load_run: a run's pattern, SLO, results and
figures), the same shape the reference engine's bench produces, so budgets, baselines and the report treat both
alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from pytest_infergate.context import Steps
from pytest_infergate.endpoint.client import (
    EndpointClient,
    EndpointConfig,
    EndpointRequest,
    drive,
    warmup_request,
)
from pytest_infergate.endpoint.load_run import LoadPattern, LoadRun, Slo, add_to_measurement
from pytest_infergate.endpoint.server_metrics import MetricsScraper
from pytest_infergate.errors import OptionError
from pytest_infergate.measurement import Measurement
from pytest_infergate.workloads.traffic import Session


def coerce_items(items: list, api: str) -> list:
    """EndpointRequests (engine Requests translated) and Sessions; a request without an id is named `r<index>`
    and a session `s<index>` (failures are reported by id); the caller's objects are not changed."""
    out = []
    for index, item in enumerate(items):
        if isinstance(item, Session):
            out.append(item if item.session_id else replace(item, session_id=f"s{index}"))
            continue
        request = EndpointRequest.coerce(item, api)
        out.append(replace(request, request_id=request.request_id or f"r{index}"))
    return out


async def run_load_async(client: EndpointClient, items: list, pattern: LoadPattern, slo: Slo = Slo(),
                         stream: bool = True, *, stop=None, deadline: float | None = None,
                         scrape: bool = True) -> LoadRun:
    """One load run of coerced `items` (see coerce_items); `stop` / `deadline` as in client.drive. The server's
    /metrics are scraped before, during and after it unless `scrape` is False."""
    concurrency = pattern.concurrency or client.config.max_concurrency
    offsets = pattern.offsets_for(items)
    if not scrape:
        outcome = await drive(client, items, offsets, concurrency, stream, stop, deadline)
        return LoadRun(pattern, outcome.results, outcome.duration_s, slo, None, outcome.stopped, outcome.started)
    async with MetricsScraper(client.config.prometheus_url, client.config.headers()) as scraper:
        outcome = await drive(client, items, offsets, concurrency, stream, stop, deadline)
    return LoadRun(pattern, outcome.results, outcome.duration_s, slo, scraper.result, outcome.stopped,
                   outcome.started)


def run_load(config: EndpointConfig, requests: list, pattern: LoadPattern = LoadPattern(), slo: Slo = Slo(),
             stream: bool = True, warmup: int = 0, scrape: bool = True, **drive_options) -> LoadRun:
    """Drive `requests` (EndpointRequest, the engine's Request in the configured API, or multi-turn Sessions)
    through the endpoint in `pattern` and return every request's result. `warmup` requests (the first ones,
    shortened; a session's first turn) go first, one at a time, and are not counted."""
    items = coerce_items(requests, config.api)

    async def main() -> LoadRun:
        async with EndpointClient(config) as client:
            if client.model is None:  # the session probe names it once; a busy server need not be asked again
                await client.discover_model()
            for item in items[:warmup]:
                await client.send(warmup_request(item, client.config.api))
            return await run_load_async(client, items, pattern, slo, stream, scrape=scrape, **drive_options)

    return _run(main())


def discover_model(config: EndpointConfig) -> str:
    async def main() -> str:
        async with EndpointClient(config) as client:
            return await client.discover_model()

    return _run(main())


def sweep_patterns(rates: list[float] | None = None, concurrencies: list[int] | None = None,
                   burstiness: float = 1.0, seed: int = 0) -> list[LoadPattern]:
    if bool(rates) == bool(concurrencies):
        raise OptionError("a sweep takes either rates=[...] (requests per second) or concurrencies=[...]")
    if rates:
        return [LoadPattern(rate_per_s=r, burstiness=burstiness, seed=seed) for r in rates]
    return [LoadPattern(concurrency=c) for c in concurrencies]


def _run(coroutine):
    """asyncio.run, also from inside a running event loop (then on a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class EndpointBench:
    """Measurements of one endpoint. The served model name is looked up once (GET /v1/models) and kept in
    `config`, so every later request names it without asking the server again."""

    def __init__(self, config: EndpointConfig):
        self.config = config
        self._synchronous: dict[str, Measurement] = {}  # synchronous_run's, by workload

    def synchronous_run(self, requests: list, slo: Slo, warmup: int = 1) -> Measurement:
        """The workload one request at a time (concurrency 1, guidellm's synchronous run), measured once a session
        for each workload: what the server does with no queue, the yardstick a suite sizes its loads from."""
        key = repr(requests)
        if key not in self._synchronous:
            self._synchronous[key] = self.measure(requests, LoadPattern(concurrency=1), slo, warmup=warmup,
                                                  label="synchronous")
        return self._synchronous[key]

    @property
    def model(self) -> str:
        if self.config.model is None:
            self.config = replace(self.config, model=discover_model(self.config))
        return self.config.model

    def fingerprint(self) -> dict:
        """What an endpoint measurement depends on, as far as the client can see."""
        return {"backend": "endpoint", "url": self.config.base_url, "served_model": self.model,
                "api": self.config.api}

    def run_once(self, requests: list, pattern: LoadPattern, slo: Slo, warmup: int, into: Measurement) -> LoadRun:
        served = self.model
        run = run_load(self.config, requests, pattern, slo, warmup=warmup)
        add_to_measurement(run, into)
        into.engine.update(backend="endpoint", url=self.config.base_url, served_model=served, api=self.config.api)
        return run

    def measure(self, requests: list, pattern: LoadPattern | None = None, slo: Slo | None = None, *,
                warmup: int = 1, repeats: int = 1, label: str = "", max_repeats: int | None = None,
                until: Callable[[Measurement], bool] | None = None, progress: Steps | None = None) -> Measurement:
        """At least `repeats` load runs, more until `until` (asked after each) says enough, at most `max_repeats`;
        each counted on `progress` (the terminal's line)."""
        pattern, slo = pattern or LoadPattern(), slo or Slo()
        measurement = Measurement(label=label)
        most = max(repeats, max_repeats or 0)
        while measurement.repetitions < most:
            self.run_once(requests, pattern, slo, warmup, measurement)
            enough = until is None or until(measurement)
            done = (measurement.repetitions >= repeats and enough) or measurement.repetitions >= most
            if progress is not None:
                progress.step(measurement.repetitions, finished=done)
            if done:
                break
        return measurement
