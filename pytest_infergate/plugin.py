"""All pytest glue of pytest-infergate: options, ini keys, fixtures and hooks.

Everything else in the package is plain Python. torch and transformers are imported only when an infergate
fixture is used (or --infergate-gpu is given), so installing the plugin costs unrelated test runs nothing.
"""

from __future__ import annotations

import pytest

import json
import os
import warnings

from pytest_infergate.errors import InfergateError, ModelLoadError
from pytest_infergate.options import OPTION_SPECS, Options
from pytest_infergate.perf import Budget, BudgetError, merge_budgets, parse_budget, parse_ini_budgets
from pytest_infergate.pool import ModelPool
from pytest_infergate.quality import QualityPolicyError, parse_ini_policies, parse_policy
from pytest_infergate.results import RESULT_PROPERTY, RunResults

OPTIONS_KEY = pytest.StashKey[Options]()
POOL_KEY = pytest.StashKey[ModelPool]()
RESULTS_KEY = pytest.StashKey[RunResults]()
BASELINE_KEY = pytest.StashKey[dict]()
GENERATED_KEY = pytest.StashKey[dict]()
COMPARE_POOL_KEY = pytest.StashKey[list]()
ENDPOINT_KEY = pytest.StashKey[object]()
ENDPOINT_PRECISION = "endpoint"  # the precision id of tests run against --infergate-endpoint


class InfergateWarning(pytest.PytestWarning):
    """Something the gate could not check as asked (e.g. the baseline is from another environment)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("infergate", "LLM inference regression gates (pytest-infergate)")
    for spec in OPTION_SPECS:
        dest = "infergate_" + spec.name
        if spec.kind == "bool":
            group.addoption(spec.flag, action="store_true", default=None, dest=dest, help=spec.help)
        else:
            group.addoption(spec.flag, action="store", default=None, dest=dest, metavar=spec.metavar, help=spec.help)
        parser.addini(spec.ini_key, help=spec.help + f" (same as {spec.flag})",
                      type="bool" if spec.kind == "bool" else "string", default=None)
    parser.addini("infergate_quality_policy", type="linelist", default=[],
                  help="quality thresholds by precision, one per line: 'PRECISION: key=value, ...' (or '*'); e.g. "
                       "'int8: min_rouge_l=0.5, max_mean_kl=0.1, min_task_ratio=0.95'")
    parser.addini("infergate_budgets", type="linelist", default=[],
                  help="perf budgets by scope, one per line: 'SCOPE: key=value, ...' where SCOPE is a precision, "
                       "a substring of the test id, or *; e.g. 'int8: tokens_per_s=5, peak_mem_mb=900'")


def _build_options(config: pytest.Config) -> Options:
    def ini(name: str):
        try:
            return config.getini("infergate_" + name)
        except ValueError:
            return None

    return Options.from_sources(lambda name: config.getoption("infergate_" + name), ini)


def pytest_configure(config: pytest.Config) -> None:
    try:
        options = _build_options(config)
    except InfergateError as exc:
        raise pytest.UsageError(str(exc)) from None
    if options.gpu:
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                "--infergate-gpu was given but torch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Install a CUDA build of "
                "torch and run on a GPU machine, or drop --infergate-gpu to run on the CPU.")
        worker = getattr(config, "workerinput", {}).get("workerid")
        if worker:
            # pytest-xdist worker gwN is pinned to GPU N modulo the GPU count
            from dataclasses import replace

            index = int(worker.lstrip("gw") or 0) % torch.cuda.device_count()
            torch.cuda.set_device(index)
            options = replace(options, gpu_index=index)
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers and not options.gpu:
        # xdist workers share the CPU: split its cores instead of oversubscribing them
        from dataclasses import replace

        options = replace(options, cpu_threads=max(1, (os.cpu_count() or 1) // int(workers)))
    try:
        # validated now so a typo stops the run before any model loads; read again where used
        parse_ini_budgets(config.getini("infergate_budgets"))
        parse_ini_policies(config.getini("infergate_quality_policy"))
    except InfergateError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[OPTIONS_KEY] = options
    config.stash[POOL_KEY] = ModelPool(options)
    config.stash[RESULTS_KEY] = RunResults()
    config.stash[BASELINE_KEY] = {}
    config.stash[GENERATED_KEY] = {}
    config.stash[COMPARE_POOL_KEY] = []
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ResultCollector(config.stash[RESULTS_KEY]), "infergate-results")
    if options.baseline is not None:
        from pytest_infergate.baseline import load_baseline

        try:
            config.stash[BASELINE_KEY] = load_baseline(options.baseline)
        except InfergateError as exc:
            raise pytest.UsageError(str(exc)) from None
    # emitted by torch on import in some versions; noise in every infergate run, nothing users can act on
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
    config.addinivalue_line("markers", "infergate_budget(**limits): perf budget of this test, e.g. "
                            "ttft_ms_p95=200, tokens_per_s=10, peak_mem_mb=900, max_regression=0.1")
    config.addinivalue_line("markers", "infergate_slo(ttft_ms=None, tpot_ms=None, e2e_ms=None): per-request "
                            "objectives of an endpoint load run; goodput_per_s counts the requests that met them")
    config.addinivalue_line("markers", "infergate_quality(**thresholds): quality policy against the reference "
                            "precision, e.g. min_rouge_l=0.5, max_mean_kl=0.2, min_top1=0.8, min_task_ratio=0.99")


def pytest_sessionstart(session: pytest.Session) -> None:
    """With --infergate-endpoint, the server must answer before any test runs: a server that is down is one clear
    usage error, not a hang or a failure per test."""
    options = session.config.stash.get(OPTIONS_KEY, None)
    if options is None or options.endpoint is None:
        return
    from pytest_infergate.endpoint.bench import EndpointBench
    from pytest_infergate.endpoint.client import EndpointConfig

    try:
        bench = EndpointBench(EndpointConfig.from_options(options))
        bench.model  # GET /v1/models once; the served name is reused by every test
    except InfergateError as exc:
        raise pytest.UsageError(f"infergate: {exc}") from None
    session.config.stash[ENDPOINT_KEY] = bench


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Budget markers are validated at collection time, so a typo fails the run before any model loads."""
    problems = []
    for item in items:
        for marker in item.iter_markers("infergate_budget"):
            if marker.args:
                problems.append(f"{item.nodeid}: infergate_budget takes keyword arguments only, got {marker.args!r}")
                continue
            try:
                parse_budget(marker.kwargs, f"{item.nodeid}: infergate_budget")
            except BudgetError as exc:
                problems.append(str(exc))
        for marker in item.iter_markers("infergate_quality"):
            try:
                parse_policy(marker.kwargs, f"{item.nodeid}: infergate_quality")
            except QualityPolicyError as exc:
                problems.append(str(exc))
        for marker in item.iter_markers("infergate_slo"):
            from pytest_infergate.endpoint.load import Slo

            try:
                Slo.parse(marker.kwargs)
            except InfergateError as exc:
                problems.append(f"{item.nodeid}: infergate_slo: {exc}")
    if problems:
        raise pytest.UsageError("invalid infergate markers:\n" + "\n".join(problems))


