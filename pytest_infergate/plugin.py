"""The pytest hooks of pytest-infergate: options and ini keys, configuration, marker validation, parametrization.

The session's state and its session-level hooks live in `session.InfergateSession`; the fixtures in `fixtures.py`
(imported below so pytest finds them in this plugin); everything they drive is plain Python. torch and
transformers are imported only when an infergate fixture is used (or --infergate-gpu is given), so installing the
plugin costs unrelated test runs nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from pytest_infergate import context
from pytest_infergate.context import ENDPOINT_ID
from pytest_infergate.errors import InfergateError, OptionError
from pytest_infergate.fixtures import (  # noqa: F401
    infergate_backend,
    infergate_bench,
    infergate_device,
    infergate_endpoint,
    infergate_golden,
    infergate_model,
    infergate_options,
    infergate_precision,
    infergate_reference_model,
    infergate_target,
    infergate_tokenizer,
)
from pytest_infergate.options import OPTION_SPECS, Options, check_folder_path, check_output_path
from pytest_infergate.outputs import AtomicJUnitXml
from pytest_infergate.requirements import import_torch
from pytest_infergate.session import PLUGIN_NAME, InfergateSession, InfergateWarning, session_of  # noqa: F401

MARKERS = (
    "infergate_budget(**limits): perf budget of this test, e.g. ttft_ms_p95=200, tokens_per_s=10, peak_mem_mb=900, "
    "max_regression=0.1",
    "infergate_slo(ttft_ms=None, tpot_ms=None, e2e_ms=None): per-request objectives of an endpoint load run; "
    "goodput_per_s counts the requests that met them",
    "infergate_quality(**thresholds): quality policy against the reference precision, e.g. min_rouge_l=0.5, "
    "max_mean_kl=0.2, min_top1=0.8, min_task_ratio=0.99 (none: the default of the precision's class)",
    "infergate_extra_body(**fields): JSON fields every request of this test sends to a served model, e.g. "
    "ignore_eos=True, min_tokens=16, top_k=20 (a request's own extra_body wins)",
    "infergate_chat: this test's workload needs the model's chat template (a chat-format task, tool calls): on a "
    "base model it fails at collection instead of sending its chat messages as a plain-text transcript",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("infergate", "LLM inference regression gates (pytest-infergate)")
    for spec in OPTION_SPECS:
        dest = "infergate_" + spec.name
        if spec.kind == "bool":
            group.addoption(spec.flag, action="store_true", default=None, dest=dest, help=spec.help)
        else:
            group.addoption(spec.flag, action="store", default=None, dest=dest, metavar=spec.metavar, help=spec.help)
        # booleans are read as strings and parsed by us, so a typo names the key instead of pytest's message
        parser.addini(spec.ini_key, help=spec.help + f" (same as {spec.flag})", type="string", default=None)
    parser.addini("infergate_quality_policy", type="linelist", default=[],
                  help="quality thresholds by scope, one per line: 'SCOPE: key=value, ...' where SCOPE is a "
                       "precision, part of a test id, or *; e.g. 'int8: min_rouge_l=0.5, max_mean_kl=0.1'")
    parser.addini("infergate_budgets", type="linelist", default=[],
                  help="perf budgets by scope, one per line: 'SCOPE: key=value, ...' where SCOPE is a precision, "
                       "a substring of the test id, or *; e.g. 'int8: tokens_per_s=5, peak_mem_mb=900'")


def _options(config: pytest.Config) -> Options:
    options = Options.from_sources(lambda name: config.getoption("infergate_" + name),
                                   lambda name: config.getini("infergate_" + name))
    for spec in OPTION_SPECS:
        if spec.kind == "output" and getattr(options, spec.name) is not None:
            check_output_path(getattr(options, spec.name), spec.flag)
    check_folder_path(options.cache_dir, "--infergate-cache-dir")
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        options = replace(options, xdist_workers=int(workers))
    if options.gpu:
        options = _pin_gpu(config, options)
    elif workers and options.cpu_threads == 0:  # torch's default per worker would oversubscribe: split the cores
        options = replace(options, cpu_threads=max(1, (os.cpu_count() or 1) // int(workers)))
    return options


def _pin_gpu(config: pytest.Config, options: Options) -> Options:
    torch = import_torch()

    if not torch.cuda.is_available():
        raise pytest.UsageError(
            "--infergate-gpu was given but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Install a CUDA build of "
            "torch and run on a GPU machine, or drop --infergate-gpu to run on the CPU.")
    worker = getattr(config, "workerinput", {}).get("workerid")
    if not worker:
        return options
    index = int(worker.lstrip("gw") or 0) % torch.cuda.device_count()  # worker gwN -> GPU N modulo the count
    torch.cuda.set_device(index)
    return replace(options, gpu_index=index)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    from pytest_infergate.perf.budget import parse_ini_budgets
    from pytest_infergate.quality.policy import parse_ini_policies

    for line in MARKERS:
        config.addinivalue_line("markers", line)
    # emitted by torch on import in some versions; noise in every infergate run, nothing users can act on
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
    try:
        check_path_arguments(config)
        options = _options(config)
        # validated now so a typo stops the run before any model loads; read again where used
        parse_ini_budgets(config.getini("infergate_budgets"))
        parse_ini_policies(config.getini("infergate_quality_policy"))
        session = InfergateSession(config, options)
    except InfergateError as exc:
        raise pytest.UsageError(f"infergate: {exc}") from None
    config.pluginmanager.register(session, PLUGIN_NAME)
    config.pluginmanager.register(AtomicJUnitXml(), f"{PLUGIN_NAME}-junitxml")
    config.stash[_PREVIOUS_SINK] = context.current_sink()
    context.set_sink(_terminal_sink(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PREVIOUS_SINK in config.stash:  # a pytest run inside a pytest run (pytester) gives the outer one back its own
        context.set_sink(config.stash[_PREVIOUS_SINK])


_PREVIOUS_SINK = pytest.StashKey[object]()


def _terminal_sink(config: pytest.Config):
    """Progress lines on the terminal past output capture; none under -q, or in an xdist worker (nobody reads
    its output)."""
    if hasattr(config, "workerinput") or config.option.verbose < 0:
        return None

    def write(message: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(message)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(message)

    return write


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers are validated at collection time, so a typo fails the run before any model loads."""
    from pytest_infergate.errors import unknown_keys
    from pytest_infergate.perf.budget import BudgetError, parse_budget
    from pytest_infergate.quality.policy import QualityPolicyError, parse_policy

    def parse_slo(values: dict, where: str) -> None:
        from pytest_infergate.endpoint.load_run import Slo  # the endpoint package loads httpx: only when asked

        try:
            Slo.parse(values)
        except InfergateError as exc:
            raise InfergateError(f"{where}: {exc}") from None

    def parse_extra_body(values: dict, where: str) -> None:
        from pytest_infergate.endpoint.exchange import check_extra_body

        check_extra_body(values, where)

    checks = (("infergate_budget", parse_budget, BudgetError), ("infergate_quality", parse_policy, QualityPolicyError),
              ("infergate_slo", parse_slo, InfergateError), ("infergate_extra_body", parse_extra_body, InfergateError))
    problems = []
    known = [spec.split("(")[0].split(":")[0] for spec in MARKERS]
    for item in items:
        # a misspelt marker (infergate_budgets) would leave the test ungated and the run PASS (issue #45)
        names = sorted({marker.name for marker in item.iter_markers() if marker.name.startswith("infergate")})
        unknown = unknown_keys(names, known, "marker")
        if unknown:
            problems.append(f"{item.nodeid}: {unknown}; the infergate markers are {', '.join(known)}")
        for name, parse, error in checks:
            for marker in item.iter_markers(name):
                if marker.args:
                    problems.append(f"{item.nodeid}: {name} takes keyword arguments only, got {marker.args!r}")
                    continue
                try:
                    parse(marker.kwargs, f"{item.nodeid}: {name}")
                except error as exc:
                    problems.append(str(exc))
    problems += chat_only_problems(config, [item for item in items if item.get_closest_marker("infergate_chat")])
    if problems:
        raise pytest.UsageError("invalid infergate markers:\n" + "\n".join(problems))


