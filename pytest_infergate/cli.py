"""The `infergate` command: fetch the default model, re-render reports, compare runs, summarize for CI, migrate
accepted results of an older version."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from pytest_infergate.errors import InfergateError
from pytest_infergate.history.compare import compare_runs
from pytest_infergate.history.store import load_run
from pytest_infergate.results.markdown import summary_markdown
from pytest_infergate.results.summary import summary_lines
from pytest_infergate.status import Status


def _cmd_fetch_model(args: argparse.Namespace) -> int:
    from pytest_infergate.models import resolve_model

    if args.gguf:  # the original file, for a llama.cpp server; printed alone so `$(...)` can use it
        from pytest_infergate.models.sources import ensure_smollm2_gguf

        if args.model != "smollm2-135m":
            raise InfergateError(f"--gguf is for the embedded model smollm2-135m; {args.model!r} has no built-in GGUF")
        print(ensure_smollm2_gguf(Path(args.cache_dir).expanduser()))
        return 0
    source = resolve_model(args.model, Path(args.cache_dir).expanduser())
    print(f"{args.model}: {source.path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    """Re-render the HTML report of a results file (with --history: linked to that folder's history page, and
    noting a slow creep up to this run)."""
    from pytest_infergate.options import check_output_path
    from pytest_infergate.report import write_report

    check_output_path(Path(args.output), "infergate report -o")
    results = load_run(args.results)
    history, href = None, None
    if args.history:
        from pytest_infergate.report.history_page import HISTORY_PAGE, history_with, page_href

        history = history_with(Path(args.history), results)
        href = page_href(Path(args.history), Path(args.output)) if (Path(args.history) / HISTORY_PAGE).exists() \
            else None
    write_report(results, Path(args.output), history=history, history_href=href)
    print(f"wrote {args.output}")
    return 0


def _metrics(values: list[str] | None) -> tuple[str, ...]:
    from pytest_infergate.history import DEFAULT_METRICS
    from pytest_infergate.measurement import METRICS

    names = tuple(dict.fromkeys(m.strip() for v in values or [] for m in v.split(",") if m.strip()))
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise InfergateError(f"--metric {', '.join(unknown)}: not a perf metric; choose from {', '.join(METRICS)}")
    return names or DEFAULT_METRICS


def _cmd_history(args: argparse.Namespace) -> int:
    """Trends of many runs: change points and creep per test and metric, as a table and an HTML page."""
    from pytest_infergate.history import build_history, load_runs
    from pytest_infergate.options import check_output_path
    from pytest_infergate.report.history_page import text_table, write_history

    metrics = _metrics(args.metric)
    if args.window < 4:
        raise InfergateError(f"--window {args.window}: a creep needs at least 4 runs to be told from noise")
    check_output_path(Path(args.output), "infergate history -o")
    runs, skipped = load_runs(args.results)
    if len(runs) < 2:
        raise InfergateError(f"a history needs at least 2 runs, found {len(runs)} in {', '.join(args.results)}")
    history = build_history(runs, metrics, args.window, skipped)
    print(text_table(history))
    write_history(history, Path(args.output))
    print(f"wrote {args.output}")
    return 0


def regression_fraction(text: str) -> float:
    """--max-regression: a fraction (0.10) or a percentage (10%); as the budget marker, from 0 to below 10."""
    value = text.strip()
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a fraction such as 0.10 or a "
                                         "percentage such as 10%") from None
    if not math.isfinite(number) or not 0 <= number < 10:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction from 0 to below 10 (0.10 = 10% slower "
                                         "tolerated), or a percentage such as 10%")
    return number


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _cmd_compare(args: argparse.Namespace) -> int:
    """Compare two results files as the in-run gate would; exit 1 when B regressed against A."""
    a, b = load_run(args.a), load_run(args.b)
    rows, verdict, notes = compare_runs(a, b, args.max_regression, args.strict)
    if a.perf and b.perf:  # the perf sentences are the in-run gate's, whose accepted side is a saved baseline
        print(f"A = {args.a} (the accepted run: 'the save' below), B = {args.b} (the candidate: 'this run')")
    print(_table(rows, ["test", "metric", "A", "B", "verdict"]) if rows else "nothing to compare")
    for note in notes:
        print(note)
    print({Status.FAIL: "REGRESSION", Status.INCONCLUSIVE: "INCONCLUSIVE: could not decide (see above); rerun, or "
           "--strict to fail on it", Status.PASS: "no regression"}[verdict])
    return 1 if verdict == Status.FAIL else 0


def _cmd_summary(args: argparse.Namespace) -> int:
    """Print a summary of a results file (Markdown with --markdown; also appended to $GITHUB_STEP_SUMMARY)."""
    results = load_run(args.results)
    if args.markdown:
        text = summary_markdown(results)
        print(text)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as out:
                out.write(text)
    else:
        print("\n".join(line.text for line in summary_lines(results)))
    return 0


def _cmd_init_golden(args: argparse.Namespace) -> int:
    """Copy the built-in golden sample set into a project's folder, to make it the project's own."""
    from pytest_infergate.quality.golden_files import copy_builtin_samples

    target = copy_builtin_samples(Path(args.folder))
    print(f"wrote {target}: 48 samples to edit and extend; the gate reads every *.jsonl in {args.folder} (accepted "
          "outputs go beside them, one folder per model, with --infergate-update-golden)")
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    """A project's first gate: starter test, conftest, golden samples, CI job (pytest_infergate.project_files)."""
    from pytest_infergate.ci_jobs import BASELINE_FILES, CI_FILES, HOSTED_JOBS
    from pytest_infergate.models.sources import RANDOM_LLAMAS
    from pytest_infergate.project_files import DEFAULT_INSTALL, init_project

    wheel = Path(args.wheel) if args.wheel else None
    files = init_project(Path(args.folder), ci=args.ci, tests=args.tests, install=args.install, wheel=wheel,
                         model=args.model or "")
    for written in files:
        print(written.line())
    stale_job = any(written.kept and "does not install" in written.note for written in files)
    # --ci none writes no job: nothing is said of one
    ci = (" Commit the rest (.gitignore keeps the local files out): the CI job's first run on your default branch "
          f"saves and commits its own {BASELINE_FILES[args.ci]} (docs/guides/ci.md)") if args.ci != "none" else ""
    model = (f"{args.model}, the ini's infergate_model" if args.model else
             "the embedded model; yours with --infergate-model=PATH_OR_GGUF or the ini's infergate_model")
    print(f"next: pytest {args.tests} --infergate-save-baseline=local-baseline.json ({model}), then after a change: "
          f"pytest {args.tests} "
          f"--infergate-baseline=local-baseline.json --infergate-report=report.html. Traffic files go in "
          f"{args.tests}/workloads/*.jsonl.{ci}")
    model_path = Path(args.model).expanduser() if args.model else None
    if model_path is not None and model_path.exists() and args.ci in HOSTED_JOBS \
            and not model_path.resolve().is_relative_to(Path(args.folder).resolve()):
        print(f"note: the CI job runs on a hosted runner, where {args.model} is not: gate a model the job can reach "
              "(a file committed in the project, named by its path there, or a hub id ORG/NAME) in the ini's "
              "infergate_model")
    if args.model in RANDOM_LLAMAS:
        print(f"note: {args.model} has seeded random weights: its speed gates work as on any model, its quality "
              "verdicts say nothing of a trained model's, so the starter gates fp32 alone (int8 fails the 8-bit "
              "default on it); gate int8 on a trained model")
    if wheel is not None and not stale_job and args.ci != "none":
        print(f"commit wheels/{wheel.name}: the CI job installs it from there")
    elif wheel is None and args.ci != "none" and args.install == DEFAULT_INSTALL:
        job = CI_FILES[args.ci][0]  # kept by a rerun, as every file that exists: the rerun needs it gone
        print("note: the CI job runs `pip install pytest-infergate`; until it is on PyPI, build a wheel in a "
              f"pytest-infergate checkout (`pip wheel --no-deps -w dist .`), delete {job} and rerun with --wheel "
              "dist/pytest_infergate-<version>-py3-none-any.whl: it is copied into wheels/ for you to commit")
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    """Rewrite older baseline files as results files and accepted golden files in the current schema
    (pytest_infergate.project_files)."""
    from pytest_infergate.project_files import migrate

    for path in args.paths:
        for line in migrate(Path(path)):
            print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pytest_infergate.options import default_cache_dir

    parser = argparse.ArgumentParser(prog="infergate", description="pytest-infergate utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-model",
                           help="resolve (download/convert once) a model into the cache and print its path")
    fetch.add_argument("model", nargs="?", default="smollm2-135m")
    fetch.add_argument("--cache-dir", default=str(default_cache_dir()))
    fetch.add_argument("--gguf", action="store_true", help="print the path of the embedded model's original GGUF "
                       "file (for llama.cpp's server) instead of the converted directory")
    fetch.set_defaults(func=_cmd_fetch_model)
    report = sub.add_parser("report", help="render the HTML report of a results file (pytest --infergate-json)")
    report.add_argument("results")
    report.add_argument("-o", "--output", default="infergate-report.html")
    report.add_argument("--history", metavar="DIR", help="a history folder (pytest --infergate-history): link its "
                        "history page and note a slow creep up to this run")
    report.set_defaults(func=_cmd_report)
    history = sub.add_parser("history", help="trends across runs: change points and slow creep per test and metric",
                             description="Read the results of many runs (files written by pytest --infergate-json, "
                             "or a folder written by --infergate-history), print where each metric changed level "
                             "(regressed at run X (commit Y): +N% with its 95% CI) or is creeping, and write an "
                             "HTML page of every trend.")
    history.add_argument("results", nargs="+", metavar="RESULTS|DIR")
    history.add_argument("-o", "--output", default="history.html")
    history.add_argument("--metric", action="append", metavar="METRIC", help="perf metric(s) to follow, repeatable "
                         "or comma-separated (default: ttft_ms, tpot_ms, tokens_per_s, peak_mem_mb)")
    history.add_argument("--window", type=int, default=8, metavar="RUNS",
                         help="runs over which a slow creep is looked for (default 8)")
    history.set_defaults(func=_cmd_history)
    compare = sub.add_parser("compare", help="compare two results files; exit 1 on a regression")
    compare.add_argument("a", help="the accepted run")
    compare.add_argument("b", help="the candidate run")
    compare.add_argument("--max-regression", type=regression_fraction, default=None, metavar="FRACTION",
                         help="tolerated slowdown, 0.10 or 10%% (default: the max_regression B's gate used, else "
                         "0.10)")
    compare.add_argument("--strict", action="store_true", help="an inconclusive comparison fails (exit 1)")
    compare.set_defaults(func=_cmd_compare)
    summary = sub.add_parser("summary", help="summarize a results file")
    summary.add_argument("results")
    summary.add_argument("--markdown", action="store_true",
                         help="Markdown tables (also written to $GITHUB_STEP_SUMMARY)")
    summary.set_defaults(func=_cmd_summary)
    init_golden = sub.add_parser("init-golden", help="copy the built-in golden sample set into FOLDER (default "
                                 "golden/) to make it the project's own")
    init_golden.add_argument("folder", nargs="?", default="golden")
    init_golden.set_defaults(func=_cmd_init_golden)
    init = sub.add_parser("init", help="write a project's first gate into FOLDER (default .): a starter gate test "
                          "and conftest under tests/, golden/ with the built-in samples, a CI job (a CPU job with "
                          "perf/requirements.txt, the libraries it installs); existing files are left as they are")
    init.add_argument("folder", nargs="?", default=".")
    init.add_argument("--ci", choices=("github", "github-gpu", "gitlab", "none"), default="github",
                      help="the CI job to write (default github: .github/workflows/infergate.yml on a hosted CPU "
                      "runner; github-gpu: a self-hosted GPU runner; gitlab: .gitlab-ci.yml)")
    init.add_argument("--tests", default="tests", help="the folder of the gate tests (default tests)")
    init.add_argument("--model", metavar="PATH_OR_GGUF", help="the model every run gates, written as pytest.ini's "
                      "infergate_model: a model directory, a .gguf file, a hub id ORG/NAME or a built-in alias "
                      "(default: the embedded SmolLM2-135M-Instruct)")
    init.add_argument("--install", default="pytest-infergate", metavar="SPEC",
                      help="what the CI job pip-installs (default pytest-infergate; a committed wheel's path or "
                      "'git+URL' before it is on PyPI)")
    init.add_argument("--wheel", metavar="PATH", help="a built pytest-infergate wheel: copied into wheels/ (commit "
                      "it) and installed by the CI job from there, until the package is on PyPI")
    init.set_defaults(func=_cmd_init)
    migrate = sub.add_parser("migrate", help="rewrite files of an older pytest-infergate: a baseline file as a "
                             "results file (a baseline is a saved run), an accepted golden file in the current schema "
                             "(each entry keyed by machine and change under test)")
    migrate.add_argument("paths", nargs="+", metavar="FILE|DIR",
                         help="a baseline file, an accepted golden file, or a folder (e.g. golden/)")
    migrate.set_defaults(func=_cmd_migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `infergate summary | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (InfergateError, OSError) as exc:
        print(f"infergate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