def _budget_for(item: pytest.Item, precision: str, key: str) -> Budget:
    """ini budgets whose scope is `*`, the precision, or a substring of the measurement key (test id plus
    label), then the test's markers; later layers override earlier ones key by key."""
    # parsed again here, not only at configure time: a conftest may add suite defaults in its own configure
    scoped = parse_ini_budgets(item.config.getini("infergate_budgets"))
    layers = [budget for scope, budget in scoped.items() if scope == "*"]
    layers += [budget for scope, budget in scoped.items() if scope == precision]
    layers += [budget for scope, budget in scoped.items() if scope not in ("*", precision) and scope in key]
    layers += [parse_budget(m.kwargs) for m in reversed(list(item.iter_markers("infergate_budget")))]
    return merge_budgets(*layers)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "infergate_precision" not in metafunc.fixturenames:
        return
    options = metafunc.config.stash[OPTIONS_KEY]
    # one xdist group per precision: with `--dist loadgroup` each worker loads one model
    params = [pytest.param(p, id=p, marks=pytest.mark.xdist_group(f"infergate-{p}")) for p in options.precisions]
    if options.endpoint is not None:
        # the server serves one model in its own precision; local precisions run beside it only when asked for
        endpoint = pytest.param(ENDPOINT_PRECISION, id=ENDPOINT_PRECISION,
                                marks=pytest.mark.xdist_group(f"infergate-{ENDPOINT_PRECISION}"))
        params = [endpoint] + (params if options.precisions_given else [])
    metafunc.parametrize("infergate_precision", params, indirect=True)


@pytest.fixture(scope="session")
def infergate_options(pytestconfig: pytest.Config) -> Options:
    """The resolved `--infergate-*` settings of this run (command line over ini over defaults)."""
    return pytestconfig.stash[OPTIONS_KEY]


@pytest.fixture(scope="session")
def infergate_device(infergate_options: Options) -> str:
    """'cuda' with --infergate-gpu, else 'cpu'."""
    return infergate_options.device


@pytest.fixture
def infergate_precision(request: pytest.FixtureRequest) -> str:
    """The precision under test. Tests that use it are parametrized over --infergate-precisions (ids: fp32, int8, ...)."""
    return getattr(request, "param", request.config.stash[OPTIONS_KEY].reference_precision)


def _get_model(pool: ModelPool, precision: str):
    try:
        return pool.get(precision)
    except ModelLoadError as exc:
        pytest.fail(f"infergate could not load the model: {exc}", pytrace=False)


@pytest.fixture
def infergate_model(pytestconfig: pytest.Config, infergate_precision: str):
    """The model under test in `infergate_precision`, as a LoadedModel (`.model`, `.tokenizer`, `.record` with load
    time, weight bytes, peak memory, fingerprint, versions). Loaded once per session per precision and device.
    With --infergate-endpoint, tests that need it are skipped: the server's model is under test, not a local one."""
    if infergate_precision == ENDPOINT_PRECISION:
        pytest.skip("measures a local model; with --infergate-endpoint the server's model is under test")
    return _get_model(pytestconfig.stash[POOL_KEY], infergate_precision)


