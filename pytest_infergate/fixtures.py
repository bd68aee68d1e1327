"""The infergate fixtures: thin, each hands its test's context to an object that does not know pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_infergate.gates.target import GOLDEN_GATE, LOCAL_MODEL, PERF_BENCH, Target
from pytest_infergate.options import Options
from pytest_infergate.outbox import needs, skip
from pytest_infergate.session import session_of


@pytest.fixture(scope="session")
def infergate_options(pytestconfig: pytest.Config) -> Options:
    """The resolved `--infergate-*` settings of this run (command line over ini over defaults)."""
    return session_of(pytestconfig).options


@pytest.fixture(scope="session")
def infergate_device(infergate_options: Options) -> str:
    """'cuda' with --infergate-gpu, else 'cpu'."""
    return infergate_options.device


@pytest.fixture
def infergate_precision(request: pytest.FixtureRequest) -> str:
    """The precision under test. Tests that use it are parametrized over --infergate-precisions (ids: fp32, int8,
    ...)."""
    return getattr(request, "param", session_of(request.config).options.reference_precision)


@pytest.fixture
def infergate_target(request: pytest.FixtureRequest, infergate_precision: str) -> Target:
    """What the test measures: a local precision (`.precision`) or the served model (`.is_endpoint`, with
    --infergate-endpoint); `.id` is its parameter id (`infergate_precision`)."""
    from pytest_infergate.gates.targets import target_of

    return target_of(infergate_precision, session_of(request.config).resources)


def _unless(target: Target, what: str) -> None:
    """Skip the test where `target` cannot give `what`, saying why."""
    why = target.cannot(what)
    if why is not None:
        skip(why)


@pytest.fixture
def infergate_model(request: pytest.FixtureRequest, infergate_target: Target):
    """The model under test in `infergate_precision`, as a LoadedModel (`.model`, `.tokenizer`, `.record` with load
    time, weight bytes, peak memory, fingerprint, versions). Loaded once per session per precision and device.
    With --infergate-endpoint, tests that need it are skipped: the server's model is under test, not a local one."""
    _unless(infergate_target, LOCAL_MODEL)
    return needs(infergate_target.model)


@pytest.fixture
def infergate_backend(infergate_model):
    """What runs the gates' workloads on `infergate_model` (--infergate-backend), a BackendChoice: `.name`
    ('engine' or 'hf-generate'), `.reason` (why not the engine), `.self_check_s` (the engine's self-check cost),
    `.build(model, tokenizer, config)` (an Engine or the HF generate backend, the same surface) and
    `.refusal(what)`: None on the engine, else the reason to skip something only the engine does."""
    return infergate_model.backend


@pytest.fixture
def infergate_reference_model(request: pytest.FixtureRequest):
    """The model in the reference precision (--infergate-reference-precision), loaded once per session."""
    resources = session_of(request.config).resources
    return needs(lambda: resources.model(resources.options.reference_precision))


@pytest.fixture(scope="session")
def infergate_tokenizer(pytestconfig: pytest.Config):
    """The tokenizer of --infergate-model (shared by every precision; pads on the left)."""
    return needs(session_of(pytestconfig).resources.tokenizer)


def _bench(request: pytest.FixtureRequest, target: Target):
    _unless(target, PERF_BENCH)
    return target.perf_bench(session_of(request.config).context(request.node),
                             lambda: request.getfixturevalue("infergate_model"), needs)


