"""What a pytest run with `--infergate-history DIR` does at its end: append its results to DIR, redraw
DIR/history.html, and hand the history to the report (its link and its slow-creep note)."""

from __future__ import annotations

import os
from pathlib import Path

from pytest_infergate.history.page import write_history
from pytest_infergate.history.series import History, build_history
from pytest_infergate.history.store import append_run, load_runs, report_beside
from pytest_infergate.results.run import RunResults

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