@pytest.fixture
def infergate_reference_model(pytestconfig: pytest.Config):
    """The model in the reference precision (--infergate-reference-precision), loaded once per session."""
    pool = pytestconfig.stash[POOL_KEY]
    return _get_model(pool, pool.options.reference_precision)


@pytest.fixture(scope="session")
def infergate_tokenizer(pytestconfig: pytest.Config):
    """The tokenizer of --infergate-model (shared by every precision; pads on the left)."""
    try:
        return pytestconfig.stash[POOL_KEY].tokenizer
    except ModelLoadError as exc:
        pytest.fail(f"infergate could not load the tokenizer: {exc}", pytrace=False)


class PerfBench:
    """Callable returned by the `infergate_bench` fixture; see its docstring."""

    def __init__(self, item: pytest.Item, loaded, options: Options):
        from pytest_infergate.bench import Bench

        self.item = item
        self.loaded = loaded
        self.options = options
        self.bench = Bench(loaded, options.device)
        self.measurements = []

    def default_workload(self, num_requests: int = 8):
        from pytest_infergate.workloads import chat_workload

        return chat_workload(self.loaded.tokenizer, num_requests, prompt_tokens=(20, 200), max_new_tokens=(16, 48))

    def __call__(self, requests=None, config=None, *, warmup: int = 2, repeats: int = 3, min_time_s: float = 0.0,
                 label: str = "", tags: dict | None = None):
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.environment import perf_fingerprint

        requests = requests if requests is not None else self.default_workload()
        config = config or EngineConfig()
        measurement = self.bench.measure(requests, config, warmup=warmup, repeats=repeats, min_time_s=min_time_s,
                                         label=label)
        key = _measurement_key(self.item, label)
        fingerprint = perf_fingerprint(self.loaded.record, config.to_dict(), self.options.device)
        record = {"precision": self.loaded.record.requested_precision, "fallback": self.loaded.record.fallback,
                  "engine_config": config.to_dict(), "tags": tags or {}}
        outcome = _gate_measurement(self.item, key, label, measurement, fingerprint, record,
                                    remeasure=lambda: self.bench.extend(measurement, requests, config, warmup=warmup))
        self.measurements.append(measurement)
        if outcome.failed:
            pytest.fail(f"infergate perf gate failed for {key}:\n{outcome.message()}", pytrace=False)
        return measurement

    def ab(self, requests=None, config=None, *, baseline_model=None, baseline_config=None, rounds: int = 4,
           warmup: int = 1, label: str = "ab"):
        """Interleaved A/B: the baseline side and this test's model are measured alternately, A B A B ..., so
        drift of the machine hits both alike. The baseline side is `baseline_model`, else --infergate-compare-model
        in this precision, else the reference precision; `baseline_config` defaults to `config`. The verdict of
        B against A uses the budget's max_regression (default 0.10). Returns (A, B) Measurements."""
        from pytest_infergate.bench import Bench
        from pytest_infergate.engine import EngineConfig
        from pytest_infergate.gate import evaluate_ab

        requests = requests if requests is not None else self.default_workload()
        config = config or EngineConfig()
        other = baseline_model or self._compare_side()
        other_bench = self.bench if other is self.loaded else Bench(other, self.options.device)
        other_config = baseline_config or config
        key = _measurement_key(self.item, label)
        budget = _budget_for(self.item, self.loaded.record.requested_precision, key)
        if budget.max_regression is None:
            budget = merge_budgets(budget, parse_budget({"max_regression": 0.10}))
        try:
            a, b, verdicts, status, remeasured = evaluate_ab(
                lambda m: other_bench.run_once(requests, other_config, warmup, m),
                lambda m: self.bench.run_once(requests, config, warmup, m), budget, rounds, self.options.strict)
        finally:
            if other_bench is not self.bench:
                other_bench.close()
        _record(self.item, {"kind": "perf", "test": key, "precision": self.loaded.record.requested_precision,
                            "tags": {"experiment": "ab", "baseline_precision": other.record.requested_precision},
                            "fallback": self.loaded.record.fallback, "label": label,
                            "engine_config": config.to_dict(), "budget": {"max_regression": budget.max_regression},
                            "fingerprint": {}, "measurement": b.to_dict(), "summary": b.summary(),
                            "baseline_summary": a.summary(), "status": status, "violations": [],
                            "verdicts": [v.to_dict() for v in verdicts], "notes": [
                                f"interleaved A/B against {other.record.requested_precision}, {rounds} rounds"],
                            "fingerprint_mismatch": [], "remeasured": remeasured})
        if status == "fail":
            pytest.fail(f"infergate A/B gate failed for {key} ({self.loaded.record.requested_precision} vs "
                        f"{other.record.requested_precision}):\n  " + "\n  ".join(v.describe() for v in verdicts),
                        pytrace=False)
        return a, b

    def _compare_side(self):
        if not self.options.compare_model:
            return self.item.config.stash[POOL_KEY].reference()
        pools = self.item.config.stash[COMPARE_POOL_KEY]
        if not pools:
            from dataclasses import replace

            pools.append(ModelPool(replace(self.options, model=self.options.compare_model)))
        return _get_model(pools[0], self.loaded.record.requested_precision)

    def close(self) -> None:
        self.bench.close()


