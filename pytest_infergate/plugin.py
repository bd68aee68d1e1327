"""All pytest glue of pytest-infergate: options, ini keys, fixtures and hooks.

Everything else in the package is plain Python. torch and transformers are imported only when an infergate
fixture is used (or --infergate-gpu is given), so installing the plugin costs unrelated test runs nothing.
"""

from __future__ import annotations

import pytest

from pytest_infergate.errors import InfergateError, ModelLoadError
from pytest_infergate.options import OPTION_SPECS, Options
from pytest_infergate.pool import ModelPool

OPTIONS_KEY = pytest.StashKey[Options]()
POOL_KEY = pytest.StashKey[ModelPool]()


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
    config.stash[OPTIONS_KEY] = options
    config.stash[POOL_KEY] = ModelPool(options)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "infergate_precision" not in metafunc.fixturenames:
        return
    options = metafunc.config.stash[OPTIONS_KEY]
    # one xdist group per precision: with `--dist loadgroup` each worker loads one model
    params = [pytest.param(p, id=p, marks=pytest.mark.xdist_group(f"infergate-{p}")) for p in options.precisions]
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
    time, weight bytes, peak memory, fingerprint, versions). Loaded once per session per precision and device."""
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


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    pool = config.stash.get(POOL_KEY, None)
    if pool is None or not pool.loaded:
        return
    terminalreporter.section("infergate")
    source = pool.source
    terminalreporter.write_line(f"model: {source.spec} ({source.name}) on {pool.options.device}")
    for loaded in pool.loaded:
        r = loaded.record
        note = f"  FALLBACK from {r.requested_precision}: {r.fallback_reason}" if r.fallback else ""
        terminalreporter.write_line(
            f"  {r.requested_precision:>5}: load {r.load_s:.2f}s, weights {r.weight_bytes / 2**20:.1f} MiB, "
            f"peak {r.peak_mem_bytes / 2**20:.0f} MiB ({r.peak_mem_method}), fingerprint {r.fingerprint}{note}")
    if pool.any_fallback:
        terminalreporter.write_line("infergate: some precisions ran as FALLBACK to the reference precision; "
                                    "their results do not measure the requested precision", red=True)
