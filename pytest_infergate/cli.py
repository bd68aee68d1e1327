"""The `infergate` command: fetch the default model, re-render reports, compare runs, summarize for CI."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pytest_infergate.errors import InfergateError


def _load_results(path: str) -> dict:
    from pytest_infergate.results import RunResults

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InfergateError(f"{path} does not exist: write one with pytest --infergate-json {path}") from None
    except (OSError, ValueError) as exc:
        raise InfergateError(f"{path} is not a JSON results file ({exc})") from None
    RunResults.from_dict(data)  # validates the schema version
    return data


def _cmd_fetch_model(args: argparse.Namespace) -> int:
    from pytest_infergate.models import resolve_model

    if args.gguf:  # the original file, for a llama.cpp server; printed alone so `$(...)` can use it
        from pytest_infergate.builtin_models import ensure_smollm2_gguf

        if args.model != "smollm2-135m":
            raise InfergateError(f"--gguf is for the embedded model smollm2-135m; {args.model!r} has no built-in GGUF")
        print(ensure_smollm2_gguf(Path(args.cache_dir).expanduser()))
        return 0
    source = resolve_model(args.model, Path(args.cache_dir).expanduser())
    print(f"{args.model}: {source.path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    """Re-render the HTML report of a results file."""
    from pytest_infergate.report import write_report

    write_report(_load_results(args.results), Path(args.output))
    print(f"wrote {args.output}")
    return 0


def _perf_index(data: dict) -> dict[str, dict]:
    return {r["test"]: r for r in data.get("records", []) if r.get("kind") == "perf"}


def compare_runs(a: dict, b: dict, max_regression: float) -> tuple[list[list[str]], bool]:
    """Rows of (test, metric, A, B, change, verdict) for every perf metric both runs measured; True if any
    metric regressed beyond max_regression with confidence."""
    from pytest_infergate.perf import compare_samples

    rows, regressed = [], False
    old, new = _perf_index(a), _perf_index(b)
    for test in sorted(set(old) | set(new)):
        if test not in old or test not in new:
            rows.append([test, "-", "present" if test in old else "missing", "present" if test in new else "missing",
                         "", "not compared"])
            continue
        sa, sb = old[test]["measurement"]["samples"], new[test]["measurement"]["samples"]
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "tokens_per_s", "peak_mem_mb"):
            if not sa.get(metric) or not sb.get(metric):
                continue
            verdict = compare_samples(metric, sb[metric], sa[metric], max_regression, 50)
            regressed |= verdict.status == "fail"
            change = verdict.candidate / verdict.baseline - 1 if verdict.baseline else 0.0
            rows.append([test, metric, f"{verdict.baseline:.4g}", f"{verdict.candidate:.4g}", f"{change:+.1%}",
                         f"{verdict.status} (x{verdict.ratio:.3f}, CI {verdict.low:.3f}-{verdict.high:.3f})"])
    qa = {r["precision"]: r for r in a.get("records", []) if r.get("kind") == "quality"}
    qb = {r["precision"]: r for r in b.get("records", []) if r.get("kind") == "quality"}
    for precision in sorted(set(qa) & set(qb)):
        for metric in ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio"):
            va, vb = qa[precision]["summary"].get(metric), qb[precision]["summary"].get(metric)
            if va is not None and vb is not None:
                rows.append([f"quality {precision}", metric, f"{va:.4g}", f"{vb:.4g}", f"{vb - va:+.4g}",
                             qb[precision]["status"]])
                regressed |= qb[precision]["status"] == "fail"
    return rows, regressed


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _cmd_compare(args: argparse.Namespace) -> int:
    """Compare two results files; exit 1 when B regressed against A."""
    rows, regressed = compare_runs(_load_results(args.a), _load_results(args.b), args.max_regression)
    print(_table(rows, ["test", "metric", "A", "B", "change", "verdict"]) if rows else "nothing to compare")
    print("REGRESSION" if regressed else "no regression")
    return 1 if regressed else 0


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, alignment row (text columns left, figures right) and rows."""
    align = ["---" if i < 3 else "---:" for i in range(len(header))]
    return ["", "| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(row) + " |" for row in rows]


def _figures(summary: dict, keys: tuple[str, ...], digits: int) -> list[str]:
    return [f"{summary[k]:.{digits}g}" if k in summary else "–" for k in keys]


def summary_markdown(data: dict) -> str:
    lines = ["## pytest-infergate", ""]
    for gate, c in data.get("gate_counts", {}).items():
        lines.append(f"- **{gate}**: {c.get('pass', 0)} pass, {c.get('fail', 0)} fail, "
                     f"{c.get('inconclusive', 0)} inconclusive")
    records = data.get("records", [])
    perf = [r for r in records if r.get("kind") == "perf"]
    if perf:
        keys = ("ttft_ms_p50", "tpot_ms_p50", "tokens_per_s", "peak_mem_mb")
        lines += _markdown_table(["test", "precision", "verdict", "TTFT p50 ms", "TPOT p50 ms", "tok/s", "peak MiB"],
                                 [[f"`{r['test']}`", r["precision"], r["status"], *_figures(r["summary"], keys, 4)]
                                  for r in perf])
    quality = [r for r in records if r.get("kind") == "quality"]
    if quality:
        keys = ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")
        lines += _markdown_table(["precision", "vs", "verdict", "ROUGE-L", "exact match", "mean KL", "top-1",
                                  "task ratio"],
                                 [[r["precision"], r["reference_precision"], r["status"],
                                   *_figures(r["summary"], keys, 3)] for r in quality])
    return "\n".join(lines) + "\n"


def _cmd_summary(args: argparse.Namespace) -> int:
    """Print a summary of a results file (Markdown with --markdown; also appended to $GITHUB_STEP_SUMMARY)."""
    data = _load_results(args.results)
    text = summary_markdown(data)
    if not args.markdown:
        text = "\n".join(line for line in text.splitlines() if not line.startswith("|---"))
    print(text)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and args.markdown:
        with open(step_summary, "a", encoding="utf-8") as out:
            out.write(summary_markdown(data))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pytest_infergate.options import default_cache_dir

    parser = argparse.ArgumentParser(prog="infergate", description="pytest-infergate utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-model", help="resolve (download/convert once) a model into the cache and print its path")
    fetch.add_argument("model", nargs="?", default="smollm2-135m")
    fetch.add_argument("--cache-dir", default=str(default_cache_dir()))
    fetch.add_argument("--gguf", action="store_true", help="print the path of the embedded model's original GGUF "
                       "file (for llama.cpp's server) instead of the converted directory")
    fetch.set_defaults(func=_cmd_fetch_model)
    report = sub.add_parser("report", help="render the HTML report of a results file (pytest --infergate-json)")
    report.add_argument("results")
    report.add_argument("-o", "--output", default="infergate-report.html")
    report.set_defaults(func=_cmd_report)
    compare = sub.add_parser("compare", help="compare two results files; exit 1 on a regression")
    compare.add_argument("a", help="the accepted run")
    compare.add_argument("b", help="the candidate run")
    compare.add_argument("--max-regression", type=float, default=0.10,
                         help="tolerated slowdown as a fraction (default 0.10)")
    compare.set_defaults(func=_cmd_compare)
    summary = sub.add_parser("summary", help="summarize a results file")
    summary.add_argument("results")
    summary.add_argument("--markdown", action="store_true", help="Markdown tables (also written to $GITHUB_STEP_SUMMARY)")
    summary.set_defaults(func=_cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InfergateError as exc:
        print(f"infergate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
