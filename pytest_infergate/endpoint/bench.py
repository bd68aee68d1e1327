"""Measure a workload against an endpoint under a load pattern and turn it into a Measurement, the same shape the
reference engine's bench produces, so budgets, baselines and the report treat both alike."""

from __future__ import annotations

from dataclasses import replace

from pytest_infergate.endpoint.client import EndpointConfig
from pytest_infergate.endpoint.load import LoadPattern, LoadRun, Slo, add_to_measurement, discover_model, run_load
from pytest_infergate.measurement import Measurement


class EndpointBench:
    """Measurements of one endpoint. The served model name is looked up once (GET /v1/models) and kept in
    `config`, so every later request names it without asking the server again."""

    def __init__(self, config: EndpointConfig):
        self.config = config

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
                warmup: int = 1, repeats: int = 1, label: str = "") -> Measurement:
        pattern, slo = pattern or LoadPattern(), slo or Slo()
        measurement = Measurement(label=label)
        for _ in range(repeats):
            self.run_once(requests, pattern, slo, warmup, measurement)
        return measurement