def chat_only_problems(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """Tests marked infergate_chat where chat messages would go as plain text: the model's tokenizer has no chat
    template (a base model; loading it here is what the test would do first), or the served model is asked
    through the completions API. Each named, with the way out."""
    if not items:
        return []
    options = session_of(config).options
    if options.endpoint is not None:
        if options.endpoint_api == "chat":
            return []
        why = "--infergate-endpoint-api completions sends chat messages as a plain-text transcript"
    else:
        from pytest_infergate.workloads.transcript import has_chat_template

        try:
            tokenizer = session_of(config).resources.pool.tokenizer
        except InfergateError as exc:
            raise pytest.UsageError(f"infergate: {exc}") from None
        if has_chat_template(tokenizer):
            return []
        why = (f"the tokenizer of {options.model} has no chat template (a base model), so chat messages would go "
               "as a plain-text transcript")
    tests = dict.fromkeys(item.nodeid.split("[")[0] for item in items)  # once per test, not per precision
    return [f"{test}: marked infergate_chat (its workload needs the model's chat template), but {why}: run it on a "
            "chat model, or drop the marker to accept the transcript" for test in tests]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "infergate_precision" not in metafunc.fixturenames:
        return
    options = session_of(metafunc.config).options
    # one xdist group per precision: with `--dist loadgroup` each worker loads one model
    params = [pytest.param(p, id=p, marks=pytest.mark.xdist_group(f"infergate-{p}")) for p in options.precisions]
    if options.endpoint is not None:
        # the server serves one model in its own precision; local precisions run beside it only when asked for
        endpoint = pytest.param(ENDPOINT_ID, id=ENDPOINT_ID, marks=pytest.mark.xdist_group(f"infergate-{ENDPOINT_ID}"))
        params = [endpoint] + (params if options.precisions_given else [])
    metafunc.parametrize("infergate_precision", params, indirect=True)


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(prefix, summary, postfix, session):
    """With pytest-html installed, its report links to the infergate report."""
    infergate = session_of(session.config)
    if infergate is not None and infergate.options.report is not None:
        prefix.append(f'<p>LLM inference gates: <a href="{infergate.options.report}">infergate report</a></p>')


def check_path_arguments(config: pytest.Config) -> None:
    """`--infergate-baseline PATH` (a space, not `=`) puts PATH among the arguments pytest reads to choose its
    rootdir and ini file before it knows our options: a path outside the project moves the rootdir, which
    renames every test id (baseline keys) and can lose the ini file (budgets, policies). Where it did, say so."""
    args = list(config.invocation_params.args)
    takes_value = {spec.flag for spec in OPTION_SPECS if spec.kind != "bool"}
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in takes_value]
    suspects = [v for v in values if os.path.exists(os.path.join(str(config.invocation_params.dir), v))]
    if not suspects:
        return
    try:
        from _pytest.config.findpaths import determine_setup

        cleaned = [a for i, a in enumerate(args) if not (a in suspects and i > 0 and args[i - 1] in takes_value)]
        positional = [a for a in cleaned if not a.startswith("-") and os.path.exists(
            os.path.join(str(config.invocation_params.dir), a))]
        rootpath, inipath, *_ = determine_setup(
            inifile=config.option.inifilename, override_ini=config.option.override_ini, args=positional,
            rootdir_cmd_arg=config.option.rootdir or None, invocation_dir=config.invocation_params.dir)
    except Exception:  # pytest's private API changed: nothing to compare with, say nothing
        return
    if rootpath != config.rootpath or inipath != config.inipath:
        flags = ", ".join(f"{args[i]} {args[i + 1]}" for i in range(len(args) - 1)
                          if args[i] in takes_value and args[i + 1] in suspects)
        raise OptionError(f"{flags}: pytest read the path as a test path when it chose its rootdir "
                          f"({config.rootpath} instead of {rootpath}), which changes every test id and baseline "
                          "key; write the option with '=' instead, e.g. "
                          f"{flags.split(' ')[0]}={flags.split(' ')[1]}")
