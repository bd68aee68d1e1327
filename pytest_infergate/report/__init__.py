"""The HTML regression report: one self-contained file (no external assets), rendered with jinja2 and
autoescaping, since model outputs are untrusted text. The history page (report/history_page.py) uses the same
environment, filters and style."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pytest_infergate import units
from pytest_infergate.results.run import RunResults
from pytest_infergate.results.summary import figure as summary_figure


def git_commit(where: Path | None = None) -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def template_environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("pytest_infergate.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(num=units.number, ms=units.duration_ms, mib=units.mebibytes, ratio=units.ratio,
                       pct=units.percent, change=units.change, metric=lambda v, key: units.metric_value(key, v),
                       figure=summary_figure)
    return env


def render(results: RunResults, commit: str | None = None, history=None, history_href: str | None = None) -> str:
    """The report of `results`; with a History (history/series.py) its diagnosis notes a slow creep, and with
    `history_href` its header links to the history page."""
    from pytest_infergate.report.template_context import build_context

    return template_environment().get_template("report.html").render(
        **build_context(results, commit, history, history_href))


def write_report(results: RunResults, path: Path, commit: str | None = None, history=None,
                 history_href: str | None = None) -> None:
    from pytest_infergate.atomic import write_text_atomic

    write_text_atomic(Path(path), render(results, commit, history, history_href))