class EndpointPerfBench:
    """Returned by `infergate_endpoint`, and by `infergate_bench` with --infergate-endpoint; see their docstrings."""

    def __init__(self, item: pytest.Item, bench, tokenizer_source):
        self.item = item
        self.bench = bench
        self._tokenizer_source = tokenizer_source  # the local tokenizer sizes workload prompts; loaded on demand

    def default_workload(self, num_requests: int = 16):
        from pytest_infergate.workloads import chat_workload

        return chat_workload(self._tokenizer_source(), num_requests, prompt_tokens=(20, 200), max_new_tokens=(16, 48))

    def __call__(self, requests=None, config=None, *, warmup: int = 1, repeats: int = 1, min_time_s: float = 0.0,
                 label: str = "", tags: dict | None = None, pattern=None, slo=None):
        """The reference engine's `infergate_bench` call, against the endpoint: an EngineConfig's max_batch_size
        becomes the concurrency; engine experiments (cache modes, static/dynamic batching) cannot be run on a
        server and are skipped."""
        from pytest_infergate.endpoint.load import LoadPattern

        if config is not None and (config.batching != "continuous" or config.cache_mode != "paged"):
            pytest.skip(f"engine experiment (batching={config.batching}, cache_mode={config.cache_mode}): a "
                        "server's batching and KV cache are its own; run it without --infergate-endpoint")
        if pattern is None:
            pattern = LoadPattern(concurrency=config.max_batch_size if config is not None else None)
        return self.load(requests, pattern, slo, warmup=warmup, repeats=repeats, label=label, tags=tags)

    def load(self, requests=None, pattern=None, slo=None, *, warmup: int = 1, repeats: int = 1, label: str = "",
             tags: dict | None = None):
        """Run `requests` (default: 16 chat requests) against the endpoint in `pattern` (a LoadPattern, or a dict
        such as {"rate_per_s": 4, "burstiness": 0.5} or {"concurrency": 8}) `repeats` times, and gate the result
        with the test's budgets. `slo` (or the `infergate_slo` marker) defines goodput. Returns the Measurement."""
        from pytest_infergate.endpoint.load import LoadPattern

        pattern = LoadPattern(**pattern) if isinstance(pattern, dict) else (pattern or LoadPattern())
        measurement, outcome = self._measure_and_gate(requests, pattern, slo, warmup, repeats, label, tags)
        if outcome.failed:
            pytest.fail(f"infergate perf gate failed for {_measurement_key(self.item, label)} (endpoint, "
                        f"{pattern.describe()}):\n{outcome.message()}" + _failure_sample(measurement), pytrace=False)
        return measurement

    def _measure_and_gate(self, requests, pattern, slo, warmup: int, repeats: int, label: str, tags: dict | None):
        """(Measurement, PerfOutcome) of one load run, recorded with the test's result; failing is the caller's."""
        requests = requests if requests is not None else self.default_workload()
        slo = self._slo(slo)
        measurement = self.bench.measure(requests, pattern, slo, warmup=warmup, repeats=repeats, label=label)
        key = _measurement_key(self.item, label)
        record = {"precision": ENDPOINT_PRECISION, "backend": "endpoint", "fallback": False,
                  "engine_config": {"backend": "endpoint", "url": self.bench.config.base_url,
                                    "served_model": self.bench.model, "pattern": pattern.describe()},
                  "tags": {"pattern": pattern.describe(), **(tags or {})}}
        outcome = _gate_measurement(self.item, key, label, measurement, self.bench.fingerprint(), record,
                                    remeasure=lambda: self.bench.run_once(requests, pattern, slo, warmup, measurement))
        return measurement, outcome

    def sweep(self, requests=None, *, rates=None, concurrencies=None, burstiness: float = 1.0, slo=None,
              warmup: int = 1, label: str = "sweep"):
        """One load run per request rate (Poisson, or gamma with `burstiness`) or per concurrency, each recorded
        and gated with the test's budgets; the test fails after the whole sweep if any point failed. Returns
        [(LoadPattern, Measurement)]."""
        from pytest_infergate.endpoint.load import sweep_patterns

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
            pytest.fail("infergate perf gate failed at sweep point(s):\n" + "\n".join(failures), pytrace=False)
        return points

    def ab(self, *args, **kwargs):
        pytest.skip("interleaved A/B compares two local models; with --infergate-endpoint compare runs with "
                    "--infergate-baseline instead")

    def _slo(self, slo):
        from pytest_infergate.endpoint.load import Slo

        if isinstance(slo, Slo):
            return slo
        values = {}
        for marker in reversed(list(self.item.iter_markers("infergate_slo"))):
            values.update(marker.kwargs)
        values.update(slo or {})
        try:
            return Slo.parse(values)
        except InfergateError as exc:
            pytest.fail(f"{self.item.nodeid}: {exc}", pytrace=False)


