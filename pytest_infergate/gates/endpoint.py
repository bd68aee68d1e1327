"""The served model at --infergate-endpoint bound to one test (`ServedRuns`, gates.target.Runs): its workloads, a
load run against the live server in a pattern (`infergate_endpoint`, and `infergate_bench` with
--infergate-endpoint), measured and gated as the engine's are (gates.gating), and its interleaved A/B against
--infergate-reference-endpoint; the load tools built on its load runs (sweeps, the capacity search, the synchronous
rate) are gates.served_loads. No pytest here."""

from __future__ import annotations

from dataclasses import replace

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.endpoint.load_run import LoadPattern, Slo
from pytest_infergate.errors import InfergateError
from pytest_infergate.gates.ab import AbSides
from pytest_infergate.gates.gating import WorkloadRun
from pytest_infergate.gates.pair import REFERENCE_ENDPOINT
from pytest_infergate.gates.target import SPEEDUP, Served
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.interleaved import by_repetition
from pytest_infergate.perf.outcome import Route
from pytest_infergate.perf.repetitions import RepetitionPlan
from pytest_infergate.requirements import require_local_model_stack
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.status import ENDPOINT_CHECK, ENGINE_CHECK, Finding

# a speed experiment compares two EngineConfigs; a server's batching and KV cache are its own
NO_SPEEDUP = ("speedup() compares two EngineConfigs on the reference engine, and a server's configs are its own: "
              "run it without --infergate-endpoint (or compare two deployments with ab() and "
              "--infergate-reference-endpoint)")


