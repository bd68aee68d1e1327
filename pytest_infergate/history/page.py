"""The history page (one self-contained HTML file, the report's style) and the text table of what changed; and what
a pytest run with `--infergate-history DIR` does at its end: append its results to DIR, redraw DIR/history.html,
and hand the history to the report (its link and its slow-creep note)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from markupsafe import Markup

from pytest_infergate import units
from pytest_infergate.history import changepoint
from pytest_infergate.history.chart import trend_chart
from pytest_infergate.history.series import History, SeriesChange, build_history, findings
from pytest_infergate.history.store import append_run, load_runs, report_beside
from pytest_infergate.measurement import METRICS
from pytest_infergate.report.template_context import split_test_id
from pytest_infergate.results.run import RunResults


def describe(f: SeriesChange) -> str:
    """`regressed at run #7 (commit 1a2b3c4): +15.1% (95% CI +12.0% to +18.3%)`, or a creep's drift per run."""
    where = f"run #{f.run.index}" + (f" (commit {f.run.commit})" if f.run.commit else f" ({f.run.when})")
    if f.kind == "step":
        verb = "regressed" if f.worse else "improved"
        return (f"{verb} at {where}: {units.change(f.change)} (95% CI {units.change(f.low)} to "
                f"{units.change(f.high)})" + (f", with {f.changes}" if f.changes else ""))
    verb = "creeping worse" if f.worse else "creeping better"
    gates = ", every gate passed" if f.passed else ""
    return (f"{verb} since {where}: {units.change(f.change)} over the window, {units.change(f.per_run)} per run "
            f"(Mann-Kendall p = {units.number(f.p_value, 2)}{gates})")


def text_table(history: History) -> str:
    """What `infergate history` prints: one line per change point or creep, worst news first."""
    found = sorted(findings(history), key=lambda f: (not f.worse, f.run.index))
    lines = [f"{len(history.runs)} runs, {len(history.series)} series (test × metric)"]
    lines += [f"  skipped {s}" for s in history.skipped]
    if not found:
        lines.append("no change points and no creep")
    for f in found:
        lines.append(f"{f.series.test} {f.series.name}: {describe(f)}")
    for run, text in environment_changes(history):
        lines.append(f"machine changed at run #{run}: {text} (a new series)")
    for run, text in under_test_changes(history):
        lines.append(f"changed under test at run #{run}: {text}")
    return "\n".join(lines)


def under_test_changes(history: History) -> list[tuple[int, str]]:
    return sorted({(p.run, p.changes) for s in history.series for p in s.points if p.changes})


def environment_changes(history: History) -> list[tuple[int, str]]:
    seen: dict[tuple[int, str], None] = {}
    for s in history.series:
        for segment in s.segments[1:]:
            seen.setdefault((segment.points[0].run, segment.change_from_previous), None)
    return sorted(seen)


def report_links(history: History, page_dir: Path | None) -> dict[int, str]:
    """Run index -> href of that run's report, relative to the page's folder (a file URI without one)."""
    return {run.index: (os.path.relpath(run.report, page_dir) if page_dir is not None else Path(run.report).as_uri())
            for run in history.runs if run.report}


def build_context(history: History, report_href: str | None = None, page_dir: Path | None = None) -> dict:
    links = report_links(history, page_dir)

    def _chart(s) -> Markup:
        return Markup(trend_chart(history, s, METRICS[s.metric][0], links))

    found = findings(history)
    changed = {(f.series.test, f.series.metric) for f in found}
    by_file: dict[str, dict[str, list]] = {}
    for s in history.series:
        file, label = split_test_id(s.test)
        by_file.setdefault(file, {}).setdefault(label, []).append(s)
    runs = history.runs

    def when(ts: float) -> str:
        return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "?"

    return {
        "runs": runs, "first": when(runs[0].started) if runs else "?", "last": when(runs[-1].started) if runs else "?",
        "findings": [{"test": f.series.test, "label": split_test_id(f.series.test)[1] or f.series.test,
                      "metric": f.series.name, "kind": f.kind, "worse": f.worse, "text": describe(f),
                      "run": f.run, "report": links.get(f.run.index)}
                     for f in sorted(found, key=lambda f: (not f.worse, f.run.index))],
        "changed_charts": [_chart(s) for s in history.series if (s.test, s.metric) in changed],
        "files": [{"file": file, "tests": [{"label": label, "charts": [_chart(s) for s in series]}
                                           for label, series in tests.items()]} for file, tests in by_file.items()],
        "environment_changes": environment_changes(history), "skipped": history.skipped,
        "report_href": report_href, "series_count": len(history.series), "links": links,
        "method": {"alpha": changepoint.ALPHA, "min_change": units.percent(changepoint.MIN_CHANGE),
                   "window": history.creep_window, "min_creep": units.percent(changepoint.MIN_CREEP)},
    }


def render_history(history: History, report_href: str | None = None, page_dir: Path | None = None) -> str:
    from pytest_infergate.report import template_environment

    return template_environment().get_template("history.html").render(**build_context(history, report_href,
                                                                                      page_dir))


def write_history(history: History, path: Path, report_href: str | None = None) -> None:
    from pytest_infergate.atomic import write_text_atomic

    path = Path(path)
    write_text_atomic(path, render_history(history, report_href, path.resolve().parent))


HISTORY_PAGE = "history.html"


def history_with(folder: Path, results: RunResults) -> History:
    """The history in `folder`, with `results` as its latest run even where it was not appended (a report
    re-rendered from a results file, or an append that failed)."""
    runs, skipped = load_runs([folder]) if Path(folder).is_dir() else ([], [])
    if results.run_id not in {r.run_id for r in runs}:
        runs.append(results)
    return build_history(runs, skipped=skipped)


def record_run(folder: Path, results: RunResults, keep: int, report: Path | None = None) -> History:
    """Append the run, redraw the history page (linking the report, if one is written), return the history."""
    append_run(folder, results, keep)
    history = history_with(folder, results)
    page = Path(folder) / HISTORY_PAGE
    write_history(history, page, _report_href(folder, report) if report else None)
    return history


def page_href(folder: Path, report: Path) -> str:
    """The history page as the report links it: relative to the report's folder."""
    return os.path.relpath((Path(folder) / HISTORY_PAGE).resolve(), Path(report).resolve().parent)


def keep_report(folder: Path, results: RunResults, history: History, report: Path) -> None:
    """Keep this run's report beside its results file in the history folder (`<run id>.html`, linking the page
    there) and redraw the page, so its points link to it. Pruned with the run."""
    from pytest_infergate.report import write_report

    copy = report_beside(Path(folder) / f"{results.run_id}.json")
    write_report(results, copy, results.commit, history, HISTORY_PAGE)
    for run in history.runs:
        if run.run_id == results.run_id:
            run.report = str(copy.resolve())
    write_history(history, Path(folder) / HISTORY_PAGE, _report_href(folder, report))


def _report_href(folder: Path, report: Path) -> str:
    """The run's report as the history page links it: relative to the history folder."""
    return os.path.relpath(Path(report).resolve(), Path(folder).resolve())
