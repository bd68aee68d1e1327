"""EndpointPerfBench, the object behind `infergate_endpoint` (and `infergate_bench` with --infergate-endpoint):
load runs against the live server, gated like the engine's measurements. No pytest here."""

from __future__ import annotations

from pytest_infergate.context import ENDPOINT_PRECISION, TestContext
from pytest_infergate.endpoint.load import LoadPattern, Slo, sweep_patterns
from pytest_infergate.errors import InfergateError
from pytest_infergate.perf.fixture import gate_measurement
from pytest_infergate.perf.gate import PerfOutcome
from pytest_infergate.perf.metrics import Measurement
from pytest_infergate.results.records import PerfRecord


class EndpointPerfBench:
    """Returned by `infergate_endpoint`, and by `infergate_bench` with --infergate-endpoint; see their docstrings."""

    def __init__(self, ctx: TestContext, bench, tokenizer_source):
        self.ctx = ctx
        self.bench = bench  # EndpointBench
        self._tokenizer_source = tokenizer_source  # the local tokenizer sizes workload prompts; loaded on demand

    def default_workload(self, num_requests: int = 16):
        from pytest_infergate.workloads import chat_workload

        return chat_workload(self._tokenizer_source(), num_requests, prompt_tokens=(20, 200), max_new_tokens=(16, 48))

    def __call__(self, requests=None, config=None, *, warmup: int = 1, repeats: int = 1, min_time_s: float = 0.0,
                 label: str = "", tags: dict | None = None, pattern=None, slo=None):
        """The reference engine's `infergate_bench` call, against the endpoint: an EngineConfig's max_batch_size
        becomes the concurrency; engine experiments (cache modes, static/dynamic batching) cannot be run on a
        server and are skipped."""
        if config is not None and (config.batching != "continuous" or config.cache_mode != "paged"):
            self.ctx.skip(f"engine experiment (batching={config.batching}, cache_mode={config.cache_mode}): a "
                          "server's batching and KV cache are its own; run it without --infergate-endpoint")
        if pattern is None:
            pattern = LoadPattern(concurrency=config.max_batch_size if config is not None else None)
        return self.load(requests, pattern, slo, warmup=warmup, repeats=repeats, label=label, tags=tags)

    def load(self, requests=None, pattern=None, slo=None, *, warmup: int = 1, repeats: int = 1, label: str = "",
             tags: dict | None = None) -> Measurement:
        """Run `requests` (default: 16 chat requests) against the endpoint in `pattern` (a LoadPattern, or a dict
        such as {"rate_per_s": 4, "burstiness": 0.5} or {"concurrency": 8}) `repeats` times, and gate the result
        with the test's budgets. `slo` (or the `infergate_slo` marker) defines goodput. Returns the Measurement."""
        pattern = LoadPattern(**pattern) if isinstance(pattern, dict) else (pattern or LoadPattern())
        measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup, repeats, label, tags)
        if outcome.failed:
            self.ctx.fail(f"infergate perf gate failed for {self.ctx.measurement_key(label)} (endpoint, "
                          f"{pattern.describe()}):\n{outcome.message()}" + _failure_sample(measurement))
        return measurement

    def _measure_and_gate(self, requests, pattern: LoadPattern, slo, warmup: int, repeats: int, label: str,
                          tags: dict | None) -> tuple[Measurement, PerfOutcome]:
        """(Measurement, PerfOutcome) of one load run, recorded with the test's result; failing is the caller's."""
        requests = requests if requests is not None else self.default_workload()
        slo = self._slo(slo)
        measurement = self.bench.measure(requests, pattern, slo, warmup=warmup, repeats=repeats, label=label)
        record = PerfRecord(test=self.ctx.measurement_key(label), label=label, precision=ENDPOINT_PRECISION,
                            status=PerfOutcome().status, measurement=measurement, backend="endpoint",
                            engine_config={"backend": "endpoint", "url": self.bench.config.base_url,
                                           "served_model": self.bench.model, "pattern": pattern.describe()},
                            tags={"pattern": pattern.describe(), **(tags or {})}, fingerprint=self.bench.fingerprint())
        outcome = gate_measurement(self.ctx, record, remeasure=lambda: self.bench.run_once(
            requests, pattern, slo, warmup, measurement))
        return measurement, outcome

    def sweep(self, requests=None, *, rates=None, concurrencies=None, burstiness: float = 1.0, slo=None,
              warmup: int = 1, label: str = "sweep"):
        """One load run per request rate (Poisson, or gamma with `burstiness`) or per concurrency, each recorded
        and gated with the test's budgets; the test fails after the whole sweep if any point failed. Returns
        [(LoadPattern, Measurement)]."""
        requests = requests if requests is not None else self.default_workload()
        points, failures = [], []
        for index, pattern in enumerate(sweep_patterns(rates, concurrencies, burstiness)):
            point = f"{label}-rate{pattern.rate_per_s:g}" if rates else f"{label}-c{pattern.concurrency}"
            measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup if index == 0 else 0, 1,
                                                          point, {"experiment": label})
            points.append((pattern, measurement))
            if outcome.failed:
                failures.append(f"{point}:\n{outcome.message()}")
        if failures:
            self.ctx.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures))
        return points

    def ab(self, *args, **kwargs):
        self.ctx.skip("interleaved A/B compares two local models; with --infergate-endpoint compare runs with "
                      "--infergate-baseline instead")

    def _slo(self, slo) -> Slo:
        if isinstance(slo, Slo):
            return slo
        values = {}
        for kwargs in self.ctx.markers("infergate_slo"):
            values.update(kwargs)
        values.update(slo or {})
        try:
            return Slo.parse(values)
        except InfergateError as exc:
            self.ctx.fail(f"{self.ctx.test_id}: {exc}")


def _failure_sample(measurement: Measurement) -> str:
    failures = measurement.engine.get("failures") or []
    if not failures:
        return ""
    return "\nfailed requests (first ones): " + "; ".join(f"{f['request_id']}: {f['error']} {f['detail'][:80]}"
                                                          for f in failures[:3])