def _failure_sample(measurement) -> str:
    failures = measurement.engine.get("failures") or []
    if not failures:
        return ""
    return "\nfailed requests (first ones): " + "; ".join(f"{f['request_id']}: {f['error']} {f['detail'][:80]}"
                                                          for f in failures[:3])


def _measurement_key(item: pytest.Item, label: str) -> str:
    """The test id, plus `::label` when a test measures several workloads; baselines and budgets key on it."""
    return item.nodeid + (f"::{label}" if label else "")


def _gate_measurement(item: pytest.Item, key: str, label: str, measurement, fingerprint: dict, record: dict,
                      remeasure=None):
    """Budgets (markers + ini) and the baseline comparison of one measurement; records the result and the key
    figures as JUnit properties. Returns the PerfOutcome; the caller fails the test."""
    from dataclasses import replace

    from pytest_infergate.gate import evaluate_perf

    options = item.config.stash[OPTIONS_KEY]
    budget = _budget_for(item, record["precision"], key)
    unmeasured = [l.key for l in budget.limits if not measurement.samples.get(l.metric)]
    if unmeasured:  # e.g. peak_mem_mb of a remote server, goodput_per_s of the local engine
        budget = replace(budget, limits=tuple(l for l in budget.limits if l.key not in unmeasured))
        warnings.warn(InfergateWarning(f"{key}: budget key(s) {', '.join(unmeasured)} not checked: this "
                                       f"{'endpoint' if record['precision'] == ENDPOINT_PRECISION else 'engine'} "
                                       "measurement has no such figure"))
    entry = item.config.stash[BASELINE_KEY].get(key)
    outcome = evaluate_perf(measurement, budget, fingerprint, entry, options.strict, remeasure=remeasure)
    if unmeasured:
        outcome.notes.append(f"not measured here, not checked: {', '.join(unmeasured)}")
    if outcome.fingerprint_mismatch and not options.strict:
        warnings.warn(InfergateWarning(f"{key}: baseline from another environment, relative check skipped: "
                                       + "; ".join(outcome.fingerprint_mismatch)))
    if outcome.status == "inconclusive":
        warnings.warn(InfergateWarning(f"{key}: inconclusive against the baseline after "
                                       f"{outcome.remeasured} re-measurements:\n{outcome.message()}"))
    _record(item, {"kind": "perf", "test": key, "label": label, **record,
                   "budget": {l.key: l.value for l in budget.limits} | {"max_regression": budget.max_regression},
                   "fingerprint": fingerprint, "measurement": measurement.to_dict(), "summary": measurement.summary(),
                   **outcome.to_dict()})
    for name, value in measurement.summary().items():
        item.user_properties.append((f"infergate.{label + '.' if label else ''}{name}", round(value, 4)))
    return outcome


def _record(item: pytest.Item, record: dict) -> None:
    """Attach a result record to the test's report; it reaches the controller under xdist too."""
    item.user_properties.append((RESULT_PROPERTY, json.dumps(record, default=str)))


def _endpoint_bench(request: pytest.FixtureRequest) -> EndpointPerfBench:
    bench = request.config.stash.get(ENDPOINT_KEY, None)
    if bench is None:
        pytest.skip("needs a live server: pass --infergate-endpoint URL")
    pool = request.config.stash[POOL_KEY]
    return EndpointPerfBench(request.node, bench, lambda: pool.tokenizer)


@pytest.fixture
def infergate_endpoint(request: pytest.FixtureRequest) -> EndpointPerfBench:
    """The live server given with --infergate-endpoint (skipped without it). `infergate_endpoint.load(requests,
    pattern, slo)` measures a load run - fixed concurrency ({"concurrency": 8}) or a request rate with Poisson or
    gamma-bursty arrivals ({"rate_per_s": 4, "burstiness": 0.5}) - client-side TTFT, ITL, TPOT, e2e, tokens/s,
    success rate and goodput against the SLO (`infergate_slo` marker), gated by the test's budgets;
    `.sweep(rates=[...])` or `.sweep(concurrencies=[...])` runs one load per point. Errors (HTTP status, timeout,
    malformed stream) are counted per kind, never raised."""
    return _endpoint_bench(request)


