"""The one summary of a run's results, as lines for the terminal (pytest's `infergate` section and
`infergate summary`) and as Markdown tables for CI step summaries."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    GoldenRecord,
    PerfRecord,
    QualityRecord,
    RunResults,
)
from pytest_infergate.status import Status

PERF_KEYS = ("ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50", "tokens_per_s", "peak_mem_mb", "success_rate",
             "goodput_per_s")
QUALITY_KEYS = ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")


@dataclass
class Line:
    text: str
    color: str | None = None  # "red", "yellow" or None

    @property
    def markup(self) -> dict[str, bool]:
        return {self.color: True} if self.color else {}


def _color(status: Status) -> str | None:
    return {Status.FAIL: "red", Status.INCONCLUSIVE: "yellow"}.get(status)


def model_lines(results: RunResults) -> list[Line]:
    lines = []
    environment = results.environment
    if environment.get("endpoint"):
        endpoint = environment["endpoint"]
        lines.append(Line(f"endpoint: {endpoint.get('url')} serving {endpoint.get('served_model')!r} "
                          f"({endpoint.get('api')} API)"))
    if results.models:
        lines.append(Line(f"model: {environment.get('model')} ({environment.get('model_name')}) on "
                          f"{environment.get('device')}"))
    for precision, r in results.models.items():
        note = f"  FALLBACK from {precision}: {r.get('fallback_reason')}" if r.get("fallback") else ""
        lines.append(Line(f"  {precision:>5}: load {r['load_s']:.2f}s, weights {r['weight_bytes'] / 2**20:.1f} MiB, "
                          f"load peak +{r.get('load_mem_delta_bytes', 0) / 2**20:.0f} MiB (process "
                          f"{r['peak_mem_bytes'] / 2**20:.0f} MiB, {r['peak_mem_method']}), fingerprint "
                          f"{r['fingerprint']}{note}"))
    return lines


def perf_lines(record: PerfRecord) -> list[Line]:
    summary = record.summary
    figures = ", ".join(f"{k} {summary[k]:.4g}" for k in PERF_KEYS if k in summary)
    errors = record.measurement.engine.get("errors")
    if errors:
        figures += ", errors " + ", ".join(f"{kind} x{n}" for kind, n in sorted(errors.items()))
    backend = f" [{record.backend}]" if record.backend == "hf-generate" else ""
    lines = [Line(f"  perf {record.status.value.upper():12s} {record.test}{backend}: {figures}", _color(record.status))]
    for verdict in record.verdicts:
        lines.append(Line(f"      {verdict.metric}: x{verdict.ratio:.3f} vs baseline (CI {verdict.low:.3f}-"
                          f"{verdict.high:.3f}, threshold x{verdict.threshold:.2f}) {verdict.status.value}"))
    return lines


def quality_line(record: QualityRecord) -> Line:
    summary = record.summary
    figures = ", ".join(f"{k} {summary[k]:.3g}" for k in QUALITY_KEYS if k in summary)
    return Line(f"  quality {record.status.value.upper():9s} {record.precision} vs {record.reference_precision} "
                f"({summary['samples']} samples, {record.result.seconds:.0f}s): {figures}", _color(record.status))


def golden_lines(record: GoldenRecord) -> list[Line]:
    if record.updated:
        return [Line(f"  golden UPDATED {record.precision}: {record.path}")] + [
            Line(f"      {change}") for change in record.changes[:20]]
    near = record.near_ties
    ties = (" (near-ties: " + ", ".join(f"{s.id} margin {s.divergence_margin:.2f}" for s in near[:3])
            + (", ..." if len(near) > 3 else "") + ")") if near else ""
    return [Line(f"  golden {record.status.value.upper():10s} {record.precision}: {len(record.changed)} of "
                 f"{record.compared} outputs changed, {len(record.drift)} drift, {len(near)} near-ties{ties}",
                 _color(record.status))]


def batch_invariance_line(record: BatchInvarianceRecord) -> Line:
    result = record.result
    kls = ", ".join(f"{v.name} KL {v.mean_kl:.1e}" for v in result.variants if v.mean_kl is not None)
    example = result.example()
    shown = f"; e.g. {example.id} at token {example.token}" if example else ""
    return Line(f"  batch invariance {record.status.value.upper():5s} {record.precision}: {len(result.variant_ids)} "
                f"of {len(result.samples)} samples change with the batch ({result.variant_share:.0%}; {kls}){shown}",
                _color(record.status))


def gate_counts_line(results: RunResults) -> Line | None:
    counts = results.gate_counts()
    if not counts:
        return None
    return Line("gates: " + "; ".join(f"{kind}: " + ", ".join(f"{n} {status}" for status, n in c.items() if n)
                                      for kind, c in counts.items()))


def summary_lines(results: RunResults) -> list[Line]:
    """Models, every gate's verdict with its key figures, the counts, and every check that did not run as asked."""
    lines = model_lines(results)
    for record in results.perf:
        lines += perf_lines(record)
    lines += [quality_line(record) for record in results.quality]
    for record in results.golden:
        lines += golden_lines(record)
    lines += [batch_invariance_line(record) for record in results.batch_invariance]
    counts = gate_counts_line(results)
    if counts:
        lines.append(counts)
    for warning in results.warnings:
        lines.append(Line(f"WARNING {warning}", "yellow"))
    if any(m.get("fallback") for m in results.models.values()) or any(
            getattr(r, "fallback", False) for r in results.records):
        lines.append(Line("infergate: some precisions ran as FALLBACK to the reference precision; their results do "
                          "not measure the requested precision", "red"))
    return lines


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, alignment row (text columns left, figures right) and rows."""
    align = ["---" if i < 3 else "---:" for i in range(len(header))]
    return ["", "| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(row) + " |" for row in rows]


def _figures(summary: dict, keys: tuple[str, ...], digits: int) -> list[str]:
    return [f"{summary[k]:.{digits}g}" if k in summary else "–" for k in keys]


def summary_markdown(results: RunResults) -> str:
    lines = ["## pytest-infergate", ""]
    for gate, c in results.gate_counts().items():
        lines.append(f"- **{gate}**: {c.get('pass', 0)} pass, {c.get('fail', 0)} fail, "
                     f"{c.get('inconclusive', 0)} inconclusive")
    for warning in results.warnings:
        lines.append(f"- ⚠ {warning}")
    if results.perf:
        keys = ("ttft_ms_p50", "tpot_ms_p50", "tokens_per_s", "peak_mem_mb")
        lines += _markdown_table(["test", "precision", "verdict", "TTFT p50 ms", "TPOT p50 ms", "tok/s", "peak MiB"],
                                 [[f"`{r.test}`", r.precision, r.status.value, *_figures(r.summary, keys, 4)]
                                  for r in results.perf])
    if results.quality:
        lines += _markdown_table(["precision", "vs", "verdict", "ROUGE-L", "exact match", "mean KL", "top-1",
                                  "task ratio"],
                                 [[r.precision, r.reference_precision, r.status.value,
                                   *_figures(r.summary, QUALITY_KEYS, 3)] for r in results.quality])
    return "\n".join(lines) + "\n"
