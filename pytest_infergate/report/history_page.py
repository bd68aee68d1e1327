"""The history page (one self-contained HTML file, the report's style) and the text table of what changed; and what
a pytest run with `--infergate-history DIR` does at its end: append its results to DIR, redraw DIR/history.html,
and hand the history to the report (its link and its slow-creep note). Each metric's trend is inline SVG in the
report's chart style: each run's median and interquartile range, its gate verdict marked apart (a red cross for a
failure, an amber ring for inconclusive), each point a link to its run's kept report; the line broken where the
environment changed; change points, the level between them and a creep's fitted line drawn. Memory axes start at
zero, so a few megabytes of allocator noise do not draw as a cliff."""

from __future__ import annotations

import datetime as dt
import math
import os
from html import escape
from pathlib import Path

from markupsafe import Markup

from pytest_infergate import units
from pytest_infergate.history import changepoint
from pytest_infergate.history.series import History, Series, SeriesChange, build_history, findings
from pytest_infergate.history.store import append_run, load_runs, report_beside
from pytest_infergate.measurement import METRICS
from pytest_infergate.report.charts import PAD_B, PAD_L, PAD_R, PAD_T, PALETTE, H, W, frame, scaled, value_text
from pytest_infergate.report.template_context import split_test_id
from pytest_infergate.results.run import RunResults
from pytest_infergate.stats import percentile

FAIL_MARK, INCONCLUSIVE_MARK = "#cf222e", "#bf8700"
WORSE, BETTER, CREEP = "#cf222e", "#1a7f37", "#bf8700"
FROM_ZERO_UNITS = ("MiB",)  # memory: a level, read against zero (and its budget), not a trend to magnify