@pytest.fixture
def infergate_bench(request: pytest.FixtureRequest, infergate_precision):
    """Measure a workload on the reference engine and gate it: `m = infergate_bench(requests=None, config=None,
    warmup=2, repeats=3, min_time_s=0, label="", tags=None)`. Warm-up requests run before every repetition and are not
    counted. The test's `infergate_budget` marker (and ini `infergate_budgets`) is checked against the returned
    Measurement; with --infergate-baseline the run is compared with the accepted one (bootstrap CI of the ratio,
    re-measured when inconclusive). Every violated metric is listed in the failure. With --infergate-endpoint the
    same call measures the server instead (see `infergate_endpoint`)."""
    if infergate_precision == ENDPOINT_PRECISION:
        yield _endpoint_bench(request)
        return
    bench = PerfBench(request.node, request.getfixturevalue("infergate_model"), request.config.stash[OPTIONS_KEY])
    yield bench
    bench.close()


class GoldenGate:
    """Returned by the `infergate_golden` fixture; see its docstring."""

    def __init__(self, item: pytest.Item, candidate, pool: ModelPool, options: Options, endpoint=None):
        self.item = item
        self.candidate = candidate  # a LoadedModel; None when the endpoint is the candidate
        self.endpoint = endpoint  # EndpointBench with --infergate-endpoint
        self.pool = pool
        self.options = options

    @property
    def precision(self) -> str:
        return ENDPOINT_PRECISION if self.endpoint is not None else self.candidate.record.requested_precision

    @property
    def golden_dir(self):
        from pathlib import Path

        return self.options.golden_dir or Path(str(self.item.config.rootpath)) / "golden"

    def samples(self, limit: int | None = None, categories=None):
        from pytest_infergate.golden import GoldenError, load_samples, find_sample_sets

        try:
            samples = [s for path in find_sample_sets(self.golden_dir) for s in load_samples(path)]
        except GoldenError as exc:
            pytest.fail(str(exc), pytrace=False)
        if categories:
            samples = [s for s in samples if s.category in set(categories)]
        return samples[:limit] if limit else samples

    def _generated(self, loaded, samples):
        from pytest_infergate.golden_check import generate

        cache = self.item.config.stash[GENERATED_KEY]
        key = (loaded.record.requested_precision, tuple(s.id for s in samples))
        if key not in cache:
            cache[key] = generate(loaded, samples)
        return cache[key]

    def _endpoint_generated(self, samples):
        """The endpoint's greedy answers (with top logprobs where it gives them) and notes; once per session."""
        from pytest_infergate.endpoint.golden import EndpointGenerationError, generate

        cache = self.item.config.stash[GENERATED_KEY]
        key = (ENDPOINT_PRECISION, tuple(s.id for s in samples))
        if key not in cache:
            try:
                cache[key] = generate(self.endpoint.config, self.pool.tokenizer, samples)
            except EndpointGenerationError as exc:
                cache[key] = exc
        if isinstance(cache[key], EndpointGenerationError):  # failed once: every golden test says so at once
            pytest.fail(str(cache[key]), pytrace=False)
        return cache[key]

    def _policy(self) -> dict:
        precision = self.precision
        scoped = parse_ini_policies(self.item.config.getini("infergate_quality_policy"))
        policy = dict(scoped.get("*", {}))
        policy.update(scoped.get(precision, {}))
        for marker in reversed(list(self.item.iter_markers("infergate_quality"))):
            policy.update(parse_policy(marker.kwargs))
        return policy

    def check(self, limit: int | None = None, categories=None, policy: dict | None = None):
        """Candidate precision vs the reference precision on the golden samples, decided by the policy (marker
        `infergate_quality`, ini `infergate_quality_policy`, or `policy`). Returns the QualityResult."""
        from pytest_infergate.golden_check import compare_with_reference
        from pytest_infergate.quality import describe_sample, policy_violations, worst_samples

        samples = self.samples(limit, categories)
        cache = self.item.config.stash[GENERATED_KEY]
        key = ("quality", self.precision, tuple(s.id for s in samples))
        if key not in cache:  # one comparison per precision and sample set per session; policies may differ
            reference = _get_model(self.pool, self.options.reference_precision)
            ref_out = self._generated(reference, samples)
            if self.endpoint is not None:
                from pytest_infergate.endpoint.golden import compare_with_reference as compare_endpoint

                cand_out, notes = self._endpoint_generated(samples)
                cache[key] = compare_endpoint(reference, samples, ref_out, cand_out, notes)
            else:
                cand_out = self._generated(self.candidate, samples)
                cache[key] = compare_with_reference(reference, self.candidate, samples, ref_out, cand_out)
        result = cache[key]
        rules = self._policy() if policy is None else parse_policy(policy)
        problems = policy_violations(result.summary, rules) + result.flags
        status = "fail" if problems else "pass"
        _record(self.item, {"kind": "quality", "test": self.item.nodeid, "status": status, "policy": rules,
                            "problems": problems, **result.to_dict()})
        for name in ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio"):
            if name in result.summary:
                self.item.user_properties.append((f"infergate.quality.{name}", round(result.summary[name], 4)))
        if problems:
            worst = "\n".join("  " + describe_sample(s) for s in worst_samples(result.samples))
            pytest.fail(f"quality of {result.precision} vs {result.reference_precision} breaks the policy:\n  "
                        + "\n  ".join(problems) + f"\nworst samples:\n{worst}", pytrace=False)
        return result

    def check_regression(self, limit: int | None = None, categories=None):
        """This precision's current outputs vs its own accepted golden outputs, token for token. With
        --infergate-update-golden the accepted outputs are rewritten instead (and the changes printed)."""
        from pytest_infergate.golden import GoldenError, diff_outputs, outputs_path, read_outputs, write_outputs
        from pytest_infergate.golden_check import compare_with_golden, golden_outputs
        from pytest_infergate.quality import describe_sample

        samples = self.samples(limit, categories)
        if self.endpoint is not None:  # the endpoint's own accepted outputs, keyed by the name it serves
            from pytest_infergate.golden import endpoint_outputs_path

            # an endpoint's logits are not a local model's: its files store tokens and text, scored by no model
            model, tokenizer = None, self.pool.tokenizer
            current, _ = self._endpoint_generated(samples)
            path = endpoint_outputs_path(self.golden_dir, self.pool.source.name, self.endpoint.model)
            header = {"model": self.pool.source.name, "endpoint": self.endpoint.config.base_url,
                      "served_model": self.endpoint.model, "precision": ENDPOINT_PRECISION}
        else:
            loaded = self.candidate
            model, tokenizer = loaded.model, loaded.tokenizer
            current = self._generated(loaded, samples)
            path = outputs_path(self.golden_dir, self.pool.source.name, loaded.record.fingerprint,
                                self.options.device, loaded.record.requested_precision)
            header = {"model": self.pool.source.name, "fingerprint": loaded.record.fingerprint,
                      "device": self.options.device, "precision": loaded.record.requested_precision,
                      "versions": loaded.record.versions}
        old = None
        if path.exists():
            try:
                old = read_outputs(path)
            except GoldenError as exc:
                if not self.options.update_golden:
                    pytest.fail(str(exc), pytrace=False)
        if self.options.update_golden:
            outputs = golden_outputs(samples, current, model)
            changes = diff_outputs(old, outputs)
            write_outputs(path, header, outputs)
            _record(self.item, {"kind": "golden", "test": self.item.nodeid, "status": "pass", "updated": str(path),
                                "precision": self.precision, "changes": changes})
            return None
        if old is None:
            pytest.skip(f"no accepted golden outputs at {path}: review a run with --infergate-update-golden and "
                        "commit the file")
        regression = compare_with_golden(tokenizer, samples, current, old, self.precision, model)
        status = "pass" if regression.ok else "fail"
        _record(self.item, {"kind": "golden", "test": self.item.nodeid, "status": status, "path": str(path),
                            "precision": regression.precision, "compared": regression.compared,
                            "missing": regression.missing, "mean_topk_kl": regression.mean_topk_kl,
                            "changed": [s.to_dict() for s in regression.changed]})
        if not regression.ok:
            lines = [describe_sample(s) for s in regression.changed[:5]]
            if regression.missing:
                lines.append(f"samples without accepted output: {', '.join(regression.missing)}")
            pytest.fail(f"{len(regression.changed)} of {regression.compared} golden outputs of "
                        f"{regression.precision} changed (accepted: {path}; library versions then: "
                        f"{old.header.get('versions')}):\n  " + "\n  ".join(lines), pytrace=False)
        return regression


