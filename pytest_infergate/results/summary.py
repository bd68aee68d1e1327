"""The one summary of a run's results, as lines for the terminal (pytest's `infergate` section and
`infergate summary`) and as Markdown tables for CI step summaries."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.results.reasons import verdict_reasons
from pytest_infergate.results.records import (
    BatchInvarianceRecord,
    CorpusRecord,
    GoldenRecord,
    PerfRecord,
    QualityRecord,
    undefined_reason,
)
from pytest_infergate.results.run import RunResults, count_name, skipped_not_run
from pytest_infergate.status import Status

HF_GENERATE = "hf-generate"  # engine.backends.HF_GENERATE (this module does not import the engine, nor torch)
# a capacity search's found load first: it is the figure the search measured (a load run has none of it)
PERF_KEYS = ("capacity_concurrency", "capacity_rps", "ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50", "tokens_per_s",
             "peak_mem_mb", "success_rate", "goodput_per_s")
QUALITY_KEYS = ("rougeL", "exact_match", "mean_kl", "top1", "task_ratio")
QUALITY_NAMES = {"rougeL": "ROUGE-L", "exact_match": "exact match", "mean_kl": "mean KL", "top1": "top-1",
                 "task_ratio": "task ratio"}


@dataclass
class Line:
    text: str
    color: str | None = None  # "red", "yellow" or None

    @property
    def markup(self) -> dict[str, bool]:
        return {self.color: True} if self.color else {}


def figure(summary: dict, key: str, digits: int = 3) -> str:
    """A summary figure, or why it has none: "undefined (the reference passed no task check)"."""
    value = summary.get(key)
    if units.is_number(value):
        return units.metric_value(key, value) if units.metric_unit(key) else units.number(value, digits)
    reason = undefined_reason(summary, key)
    return f"undefined ({reason})" if reason else units.DASH


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
        check = f", self-check {units.number(r['self_check_s'])} s" if r.get("self_check_s") is not None else ""
        lines.append(Line(f"  {precision:>5}: load {units.number(r['load_s'])} s{check}, weights "
                          f"{units.mebibytes(r['weight_bytes'] / 2**20)}, load peak "
                          f"+{units.mebibytes(r.get('load_mem_delta_bytes', 0) / 2**20)} (process "
                          f"{units.mebibytes(r['peak_mem_bytes'] / 2**20)}, {r['peak_mem_method']}"
                          f"{_mapped(r)}), fingerprint {r['fingerprint']}{note}"))
        if r.get("backend") == HF_GENERATE:  # quiet on the engine: that is the default
            lines.append(Line(f"         backend: {HF_GENERATE}, because {r.get('backend_reason') or '?'}", "yellow"))
    if any(r.get("plain_text_prompts") for r in results.models.values()):
        lines.append(Line("  base model: prompts sent as plain text (the tokenizer has no chat template)", "yellow"))
    return lines


def _mapped(load: dict) -> str:
    """Why a process peak below the weights is no error: on the CPU, weights loaded from safetensors stay mapped
    from their file and are read in as a forward pass first touches them, after the load (the perf records' peak
    memory holds them)."""
    if load.get("device") != "cpu" or not 0 < load["peak_mem_bytes"] < load["weight_bytes"]:
        return ""  # a peak of 0: the meter could not read one (nothing to explain)
    return ": the weights are mapped from their file and read in at first use, after the load"


def unexplained_backend_lines(results: RunResults) -> list[Line]:
    """Why results ran on HF generate where no model line above says it (a compare model, results of a file
    without load records)."""
    explained = {m.get("backend_reason") for m in results.models.values() if m.get("backend") == HF_GENERATE}
    reasons = dict.fromkeys(r.backend_reason for r in results.records
                            if r.backend == HF_GENERATE and r.backend_reason not in explained)
    return [Line(f"backend: {HF_GENERATE} for some results, because {reason or '?'}", "yellow") for reason in reasons]


def backend_tag(record) -> str:
    """` [backend: hf-generate]` on the line of a result that did not run on the engine (nothing for the engine
    and for an endpoint, whose lines say so already); the model line above says why."""
    return f" [backend: {record.backend}]" if record.backend == HF_GENERATE else ""


def budget_metric(key: str) -> str:
    """The metric of a budget key: `ttft_ms_p95` -> `ttft_ms`."""
    base, _, pct = key.rpartition("_p")
    return base if base and pct.isdigit() else key


def metric_status(record: PerfRecord, metric: str) -> Status | None:
    """What the gates said about one metric of a measurement: its budgets and its baseline verdict; None when
    nothing checked it."""
    statuses = [v.status for v in record.violations if budget_metric(v.key) == metric]
    statuses += [v.status for v in record.verdicts if v.metric == metric]
    gated = statuses or any(budget_metric(k) == metric for k in record.budget if k != "max_regression")
    return Status.worst(statuses) if gated else None


def perf_figures(summary: dict) -> str:
    """Figures named by their keys, as budgets name them: `ttft_ms_p50 4,540 ms, tokens_per_s 12.3 tok/s`."""
    return ", ".join(f"{k} {figure(summary, k)}" for k in PERF_KEYS if k in summary)


def perf_lines(record: PerfRecord, saved: bool = False, evidence_above: bool = False) -> list[Line]:
    """A perf gate's line and its verdicts' reasons; `saved`: this run saved the baseline (a pass that compared
    nothing reads SAVED, not NO-BASELINE); `evidence_above`: the test's failure printed its evidence
    (reasons.verdict_reasons)."""
    figures = perf_figures(record.summary)
    errors = record.measurement.engine.get("errors")
    if errors:
        figures += ", errors " + ", ".join(f"{kind} ×{n}" for kind, n in sorted(errors.items()))
    # a pass that compared nothing says so where the eye lands: not a bare PASS
    nothing = record.compared_nothing or (record.relative_check_missing and not record.has_limits)
    is_save = saved and record.compared_nothing
    shown = record.status.value.upper()
    if nothing and record.status == Status.PASS:
        shown = "SAVED" if is_save else "NO-BASELINE"
    repetitions = record.measurement.repetitions
    if repetitions > 1:  # a comparison's figures are its fastest repetitions': these differ, and say why
        fastest = any(v.repetitions for v in record.verdicts)
        # the progress lines count the plan's repetitions; a failure's fresh block comes after them
        fresh = record.outcome.confirmed
        figures += f" (all {repetitions} repetitions pooled" + (f", the last {fresh} a failure's fresh block"
                                                               if fresh else "") + (
            "; the comparisons below read each side's fastest repetitions)" if fastest else
            f"; {saved_figures(record)})" if is_save else ")")
    lines = [Line(f"  perf {shown:12s} {record.test}{backend_tag(record)}: {figures}", _color(record.status))]
    lines += [Line(f"      {reason}") for reason in verdict_reasons(record, evidence_above)]
    return lines


def saved_figures(record: PerfRecord) -> str:
    """What later runs compare with, on the save's line: the fastest repetitions' figure of each time-like metric its
    budget compares, at the percentile it gates, as every comparison's "baseline" says it."""
    from pytest_infergate.measurement import METRICS, scales_with_speed
    from pytest_infergate.perf.budget import BudgetError, parse_budget
    from pytest_infergate.perf.stored import compared_figure

    try:
        budget = parse_budget(record.budget)
    except BudgetError:  # a results file of another version: its figures are not named here
        return "saved"
    gated = [(metric, budget.percentile_of(metric) if METRICS[metric][2] else None)
             for metric in budget.relative_metrics() if scales_with_speed(metric)]
    read = [(f"{metric}_p{pct:g}" if pct else metric, metric, compared_figure(record.measurement, metric, pct))
            for metric, pct in sorted(gated, key=lambda gate: METRICS[gate[0]][1])]  # latencies, then throughputs
    shown = ", ".join(f"{key} {units.metric_value(metric, value)}" for key, metric, value in read if value)
    return f"later runs compare with its fastest repetitions: {shown}" if shown else "saved"


