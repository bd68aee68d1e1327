"""Measure a workload against an endpoint under a load pattern and turn it into a Measurement, the same shape the
reference engine's bench produces, so budgets, baselines and the report treat both alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pytest_infergate.endpoint.client import EndpointConfig
from pytest_infergate.endpoint.load import LoadPattern, LoadRun, Slo, add_to_measurement, discover_model, run_load
from pytest_infergate.measurement import Measurement


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
                until: Callable[[Measurement], bool] | None = None) -> Measurement:
        """At least `repeats` load runs, more until `until` (asked after each) says enough, at most `max_repeats`."""
        pattern, slo = pattern or LoadPattern(), slo or Slo()
        measurement = Measurement(label=label)
        while measurement.repetitions < max(repeats, max_repeats or 0):
            self.run_once(requests, pattern, slo, warmup, measurement)
            enough = until is None or until(measurement)
            if measurement.repetitions >= repeats and enough:
                break
        return measurement