class ServedRuns:
    """The load runs of one test against the server (`bench`, an EndpointBench) and, for ab(), the reference
    server (`reference`, an EndpointBench of --infergate-reference-endpoint, or None)."""

    defaults = (1, 1)  # a call's warm-up requests and repetitions

    def __init__(self, ctx: TestContext, bench, tokenizer_source, reference=None):
        self.ctx = ctx
        self.target = Served()  # what the gate asks
        self.bench = bench  # EndpointBench
        self.reference = reference
        self._tokenizer_source = tokenizer_source  # the local tokenizer sizes workload prompts; loaded on demand

    def cannot(self, what: str) -> str | None:
        return NO_SPEEDUP if what == SPEEDUP else None

    def default_workload(self, num_requests: int | None = None):
        return self.workload(num_requests or 16)

    def workload(self, num_requests: int = 16, prompt_tokens=(20, 200), max_new_tokens=(16, 48), seed: int = 0,
                 fixed_output: bool = False):
        """Chat requests whose prompts the local tokenizer sizes (`prompt_tokens`, a (low, high) range;
        answers capped at `max_new_tokens`, a range too). In an install without torch (endpoint gating only) there is no
        local tokenizer: under --infergate-endpoint-api=completions the server's /tokenize sizes them instead
        (token_exact_workload: answers exactly `max_new_tokens`); with the chat API the test fails naming that fix.
        `fixed_output`: every answer exactly its `max_new_tokens` (ignore_eos)."""
        try:
            require_local_model_stack("a chat workload sized by the local tokenizer")
        except InfergateError as exc:
            if self.bench.config.api != "completions":
                self.ctx.fail(f"{exc}. Or run with --infergate-endpoint-api=completions: prompts are then sized by "
                              "the server's /tokenize")
            return self.token_exact_workload(num_requests, prompt_tokens, max_new_tokens, seed)
        from pytest_infergate.workloads import chat_workload

        return chat_workload(self._tokenizer_source(), num_requests, prompt_tokens=prompt_tokens,
                             max_new_tokens=max_new_tokens, seed=seed, fixed_output=fixed_output)

    def token_exact_workload(self, num_requests: int = 16, input_tokens=(20, 200), output_tokens=32, seed: int = 0):
        """Completions requests of exactly `input_tokens` prompt tokens and `output_tokens` answer tokens (each a
        count or a (low, high) range), sized by the server's own /tokenize: no local tokenizer needed (run with
        --infergate-endpoint-api=completions). A server without /tokenize fails the test naming the fix."""
        from pytest_infergate.endpoint.exchange import token_exact_requests

        try:
            return token_exact_requests(self.bench.config, num_requests, input_tokens, output_tokens, seed,
                                        self.bench.model)
        except InfergateError as exc:
            self.ctx.fail(str(exc))

    def workload_run(self, requests, config, label: str, tags: dict | None, options: dict) -> WorkloadRun:
        """An EngineConfig's max_batch_size becomes the concurrency; engine experiments (cache modes,
        static/dynamic batching) cannot be run on a server and are skipped."""
        unknown = sorted(set(options) - {"pattern", "slo"})
        if unknown:
            self.ctx.fail(f"{self.ctx.test_id}: infergate_bench got unknown argument(s) {', '.join(unknown)}")
        if getattr(config, "batching", "continuous") != "continuous" or getattr(config, "cache_mode",
                                                                                "paged") != "paged":
            self.ctx.skip(Finding(ENGINE_CHECK, self.ctx.test_id, f"engine experiment (batching={config.batching}, "
                                  f"cache_mode={config.cache_mode}): a server's batching and KV cache are its own",
                                  "run it without --infergate-endpoint"))
        requests = self.with_test_extras(requests if requests is not None else self.default_workload())
        pattern = self.pattern(options.get("pattern"), config)
        return self.load_run(requests, pattern, self.slo(options.get("slo")), label, tags)

    def load_run(self, requests: list, pattern: LoadPattern, slo: Slo, label: str, tags: dict | None) -> WorkloadRun:
        """One load run's WorkloadRun: `requests` (the test's extras added) in `pattern`, goodput against `slo`."""
        bench = self.bench

        def measure(plan: RepetitionPlan | None, *, warmup: int, repeats: int, min_time_s: float, until,
                    decided, progress) -> Measurement:
            return bench.measure(requests, pattern, slo, warmup=warmup, repeats=plan.least if plan else repeats,
                                 label=label, max_repeats=plan.most if plan else repeats, until=until,
                                 progress=progress)

        def extend(measurement: Measurement, warmup: int) -> None:
            bench.run_once(requests, pattern, slo, warmup, measurement)

        record = self.record(label, Measurement(label=label), {"pattern": pattern.describe(), **(tags or {})})
        return WorkloadRun(record, requests, pattern, measure, extend, f" (endpoint, {pattern.describe()})",
                           failure_sample)

    def elsewhere(self, run: WorkloadRun, warmup: int, repeats: int) -> None:
        return None  # a served model is measured where it is served

    def pattern(self, pattern, config=None) -> LoadPattern:
        if pattern is None and isinstance(config, (dict, LoadPattern)):  # ab(requests, {"concurrency": 4})
            pattern, config = config, None
        if isinstance(pattern, LoadPattern):
            return pattern
        if isinstance(pattern, dict):
            try:
                return LoadPattern(**pattern)
            except TypeError:
                self.ctx.fail(f"load pattern {pattern!r}: its keys are concurrency, rate_per_s, burstiness, seed, "
                              "replay, warmup_s, cooldown_s")
            except InfergateError as exc:
                self.ctx.fail(str(exc))
        return LoadPattern(concurrency=config.max_batch_size if config is not None else None)

    def with_test_extras(self, requests: list) -> list:
        """Each request (engine Request, EndpointRequest or Session) with the test's `infergate_extra_body`
        fields added under its own (a request's own field wins)."""
        extras: dict = {}
        for kwargs in self.ctx.marker_kwargs("infergate_extra_body"):
            extras.update(kwargs)
        if not extras:
            return requests
        return [replace(item, extra_body={**extras, **item.extra_body}) for item in requests]

    def ab_sides(self, requests, config, label: str, rounds: int, warmup: int, options: dict) -> AbSides:
        """--infergate-reference-endpoint (A) and --infergate-endpoint (B) run the same load alternately; without a
        reference endpoint the test is skipped."""
        if self.reference is None:
            self.ctx.skip(Finding(ENDPOINT_CHECK, self.ctx.test_id, "an A/B against an endpoint needs the other "
                                  "deployment", "pass --infergate-reference-endpoint URL (or compare runs with "
                                  "--infergate-baseline)"))
        unknown = sorted(set(options) - {"pattern", "slo", "baseline_model", "baseline_config"})
        if unknown:
            self.ctx.fail(f"{self.ctx.test_id}: ab() got unknown argument(s) {', '.join(unknown)}")
        requests = self.with_test_extras(requests if requests is not None else self.default_workload())
        pattern, slo = self.pattern(options.get("pattern"), config), self.slo(options.get("slo"))
        reference, bench = self.reference, self.bench
        def record(a: Measurement, b: Measurement) -> PerfRecord:
            record = self.record(label, b, {"experiment": "ab", "baseline_precision": REFERENCE_ENDPOINT,
                                             "pattern": pattern.describe()})
            record.engine_config["reference_url"] = reference.config.base_url
            record.engine_config["reference_served_model"] = reference.model
            b.engine["reference"] = {"url": reference.config.base_url, "served_model": reference.model,
                                     "server_metrics": a.engine.get("server_metrics"), "errors": a.engine.get("errors")}
            return record

        # served models have no steps to take in turn: a whole load run per side and round
        return AbSides(lambda: by_repetition(lambda m: reference.run_once(requests, pattern, slo, warmup, m),
                                              lambda m: bench.run_once(requests, pattern, slo, warmup, m)),
                        record, lambda a, record: f"interleaved A/B against {reference.model} at "
                        f"{reference.config.base_url}, {rounds} rounds ({pattern.describe()})",
                        "endpoint vs reference endpoint", route=Route.ENDPOINT)

    def interleaved(self, requests, config, slower_config, warmup: int):
        self.ctx.fail(f"{self.ctx.test_id}: {NO_SPEEDUP}")

    def record(self, label: str, measurement: Measurement, tags: dict) -> PerfRecord:
        return PerfRecord(test=self.ctx.measurement_key(label), label=label, precision=ENDPOINT_ID,
                          measurement=measurement, backend="endpoint",
                          engine_config={"backend": "endpoint", "url": self.bench.config.base_url,
                                         "served_model": self.bench.model, "pattern": tags.get("pattern", "")},
                          tags=tags, fingerprint=self.bench.fingerprint())

    def close(self) -> None:
        """Nothing to let go of: the session owns the server's client."""

    def slo(self, slo) -> Slo:
        if isinstance(slo, Slo):
            return slo
        values = {}
        for kwargs in self.ctx.marker_kwargs("infergate_slo"):
            values.update(kwargs)
        values.update(slo or {})
        try:
            return Slo.parse(values)
        except InfergateError as exc:
            self.ctx.fail(f"{self.ctx.test_id}: {exc}")


def failure_sample(measurement: Measurement) -> str:
    failures = measurement.engine.get("failures") or []
    if not failures:
        return ""
    return "\nfailed requests (first ones): " + "; ".join(f"{f['request_id']}: {f['error']} {f['detail'][:80]}"
                                                          for f in failures[:3])