def quality_figures(summary: dict) -> str:
    return ", ".join(f"{k} {figure(summary, k)}" for k in QUALITY_KEYS if k in summary)


@dataclass
class QualityGroup:
    """Every test that compared one precision with one reference precision (a suite may run the same comparison
    from several tests, each under its own policy)."""

    precision: str
    reference: str
    records: list[QualityRecord]

    @property
    def status(self) -> Status:
        return Status.worst(r.status for r in self.records)

    @property
    def comparisons(self) -> list[QualityRecord]:
        """One record per distinct comparison (sample set): the figures to show once."""
        distinct: dict[tuple, QualityRecord] = {}
        for record in self.records:
            distinct.setdefault(tuple(s.id for s in record.result.samples) or (record.test,), record)
        return list(distinct.values())

    @property
    def is_self_comparison(self) -> bool:
        return self.precision == self.reference


def quality_groups(records: list[QualityRecord]) -> list[QualityGroup]:
    groups: dict[tuple[str, str], QualityGroup] = {}
    for record in records:
        key = (record.precision, record.reference_precision)
        groups.setdefault(key, QualityGroup(*key, [])).records.append(record)
    return list(groups.values())


def quality_line(group: QualityGroup) -> Line:
    record = group.comparisons[0]
    tests = f"; {len(group.records)} tests" if len(group.records) > 1 else ""
    if group.is_self_comparison:
        return Line(f"  quality {group.status.value.upper():9s} {group.precision} vs {group.reference}: the reference "
                    f"against itself, identical by construction{tests}{backend_tag(record)}")
    return Line(f"  quality {group.status.value.upper():9s} {group.precision} vs {record.result.reference} "
                f"({record.summary['samples']} samples, {units.number(record.result.seconds)} s{tests})"
                f"{backend_tag(record)}: "
                f"{quality_figures(record.summary)}", _color(group.status))


