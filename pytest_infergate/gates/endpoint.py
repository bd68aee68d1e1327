"""EndpointPerfBench, the object behind `infergate_endpoint` (and `infergate_bench` with --infergate-endpoint):
load runs against the live server, gated like the engine's measurements. No pytest here."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from pytest_infergate.context import ENDPOINT_ID, TestContext
from pytest_infergate.endpoint.capacity import search_capacity
from pytest_infergate.endpoint.capacity_records import CapacityResult, CapacitySpec, capacity_measurement
from pytest_infergate.endpoint.load_run import LoadPattern, Slo
from pytest_infergate.endpoint.loadgen import sweep_patterns
from pytest_infergate.errors import InfergateError
from pytest_infergate.gates.ab import AbSides, run_ab
from pytest_infergate.gates.pair import REFERENCE_ENDPOINT
from pytest_infergate.gates.perf import ab_budget, finish_ab, gate_measurement, prepare_gate
from pytest_infergate.gates.target import Served
from pytest_infergate.measurement import Measurement
from pytest_infergate.perf.gate import AB_ROUNDS, PerfGate, PerfOutcome, Route, by_repetition
from pytest_infergate.perf.repetitions import repetition_plan, until_settled
from pytest_infergate.requirements import require_local_model_stack
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.stats import percentile
from pytest_infergate.status import ENDPOINT_CHECK, ENGINE_CHECK, Finding, Status


class EndpointPerfBench:
    """Returned by `infergate_endpoint`, and by `infergate_bench` with --infergate-endpoint; see their docstrings."""

    def __init__(self, ctx: TestContext, bench, tokenizer_source, reference=None):
        self.ctx = ctx
        self.target = Served()  # what the gate asks
        self.bench = bench  # EndpointBench
        self.reference = reference  # EndpointBench of --infergate-reference-endpoint, or None
        self._tokenizer_source = tokenizer_source  # the local tokenizer sizes workload prompts; loaded on demand

    def default_workload(self, num_requests: int = 16):
        return self.workload(num_requests)

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

    def __call__(self, requests=None, config=None, *, warmup: int = 1, repeats: int = 1, min_time_s: float = 0.0,
                 label: str = "", tags: dict | None = None, pattern=None, slo=None):
        """The reference engine's `infergate_bench` call, against the endpoint: an EngineConfig's max_batch_size
        becomes the concurrency; engine experiments (cache modes, static/dynamic batching) cannot be run on a
        server and are skipped."""
        if config is not None and (config.batching != "continuous" or config.cache_mode != "paged"):
            self.ctx.skip(Finding(ENGINE_CHECK, self.ctx.test_id, f"engine experiment (batching={config.batching}, "
                                  f"cache_mode={config.cache_mode}): a server's batching and KV cache are its own",
                                  "run it without --infergate-endpoint"))
        return self.load(requests, self._pattern(pattern, config), slo, warmup=warmup, repeats=repeats, label=label,
                         tags=tags)

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

    def load(self, requests=None, pattern=None, slo=None, *, warmup: int = 1, repeats: int = 1, label: str = "",
             tags: dict | None = None) -> Measurement:
        """Run `requests` (default: 16 chat requests) against the endpoint in `pattern` (a LoadPattern, or a dict
        such as {"rate_per_s": 4, "burstiness": 0.5} or {"concurrency": 8}) `repeats` times, and gate the result
        with the test's budgets. `slo` (or the `infergate_slo` marker) defines goodput. Returns the Measurement."""
        pattern = self._pattern(pattern) if pattern is not None else LoadPattern()
        measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup, repeats, label, tags)
        if outcome.failed:
            self.ctx.fail(f"infergate perf gate failed for {self.ctx.measurement_key(label)} (endpoint, "
                          f"{pattern.describe()}):\n{outcome.message()}" + _failure_sample(measurement))
        return measurement

    def _measure_and_gate(self, requests, pattern: LoadPattern, slo, warmup: int, repeats: int, label: str,
                          tags: dict | None, notes: list[str] = ()) -> tuple[Measurement, PerfOutcome]:
        """(Measurement, PerfOutcome) of one load run, recorded with the test's result; failing is the caller's."""
        requests = self._with_test_extras(requests if requests is not None else self.default_workload())
        slo = self._slo(slo)
        measurement, gate = self._measure(requests, pattern, slo, warmup, repeats, label)
        return measurement, self._gate(gate, pattern, measurement, label, tags, notes)

    def _measure(self, requests, pattern: LoadPattern, slo: Slo, warmup: int, repeats: int, label: str,
                 remeasure_warmup: int | None = None) -> tuple[Measurement, PerfGate]:
        """The measurement and the gate it goes through, made before measuring (PerfBench.__call__'s way): its
        budget sets the repetition plan; a re-measurement warms up with `remeasure_warmup` requests (None: `warmup`)."""
        key = self.ctx.measurement_key(label)
        rewarmup = warmup if remeasure_warmup is None else remeasure_warmup
        # the closure reads `measurement` when the gate re-measures, by then measured
        gate = prepare_gate(self.ctx, key, ENDPOINT_ID, self.bench.fingerprint(),
                            remeasure=lambda: self.bench.run_once(requests, pattern, slo, rewarmup, measurement))
        plan = repetition_plan(gate.budget, self.ctx, repeats)
        measurement = self.bench.measure(requests, pattern, slo, warmup=warmup,
                                         repeats=plan.least if plan else repeats, label=label,
                                         max_repeats=plan.most if plan else repeats,
                                         until=until_settled(plan, f"measuring {key}"))
        return measurement, gate

    def _with_test_extras(self, requests: list) -> list:
        """Each request (engine Request, EndpointRequest or Session) with the test's `infergate_extra_body`
        fields added under its own (a request's own field wins)."""
        extras: dict = {}
        for kwargs in self.ctx.marker_kwargs("infergate_extra_body"):
            extras.update(kwargs)
        if not extras:
            return requests
        return [replace(item, extra_body={**extras, **item.extra_body}) for item in requests]

    def _gate(self, gate: PerfGate, pattern: LoadPattern, measurement: Measurement, label: str, tags: dict | None,
              notes: list[str] = ()) -> PerfOutcome:
        record = self._record(label, measurement, {"pattern": pattern.describe(), **(tags or {})})
        return gate_measurement(self.ctx, self.target, record, notes=notes, gate=gate)

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
            measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup if index == 0 else 0, 1,
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
        measured: list[tuple[sweep.SweepPoint, Measurement, PerfGate, str]] = []

        def run(role: str, pattern: LoadPattern, name: str) -> sweep.SweepPoint:
            measurement, gate = self._measure(requests, pattern, slo, warmup if not measured else 0, 1,
                                              f"{label}-{name}", remeasure_warmup=0)
            point = sweep.SweepPoint.of(role, pattern, measurement.samples)
            measured.append((point, measurement, gate, f"{label}-{name}"))
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
        for point, measurement, gate, name in measured:
            tags = {"experiment": label, "sweep": point.role, "knee": point is knee, "best_goodput": point is best}
            outcome = self._gate(gate, point.pattern, measurement, name, tags, [line])
            if outcome.failed:
                failures.append(f"{name}:\n{outcome.message()}")
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

    def ab(self, requests=None, config=None, *, pattern=None, slo=None, rounds: int = AB_ROUNDS, warmup: int = 1,
           label: str = "ab", **local_only):
        """Interleaved A/B between the two servers: --infergate-reference-endpoint (A) and --infergate-endpoint
        (B) run the same load alternately, A B A B ..., so drift of either machine hits both alike; the verdict
        of B against A uses the budget's max_regression (default 0.10) on a paired bootstrap CI. Returns the
        (A, B) Measurements. Without a reference endpoint the test is skipped."""
        if self.reference is None:
            self.ctx.skip(Finding(ENDPOINT_CHECK, self.ctx.test_id, "an A/B against an endpoint needs the other "
                                  "deployment", "pass --infergate-reference-endpoint URL (or compare runs with "
                                  "--infergate-baseline)"))
        unknown = sorted(set(local_only) - {"baseline_model", "baseline_config"})
        if unknown:
            self.ctx.fail(f"{self.ctx.test_id}: ab() got unknown argument(s) {', '.join(unknown)}")
        requests = self._with_test_extras(requests if requests is not None else self.default_workload())
        pattern, slo = self._pattern(pattern, config), self._slo(slo)
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
        sides = AbSides(lambda: by_repetition(lambda m: reference.run_once(requests, pattern, slo, warmup, m),
                                              lambda m: bench.run_once(requests, pattern, slo, warmup, m)),
                        record, lambda a, record: f"interleaved A/B against {reference.model} at "
                        f"{reference.config.base_url}, {rounds} rounds ({pattern.describe()})",
                        "endpoint vs reference endpoint", route=Route.ENDPOINT)
        return run_ab(sides, ab_budget(self.ctx, self.target, self.ctx.measurement_key(label)), rounds,
                      partial(finish_ab, self.ctx, self.target))

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