@pytest.fixture
def infergate_endpoint(request: pytest.FixtureRequest):
    """The live server given with --infergate-endpoint (skipped without it). `infergate_endpoint.load(requests,
    pattern, slo)` measures a load run - fixed concurrency ({"concurrency": 8}) or a request rate with Poisson or
    gamma-bursty arrivals ({"rate_per_s": 4, "burstiness": 0.5}) - client-side TTFT, ITL, TPOT, e2e, tokens/s,
    success rate and goodput against the SLO (`infergate_slo` marker), gated by the test's budgets;
    `.synchronous_rps(requests)` is the server's rate one request at a time (measured once a session), to size
    rates from; `.sweep(rates=[...])` or `.sweep(concurrencies=[...])` runs one load per point;
    `.capacity(search="rate", bounds=(lo, hi), budget_s=...)` finds the highest load that still meets the SLO
    (budget key `min_capacity_rps`); `.ab(requests, pattern)` runs an interleaved A/B against
    --infergate-reference-endpoint. Requests may be multi-turn Sessions (`pytest_infergate.workloads.from_file`).
    The server's Prometheus /metrics are scraped around every run (budget keys `max_kv_usage`,
    `min_prefix_cache_hit_rate`, ...). Errors (HTTP status, timeout, malformed stream) are counted per kind, never
    raised."""
    from pytest_infergate.gates.targets import ServedTarget

    return _bench(request, ServedTarget(session_of(request.config).resources))


@pytest.fixture
def infergate_bench(request: pytest.FixtureRequest, infergate_target: Target):
    """Measure a workload on the model's backend (the reference engine; HF generate where it refuses the model or
    with --infergate-backend hf, skipping configs only the engine runs) and gate it: `m = infergate_bench(
    requests=None, config=None, warmup=2, repeats=3, min_time_s=0, label="", tags=None)`. Warm-up requests run
    before every repetition and are not counted. `requests` may hold multi-turn `Session`s (`workloads.from_file`,
    `workloads.Session`): each turn is sent once the one before it is answered, with the conversation so far,
    so that `EngineConfig(prefix_caching=True)` is measured on real conversation reuse (`prefix_cache_hit_rate`,
    and `perf.conversations.prefix_cache_use(m.engine)` for the counts). The test's `infergate_budget` marker (and ini
    `infergate_budgets`) is checked against the returned Measurement; with --infergate-baseline the run is
    compared with the accepted one (bootstrap CI of the ratio, re-measured when inconclusive). Every violated
    metric is listed in the failure. `infergate_bench.ab(...)` runs an interleaved A/B against the reference
    precision or --infergate-compare-model. With --infergate-endpoint the same call measures the server instead
    (see `infergate_endpoint`)."""
    bench = _bench(request, infergate_target)
    yield bench
    bench.close()


@pytest.fixture
def infergate_golden(request: pytest.FixtureRequest, infergate_target: Target):
    """Golden-sample quality gates for the precision under test: `infergate_golden.check()` compares it with the
    reference precision (ROUGE, exact match, teacher-forced KL / top-1 / perplexity, task score ratio) under the
    `infergate_quality` policy (marker or ini; where neither sets a threshold, the default of the precision's class,
    e.g. int8 min_top1=0.9, max_mean_kl=0.05), each threshold decided on its 95% interval over the samples
    (straddling: inconclusive); `infergate_golden.check_regression()` compares it with its own accepted golden
    outputs (the changes listed; int8 and nf4 judged by their quality against the reference compared with the
    figures accepted with the outputs, the reference precision by its tokens; `exact=1` token for token). Both
    accept `limit=` and `categories=` to use part of the sample sets. `infergate_golden.check_corpus()` reads a
    text with both precisions instead (prefill only, the built-in public-domain corpus or `corpus=PATH`): mean KL,
    top-1 and Δ perplexity with 95% intervals over its chunks, KL p99 / p99.9, under the policy's corpus keys
    (`max_corpus_kl`, `min_corpus_top1`, ...; `max_corpus_kl_rise` over the figures accepted with
    --infergate-update-golden). With --infergate-endpoint the candidate is the server (greedy, temperature 0):
    `check()` compares it with the local reference precision (policy scope `endpoint`) - or, with
    --infergate-reference-endpoint, with that server's greedy answers and no local model - and
    `check_regression()` with its own accepted outputs."""
    _unless(infergate_target, GOLDEN_GATE)
    session = session_of(request.config)
    golden_dir = session.options.golden_dir or Path(str(request.config.rootpath)) / "golden"
    return infergate_target.golden_gate(session.context(request.node),
                                        lambda: request.getfixturevalue("infergate_model"), needs, golden_dir)
