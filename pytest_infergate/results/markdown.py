"""The run's summary as Markdown, for a CI step summary (`infergate summary --markdown`, $GITHUB_STEP_SUMMARY): the
verdict and its reasons as the terminal says them (results.summary), the counts, and a table per gate kind."""

from __future__ import annotations

from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults, count_name, skipped_not_run
from pytest_infergate.results.summary import QUALITY_KEYS, QUALITY_NAMES, figure, quality_groups
from pytest_infergate.status import Status


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, alignment row (text columns left, figures right) and rows."""
    align = ["---" if i < 3 else "---:" for i in range(len(header))]
    return ["", "| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(row) + " |" for row in rows]


def summary_markdown(results: RunResults) -> str:
    verdict = results.verdict()
    lines = ["## pytest-infergate", "", f"**{verdict.headline()}**", ""]
    lines += [f"- {reason.text()}" for reason in verdict.reasons] + ([""] if verdict.reasons else [])
    for group, c in verdict.counts.items():  # the verdict's own counts: they add up to its headline's
        lines.append(f"- **{count_name(group)}**: " + ", ".join(f"{n} {status}" for status, n in c.items() if n))
    for warning in results.warnings:
        lines.append(f"- ⚠ {warning}")
    lines += [f"- skipped: {finding.text()}" for finding in skipped_not_run(results)]
    if results.perf:
        columns = {"ttft_ms_p50": "TTFT p50", "tpot_ms_p50": "TPOT p50", "tokens_per_s": "throughput",
                   "peak_mem_mb": "peak memory"}
        if any("capacity_rps" in r.summary for r in results.perf):  # a capacity search: the load it found
            columns = {"capacity_concurrency": "capacity (in flight)", "capacity_rps": "capacity (req/s)", **columns}
        lines += _markdown_table(["test", "precision", "verdict", *columns.values()],
                                 [[f"`{r.test}`", r.precision, _why_markdown(r),
                                   *[figure(r.summary, k) for k in columns]] for r in results.perf])
    if results.quality:
        lines += _markdown_table(["precision", "vs", "verdict", *(QUALITY_NAMES[k] for k in QUALITY_KEYS)],
                                 [[g.precision, g.reference, g.status.value,
                                   *[figure(g.comparisons[0].summary, k) for k in QUALITY_KEYS]]
                                  for g in quality_groups(results.quality)])
    return "\n".join(lines) + "\n"


def _why_markdown(record: PerfRecord) -> str:
    """The gate's status and the sentence of each check that did not pass: its evidence is the reason's, in the
    list above the table (said once)."""
    checks = [v.line() for v in record.violations] + [f"{v.sentence()}: {v.status.upper()}" for v in record.verdicts
                                                       if v.status != Status.PASS]
    return record.status.value + "".join("<br>" + check.replace("|", "\\|") for check in checks)