@pytest.fixture
def infergate_golden(request: pytest.FixtureRequest, infergate_precision):
    """Golden-sample quality gates for the precision under test: `infergate_golden.check()` compares it with the
    reference precision (ROUGE, exact match, teacher-forced KL / top-1 / perplexity, task score ratio) under the
    `infergate_quality` policy; `infergate_golden.check_regression()` compares it with its own accepted golden
    outputs. Both accept `limit=` and `categories=` to use part of the sample sets. With --infergate-endpoint the
    candidate is the server (greedy, temperature 0): `check()` compares it with the local reference precision
    (policy scope `endpoint`), `check_regression()` with its own accepted outputs."""
    pool, options = request.config.stash[POOL_KEY], request.config.stash[OPTIONS_KEY]
    if infergate_precision == ENDPOINT_PRECISION:
        return GoldenGate(request.node, None, pool, options, endpoint=_endpoint_bench(request).bench)
    return GoldenGate(request.node, request.getfixturevalue("infergate_model"), pool, options)


class ResultCollector:
    """Takes the result records out of test reports on the controller (or in a run without xdist), so the
    run's results are complete and JUnit XML keeps only the key figures. Not registered on xdist workers:
    there the records must stay in the report that travels to the controller."""

    def __init__(self, results: RunResults):
        self.results = results

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        kept = []
        for name, value in report.user_properties:
            if name != RESULT_PROPERTY:
                kept.append((name, value))
            elif report.when == "call":  # the teardown report carries the same properties again
                self.results.add(json.loads(value))
        report.user_properties = kept
        if report.when == "call" or report.outcome != "passed":
            if report.nodeid not in self.results.outcomes or report.outcome != "passed":
                self.results.outcomes[report.nodeid] = "error" if report.when != "call" and report.failed else report.outcome


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput") or RESULTS_KEY not in config.stash:
        return
    options = config.stash[OPTIONS_KEY]
    results = config.stash[RESULTS_KEY]
    pool = config.stash[POOL_KEY]
    if pool.loaded:
        from pytest_infergate.environment import library_versions, machine_fingerprint

        results.environment = {"machine": machine_fingerprint(options.device), "versions": library_versions(),
                               "model": options.model, "device": options.device,
                               "reference_precision": options.reference_precision}
    for loaded in pool.loaded:
        results.models[loaded.record.requested_precision] = loaded.record.to_dict()
    endpoint = config.stash.get(ENDPOINT_KEY, None)
    if endpoint is not None:
        results.environment["endpoint"] = endpoint.fingerprint()
    if options.save_baseline is not None:
        from pytest_infergate.baseline import save_baseline

        entries = {r["test"]: {"fingerprint": r["fingerprint"], "measurement": r["measurement"]}
                   for r in results.by_kind("perf")}
        save_baseline(options.save_baseline, entries)
    if options.json is not None:
        from pytest_infergate.atomic import write_json_atomic

        write_json_atomic(options.json, results.to_dict())
    if options.report is not None:
        from pytest_infergate.report import git_commit, write_report

        write_report(results.to_dict(), options.report, git_commit(config.rootpath))


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(prefix, summary, postfix, session):
    """With pytest-html installed, its report links to the infergate report."""
    options = session.config.stash.get(OPTIONS_KEY, None)
    if options is not None and options.report is not None:
        prefix.append(f'<p>LLM inference gates: <a href="{options.report}">infergate report</a></p>')


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if RESULTS_KEY not in config.stash:
        return
    pool = config.stash[POOL_KEY]
    results = config.stash[RESULTS_KEY]
    if not pool.loaded and not results.records:
        return
    write = terminalreporter.write_line
    terminalreporter.section("infergate")
    endpoint = config.stash.get(ENDPOINT_KEY, None)
    if endpoint is not None:
        write(f"endpoint: {endpoint.config.base_url} serving {endpoint.model!r} ({endpoint.config.api} API)")
    if pool.loaded:
        write(f"model: {pool.source.spec} ({pool.source.name}) on {pool.options.device}")
    for loaded in pool.loaded:
        r = loaded.record
        note = f"  FALLBACK from {r.requested_precision}: {r.fallback_reason}" if r.fallback else ""
        write(f"  {r.requested_precision:>5}: load {r.load_s:.2f}s, weights {r.weight_bytes / 2**20:.1f} MiB, "
              f"load peak +{r.load_mem_delta_bytes / 2**20:.0f} MiB (process {r.peak_mem_bytes / 2**20:.0f} MiB, "
              f"{r.peak_mem_method}), fingerprint {r.fingerprint}{note}")
    for record in results.by_kind("perf"):
        summary = record["summary"]
        figures = ", ".join(f"{k} {summary[k]:.4g}" for k in ("ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50",
                                                                "tokens_per_s", "peak_mem_mb", "success_rate",
                                                                "goodput_per_s") if k in summary)
        errors = record["measurement"].get("engine", {}).get("errors")
        if errors:
            figures += ", errors " + ", ".join(f"{kind} x{n}" for kind, n in sorted(errors.items()))
        write(f"  perf {record['status'].upper():12s} {record['test']}: {figures}",
              red=record["status"] == "fail", yellow=record["status"] == "inconclusive")
        for verdict in record.get("verdicts", []):
            write(f"      {verdict['metric']}: x{verdict['ratio']:.3f} vs baseline "
                  f"(CI {verdict['low']:.3f}-{verdict['high']:.3f}, threshold x{verdict['threshold']:.2f}) "
                  f"{verdict['status']}")
    for record in results.by_kind("quality"):
        summary = record["summary"]
        figures = ", ".join(f"{k} {summary[k]:.3g}" for k in ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")
                            if k in summary)
        write(f"  quality {record['status'].upper():9s} {record['precision']} vs {record['reference_precision']} "
              f"({summary['samples']} samples, {record['seconds']:.0f}s): {figures}", red=record["status"] == "fail")
    for record in results.by_kind("golden"):
        if "updated" in record:
            write(f"  golden UPDATED {record['precision']}: {record['updated']}")
            for line in record["changes"][:20]:
                write(f"      {line}")
        else:
            write(f"  golden {record['status'].upper():10s} {record['precision']}: "
                  f"{len(record['changed'])} of {record['compared']} outputs changed", red=record["status"] == "fail")
    counts = results.gate_counts()
    if counts:
        write("gates: " + "; ".join(f"{kind}: " + ", ".join(f"{n} {status}" for status, n in c.items() if n)
                                    for kind, c in counts.items()))
    if config.stash[OPTIONS_KEY].report is not None:
        write(f"report: {config.stash[OPTIONS_KEY].report}")
    if pool.any_fallback or any(r.get("fallback") for r in results.records):
        write("infergate: some precisions ran as FALLBACK to the reference precision; "
              "their results do not measure the requested precision", red=True)
