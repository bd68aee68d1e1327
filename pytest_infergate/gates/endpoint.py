"""The served model at --infergate-endpoint bound to one test (`ServedRuns`, gates.target.Runs): load runs against
the live server in a pattern (`infergate_endpoint`, and `infergate_bench` with --infergate-endpoint), its sweeps,
capacity search and synchronous rate, and its interleaved A/B against --infergate-reference-endpoint, each measured
and gated as the engine's are (gates.gating). No pytest here."""

from __future__ import annotations

from dataclasses import replace

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.endpoint.capacity import search_capacity
from pytest_infergate.endpoint.capacity_records import CapacityResult, CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.load_run import LoadPattern, Slo
from pytest_infergate.endpoint.loadgen import sweep_patterns
from pytest_infergate.errors import InfergateError
from pytest_infergate.gates.ab import AbSides
from pytest_infergate.gates.gating import WorkloadRun, gate_measurement, gated, measure_planned
from pytest_infergate.gates.pair import REFERENCE_ENDPOINT
from pytest_infergate.gates.target import SPEEDUP, Served
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.gate import PerfGate, PerfOutcome, Route, by_repetition
from pytest_infergate.perf.repetitions import RepetitionPlan
from pytest_infergate.requirements import require_local_model_stack
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.stats import percentile
from pytest_infergate.status import ENDPOINT_CHECK, ENGINE_CHECK, Finding, Status

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
        pattern = self._pattern(options.get("pattern"), config)
        return self._run(self._with_test_extras(requests), pattern, self._slo(options.get("slo")), label, tags)

    def _run(self, requests: list, pattern: LoadPattern, slo: Slo, label: str, tags: dict | None) -> WorkloadRun:
        """One load run's WorkloadRun: `requests` (the test's extras added) in `pattern`, goodput against `slo`."""
        bench = self.bench

        def measure(plan: RepetitionPlan | None, *, warmup: int, repeats: int, min_time_s: float, until,
                    decided) -> Measurement:
            return bench.measure(requests, pattern, slo, warmup=warmup, repeats=plan.least if plan else repeats,
                                 label=label, max_repeats=plan.most if plan else repeats, until=until)

        def extend(measurement: Measurement, warmup: int) -> None:
            bench.run_once(requests, pattern, slo, warmup, measurement)

        record = self._record(label, Measurement(label=label), {"pattern": pattern.describe(), **(tags or {})})
        return WorkloadRun(record, requests, pattern, measure, extend, f" (endpoint, {pattern.describe()})",
                           _failure_sample)

    def elsewhere(self, run: WorkloadRun, warmup: int, repeats: int) -> None:
        return None  # a served model is measured where it is served

    def _pattern(self, pattern, config=None) -> LoadPattern:
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

    def _with_test_extras(self, requests: list) -> list:
        """Each request (engine Request, EndpointRequest or Session) with the test's `infergate_extra_body`
        fields added under its own (a request's own field wins)."""
        extras: dict = {}
        for kwargs in self.ctx.marker_kwargs("infergate_extra_body"):
            extras.update(kwargs)
        if not extras:
            return requests
        return [replace(item, extra_body={**extras, **item.extra_body}) for item in requests]

    def _measure_and_gate(self, requests, pattern: LoadPattern, slo, warmup: int, label: str, tags: dict | None
                          ) -> tuple[Measurement, PerfOutcome]:
        """(Measurement, PerfOutcome) of one load run, recorded with the test's result; failing is the caller's."""
        run = self._run(self._with_test_extras(requests), pattern, self._slo(slo), label, tags)
        measurement, gate = measure_planned(self.ctx, run, warmup, 1)
        return measurement, gated(self.ctx, self.target, run, measurement, gate)

    def synchronous_rps(self, requests=None, *, warmup: int = 1) -> float:
        """Answered requests per second with one request at a time (measured once a session per workload and
        server): a suite's request rates sized from it pass on a small server and stress a big one (a fixed
        rate answers few requests on a server slower than it, docs/guides/endpoint.md). Fails the test when the
        server answered none."""
        requests = self._with_test_extras(requests if requests is not None else self.default_workload())
        try:
            run = self.bench.synchronous_run(requests, self._slo(None), warmup)
        except InfergateError as exc:
            self.ctx.fail(f"{self.ctx.test_id}: the synchronous run (one request at a time) failed: {exc}")
        rate = percentile(run.samples.get("requests_per_s") or [0.0], 50)
        if run.num_failed or not rate > 0:
            self.ctx.fail(f"{self.ctx.test_id}: the synchronous run (one request at a time) answered "
                          f"{run.num_requests - run.num_failed} of {run.num_requests} requests, so no load can be "
                          f"sized from it (check the server's log){_failure_sample(run)}")
        self.ctx.say(Finding(ENDPOINT_CHECK, self.ctx.test_id, f"loads sized from the server's synchronous rate, "
                             f"{rate:.3g} req/s ({run.num_requests} requests one at a time)", status=Status.PASS))
        return rate

    def sweep(self, requests=None, *, rates=None, concurrencies=None, points: int = 6, burstiness: float = 1.0,
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
        requests = requests if requests is not None else self.default_workload()
        window = dict(warmup_s=warmup_s, cooldown_s=cooldown_s)
        if rates is None and concurrencies is None:
            return self._sweep_profile(requests, points, slo, warmup, window, label)
        out, failures = [], []
        try:
            patterns = [replace(p, **window) for p in sweep_patterns(rates, concurrencies, burstiness)]
        except InfergateError as exc:
            self.ctx.fail(str(exc))
        if names is not None and len(names) != len(patterns):
            self.ctx.fail(f"{self.ctx.test_id}: sweep(names=...) names {len(names)} points, the sweep has "
                          f"{len(patterns)}: give one name per rate or concurrency")
        for index, pattern in enumerate(patterns):
            point = (f"{label}-{names[index]}" if names is not None else f"{label}-rate{pattern.rate_per_s:g}"
                     if rates else f"{label}-c{pattern.concurrency}")
            measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup if index == 0 else 0,
                                                          point, {"experiment": label})
            out.append((pattern, measurement))
            if outcome.failed:
                failures.append(f"{point}:\n{outcome.message()}")
        if failures:
            self.ctx.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures))
        return out

    def _sweep_profile(self, requests, points: int, slo, warmup: int, window: dict, label: str):
        """Every point measured first, then each recorded and gated: the knee and the best goodput are known only
        at the end, and a record is written once."""
        from pytest_infergate.endpoint import sweep

        requests, slo = self._with_test_extras(requests), self._slo(slo)  # the rates path: in _measure_and_gate
        measured: list[tuple[sweep.SweepPoint, Measurement, PerfGate, PerfRecord]] = []

        def run(role: str, pattern: LoadPattern, name: str) -> sweep.SweepPoint:
            load = self._run(requests, pattern, slo, f"{label}-{name}", None)
            measurement, gate = measure_planned(self.ctx, load, warmup if not measured else 0, 1, rewarmup=0)
            point = sweep.SweepPoint.of(role, pattern, measurement.samples)
            measured.append((point, measurement, gate, load.record))
            return point

        try:
            sweep.rates_between(1.0, 2.0, points)  # the point count, checked before any load is sent
            synchronous = run(sweep.SYNCHRONOUS, LoadPattern(concurrency=1, **window), "sync")
            ceiling = run(sweep.THROUGHPUT, LoadPattern(concurrency=self.bench.config.max_concurrency, **window),
                          "throughput")
            # named by their place, not their rate: the rates follow the server's speed, a baseline key must not
            rates = sweep.rates_between(synchronous.achieved_rps, ceiling.achieved_rps, points)
            for index, rate in enumerate(rates, 1):
                run(sweep.RATE, LoadPattern(rate_per_s=rate, **window), f"rate-{index}-of-{len(rates)}")
        except InfergateError as exc:
            self.ctx.fail(f"{self.ctx.test_id}: {exc}")
        found = [point for point, _, _, _ in measured]
        knee, best, line = sweep.knee(found), sweep.best_goodput(found), sweep.describe(found)
        failures = []
        for point, measurement, gate, record in measured:
            tags = {"experiment": label, "sweep": point.role, "knee": point is knee, "best_goodput": point is best}
            record = replace(record, measurement=measurement, tags={**record.tags, **tags})
            outcome = gate_measurement(self.ctx, self.target, record, notes=[line], gate=gate)
            if outcome.failed:
                failures.append(f"{record.label}:\n{outcome.message()}")
        if failures:
            self.ctx.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures))
        return [(point.pattern, measurement) for point, measurement, _, _ in measured]

    def capacity(self, requests=None, *, slo=None, target_goodput: float = 0.99, search: str = "rate",
                 bounds=None, budget_s: float = 300.0, point_s: float = 10.0, min_requests: int = 20,
                 resolution: float = 0.1, warmup: int = 1, label: str = "capacity") -> CapacityResult:
        """The highest request rate (`search="rate"`, Poisson arrivals) or concurrency at which the server still
        meets the SLO (`slo`, or the `infergate_slo` marker) for `target_goodput` of the requests: a coarse
        doubling sweep over `bounds` (default 0.5-64 req/s, or 1 to --infergate-endpoint-concurrency), then
        bisection to `resolution`; each point sends enough requests for `point_s` seconds (at least
        `min_requests`) and stops once it is decided (it can no longer pass, or its interval lies above the target);
        the search stops within `budget_s`. Recorded and
        gated like a load run: `min_capacity_rps=12` in the test's budget fails it below 12 req/s."""
        requests = self._with_test_extras(requests if requests is not None else self.default_workload())
        if bounds is None:
            bounds = (0.5, 64.0) if search == "rate" else (1, self.bench.config.max_concurrency)
        try:
            spec = CapacitySpec(self._slo(slo), target_goodput, search, tuple(bounds), budget_s, point_s,
                                min_requests, resolution)
            result = search_capacity(self.bench.config, requests, spec, warmup)
        except InfergateError as exc:
            self.ctx.fail(f"{self.ctx.test_id}: {exc}")
        measurement = capacity_measurement(result, label)
        record = self._record(label, measurement, {"experiment": "capacity", "search": search})
        outcome = gate_measurement(self.ctx, self.target, record, notes=[result.describe()])
        if outcome.failed:
            self.ctx.fail(f"infergate capacity gate failed for {self.ctx.measurement_key(label)}:\n"
                          f"{outcome.message()}\n{result.describe()}")
        return result

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
        requests = self._with_test_extras(requests if requests is not None else self.default_workload())
        pattern, slo = self._pattern(options.get("pattern"), config), self._slo(options.get("slo"))
        reference, bench = self.reference, self.bench
        def record(a: Measurement, b: Measurement) -> PerfRecord:
            record = self._record(label, b, {"experiment": "ab", "baseline_precision": REFERENCE_ENDPOINT,
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

    def _record(self, label: str, measurement: Measurement, tags: dict) -> PerfRecord:
        return PerfRecord(test=self.ctx.measurement_key(label), label=label, precision=ENDPOINT_ID,
                          measurement=measurement, backend="endpoint",
                          engine_config={"backend": "endpoint", "url": self.bench.config.base_url,
                                         "served_model": self.bench.model, "pattern": tags.get("pattern", "")},
                          tags=tags, fingerprint=self.bench.fingerprint())

    def close(self) -> None:
        """Nothing to let go of: the session owns the server's client."""

    def _slo(self, slo) -> Slo:
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


def _failure_sample(measurement: Measurement) -> str:
    failures = measurement.engine.get("failures") or []
    if not failures:
        return ""
    return "\nfailed requests (first ones): " + "; ".join(f"{f['request_id']}: {f['error']} {f['detail'][:80]}"
                                                          for f in failures[:3])