def policy_lines(group: QualityGroup) -> list[Line]:
    """Under which policy each test of the group decided (a marker, an ini scope, the default of the precision's
    class), and the first threshold its interval could not decide."""
    if group.is_self_comparison:
        return []
    lines = []
    for record in group.records:
        who = f"{record.test}: {record.status.value.upper()} " if len(group.records) > 1 else ""
        if record.decided_by:  # a file written before the policy was named has none
            lines.append(Line(f"      {who}under the {record.decided_by}", _color(record.status)))
        lines += [Line(f"      inconclusive: {why}", _color(record.status)) for why in record.undecided[:1]]
        if len(group.records) == 1:  # what passed, beside what did not (a new user could not tell if KL passed)
            lines += [Line(f"      pass: {why}") for why in passed_thresholds(record)]
    return lines


def passed_thresholds(record: QualityRecord) -> list[str]:
    """Each aggregate threshold of the record's policy its interval passed, in the check's own words (its source
    left out: the line above names the policy)."""
    from pytest_infergate.quality.policy import recorded_checks

    return [check.describe() for check in recorded_checks(record.summary, record.policy)
            if check.status == Status.PASS]


def corpus_lines(record: CorpusRecord) -> list[Line]:
    """The corpus check: its figures with their intervals, the policy that decided, what it was compared with."""
    result, color = record.result, _color(record.status)
    lines = [Line(f"  corpus {record.status.value.upper():10s} {record.precision} vs {result.reference_precision} "
                  f"({units.number(result.seconds)} s): {result.line()}", color)]
    lines += [Line(f"      under the {record.decided_by}", color)] if record.decided_by else []
    lines += [Line(f"      against accepted: {result.accepted}", color)] if result.accepted else []
    return lines + [Line(f"      inconclusive: {why}", color) for why in record.undecided[:1]]


def golden_lines(record: GoldenRecord) -> list[Line]:
    if record.updated:
        return [Line(f"  golden UPDATED {record.precision}{backend_tag(record)}: {record.path}")] + [
            Line(f"      {change}") for change in record.changes[:20]]
    near = record.near_ties
    ties = (" (near-ties: " + ", ".join(f"{s.id} margin {s.divergence_margin:.2f}" for s in near[:3])
            + (", ..." if len(near) > 3 else "") + ")") if near else ""
    decided = f"; judged {record.decided_by}" if record.decided_by else ""
    lines = [Line(f"  golden {record.status.value.upper():10s} {record.precision}{backend_tag(record)}: "
                  f"{len(record.changed)} of {record.compared} outputs changed, {len(record.drift)} drift, "
                  f"{len(near)} near-ties{ties}{decided}", _color(record.status))]
    if record.model_change:  # a reviewer must see a model change was crossed, on a pass too
        lines.append(Line(f"      across a model change: {record.model_change}", _color(record.status)))
    if record.travel:
        lines.append(Line(f"      {record.travel}", _color(record.status)))
    return lines + [Line(f"      inconclusive: {why}", _color(record.status))
                    for why in record.undecided[:1]]