def _y_axis(ticks: list[float], unit: str, py) -> str:
    out = [f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="ax"/>',
           f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="ax"/>']
    for value, label in zip(ticks, units.tick_labels(ticks)):
        y = py(value)
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end" class="tk">{label}</text>'
                   f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="grid"/>')
    mid = PAD_T + (H - PAD_B - PAD_T) / 2
    out.append(f'<text x="12" y="{mid}" transform="rotate(-90 12 {mid})" text-anchor="middle" class="tk">'
               f'{escape(unit)}</text>')
    return "".join(out)


def trend_chart(history: History, series: Series, unit: str, links: dict[int, str] | None = None) -> str:
    """links: run index -> href of that run's report."""
    points = series.points
    if not points:
        return ""
    links = links or {}
    from_zero = unit in FROM_ZERO_UNITS
    divisor, unit = scaled([p.high for p in points], unit)
    low = 0.0 if from_zero else min(p.low for p in points) / divisor
    ticks = units.nice_ticks(low, max(p.high for p in points) / divisor)
    y0, y1 = ticks[0], ticks[-1]
    n = len(history.runs)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T

    def px(run: float) -> float:
        return PAD_L + plot_w * (run - 0.5) / max(1, n)

    def py(value: float) -> float:
        return H - PAD_B - plot_h * (value - y0) / ((y1 - y0) or 1.0)

    body = [_y_axis(ticks, unit, py)]
    for tick in units.nice_ticks(1, n, 8):
        if 1 <= tick <= n and float(tick).is_integer():
            body.append(f'<text x="{px(tick):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">'
                        f'#{int(tick)}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">run</text>')
    for si, segment in enumerate(series.segments):
        first = segment.points[0].run
        if si:  # the environment changed: no line across, a marker that says what changed
            x = px(first - 0.5)
            body.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" stroke="#8c959f" '
                        f'stroke-dasharray="2 3"><title>environment changed at run #{first}: '
                        f'{escape(segment.change_from_previous)}</title></line>'
                        f'<text x="{x + 3:.1f}" y="{PAD_T + 10}" class="tk">env</text>')
        body += _levels(series, segment, px, py, divisor)
        line = " ".join(f"{px(p.run):.1f},{py(p.value / divisor):.1f}" for p in segment.points)
        body.append(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="1.5" points="{line}"/>')
        body += _creep(segment, px, py, divisor)
        for p in segment.points:
            body.append(_point(history, p, px(p.run), py, divisor, unit, links.get(p.run)))
    legend = [("run median", PALETTE[0]), ("gate failed", FAIL_MARK), ("inconclusive", INCONCLUSIVE_MARK),
              ("change", WORSE), ("creep", CREEP)]
    return frame(f"{series.name} · {series.test.partition('::')[2] or series.test}"[:90], "".join(body), legend)


def _point(history: History, p, x: float, py, divisor: float, unit: str, href: str | None) -> str:
    """One run: whisker and dot in the series' colour; the gate's verdict as a marker of its own above it."""
    run = history.run(p.run)
    why = f" · gate {p.status}" + (f": {p.why}" if p.why else "") if p.status else " · not gated"
    y = py(p.value / divisor)
    title = (f"<title>{escape(run.label)}, {escape(run.when)}: {escape(value_text(p.value / divisor, unit))} "
             f"(middle half {escape(value_text(p.low / divisor, unit))}–{escape(value_text(p.high / divisor, unit))})"
             f"{escape(why)}{' · click for its report' if href else ''}</title>")
    out = (f'<line x1="{x:.1f}" y1="{py(p.low / divisor):.1f}" x2="{x:.1f}" y2="{py(p.high / divisor):.1f}" '
           f'stroke="#8c959f"/><circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{PALETTE[0]}">{title}</circle>')
    top = py(p.high / divisor) - 9
    if p.status == "fail":
        out += (f'<path class="gate-fail" d="M{x - 4:.1f},{top - 4:.1f} l8,8 m0,-8 l-8,8" stroke="{FAIL_MARK}" '
                f'stroke-width="2"/>')
    elif p.status == "inconclusive":
        out += (f'<circle class="gate-inconclusive" cx="{x:.1f}" cy="{top:.1f}" r="4" fill="none" '
                f'stroke="{INCONCLUSIVE_MARK}" stroke-width="1.5"/>')
    return f'<a href="{escape(href)}">{out}</a>' if href else out


def _levels(series: Series, segment, px, py, divisor: float) -> list[str]:
    """The level (geometric mean) of each stretch between change points, and each change point's marker."""
    out = []
    bounds = [0] + [cp.index for cp in segment.change_points] + [len(segment.points)]
    if len(bounds) == 2:
        return out
    for a, b in zip(bounds, bounds[1:]):
        level = math.exp(sum(math.log(p.value) for p in segment.points[a:b]) / (b - a)) / divisor
        x0, x1 = px(segment.points[a].run - 0.4), px(segment.points[b - 1].run + 0.4)
        out.append(f'<line x1="{x0:.1f}" y1="{py(level):.1f}" x2="{x1:.1f}" y2="{py(level):.1f}" '
                   f'stroke="#8c959f" stroke-width="2" stroke-dasharray="6 3"/>')
    for cp in segment.change_points:
        run = segment.points[cp.index].run
        x = px(run - 0.5)
        color = WORSE if series.is_worse(cp.change) else BETTER
        out.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" stroke="{color}" '
                   f'stroke-width="1.5"><title>change at run #{run}: {units.change(cp.change)} (95% CI '
                   f'{units.change(cp.low)} to {units.change(cp.high)})</title></line>'
                   f'<text x="{x + 3:.1f}" y="{PAD_T + 22}" class="tk" style="fill:{color}">'
                   f'{units.change(cp.change)}</text>')
    return out


def _creep(segment, px, py, divisor: float) -> list[str]:
    """The Theil-Sen line over a creep's window (intercept: median of value minus slope × position)."""
    creep = segment.creep
    if not creep:
        return []
    window = segment.points[creep.start:]
    slope = math.log1p(creep.slope)
    intercept = percentile([math.log(p.value) - slope * i for i, p in enumerate(window)], 50)
    ends = [(window[0].run, intercept), (window[-1].run, intercept + slope * (len(window) - 1))]
    line = " ".join(f"{px(run):.1f},{py(math.exp(z) / divisor):.1f}" for run, z in ends)
    return [f'<polyline fill="none" stroke="{CREEP}" stroke-width="2.5" stroke-opacity="0.8" points="{line}">'
            f'<title>creep: {units.change(creep.drift)} over {len(window)} runs ({units.change(creep.slope)} per '
            f'run, Mann-Kendall p = {units.number(creep.p_value, 2)})</title></polyline>']


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