def batch_invariance_line(record: BatchInvarianceRecord) -> Line:
    result = record.result
    kls = ", ".join(f"{v.name} KL {units.number(v.mean_kl, 2)}" for v in result.variants if v.mean_kl is not None)
    example = result.example()
    shown = f"; e.g. {example.id} at token {example.token}" if example else ""
    if result.max_new_tokens is not None:
        shown += f"; first {result.max_new_tokens} tokens"
    if "max_batch_variant_share" not in record.policy:  # its pass is of no gate: measured, said so
        shown += "; measured, not gated (no max_batch_variant_share)"
    return Line(f"  batch invariance {record.status.value.upper():5s} {record.precision}{backend_tag(record)}: "
                f"{len(result.variant_ids)} "
                f"of {len(result.samples)} samples change with the batch ({result.variant_share:.0%}; {kls}){shown}",
                _color(record.status))


def gate_counts_line(results: RunResults) -> Line | None:
    """What the verdict was made of, counted as the verdict counts it (RunVerdict.counts): "gates: perf: 3 pass; not
    as asked: 3 inconclusive" above "infergate verdict: INCONCLUSIVE (3 inconclusive: not run as asked)"."""
    verdict = results.verdict()
    if not verdict.counts:
        return None
    # a perf pass that compared nothing is counted as the pass it is, and said so beside it (as the report's card)
    unbased = {"perf": f" ({verdict.compared_nothing} with no baseline)"} if verdict.compared_nothing else {}
    itself = verdict.reference_itself
    unbased |= {"quality": f" ({itself} the reference against itself: nothing gated)"} if itself else {}
    return Line("gates: " + "; ".join(f"{count_name(group)}: " + ", ".join(f"{n} {status}" for status, n in c.items()
                                                                          if n) + unbased.get(group, "")
                                      for group, c in verdict.counts.items()))


def summary_lines(results: RunResults, failures_shown: bool = False) -> list[Line]:
    """Models, every gate's verdict with its key figures, the counts, and every check that did not run as asked.
    `failures_shown`: pytest printed each failed test's message above (its FAILURES section): a perf gate whose
    outcome was its test's failure (PerfOutcome.said_in_failure) printed its evidence there, so its lines here name
    its checks and point there, not print it twice (not so under --tb=no, nor --tb=line: pytest 8 prints a
    failure's first line there)."""
    lines = model_lines(results) + unexplained_backend_lines(results)
    for record in results.perf:
        lines += perf_lines(record, saved=bool(results.saved_baseline),
                            evidence_above=failures_shown and record.outcome.said_in_failure)
    for group in quality_groups(results.quality):
        lines.append(quality_line(group))
        lines += policy_lines(group)
        # figures the policy does not gate: a note beside their gate, never a reason in the verdict
        lines += [Line(f"      note: {note}") for note in group.records[0].result.notes[:4]]
    for record in results.corpus:
        lines += corpus_lines(record)
    for record in results.golden:
        lines += golden_lines(record)
    lines += [batch_invariance_line(record) for record in results.batch_invariance]
    counts = gate_counts_line(results)
    if counts:
        lines.append(counts)
    # each check not run as asked is a reason of the verdict below ("INCONCLUSIVE not run as asked"), said there once
    # a test skipped with what would make it run is a row of the not-run table too: said as made, not only by -rs
    lines += [Line(f"SKIPPED {finding.text()}", "yellow") for finding in skipped_not_run(results)]
    if any(m.get("fallback") for m in results.models.values()) or any(
            getattr(r, "fallback", False) for r in results.records):
        lines.append(Line("infergate: some precisions ran as FALLBACK to the reference precision; their results do "
                          "not measure the requested precision", "red"))
    return lines + verdict_lines(results)


def verdict_lines(results: RunResults) -> list[Line]:
    """One line per reason, then the run's verdict: the last line, the one a CI log is read from. A reason is said by
    its lead, what a reviewer acts on: its evidence is its gate's lines above (perf_lines)."""
    verdict = results.verdict()
    return [Line(f"  {reason.text(lead_only=True)}", _color(reason.status)) for reason in verdict.reasons] + [
        Line(verdict.headline(), _color(verdict.status))]
