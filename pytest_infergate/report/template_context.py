"""What the report template shows, built from a run's results: perf rows grouped by test file, one quality
section per (precision, reference precision), the golden-output sections (each changed sample with its verdict,
near-tie or drift, and the margin that decided it) and batch invariance (which precisions' greedy answers change
with their batch, one sample shown), the charts, the diagnosis notes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from markupsafe import Markup, escape

from pytest_infergate import units
from pytest_infergate.measurement import METRICS
from pytest_infergate.quality.golden_generation import Divergence
from pytest_infergate.quality.metrics import SampleQuality
from pytest_infergate.report.corpus import corpus_sections
from pytest_infergate.report.diagnosis import diagnose
from pytest_infergate.report.serving import (
    AB_COLUMNS,
    SERVER_COLUMNS,
    TOKEN_COUNTERS,
    RanOn,
    ab_runs,
    capacity_sections,
    prefix_cache_detail,
    served,
    server_metric_rows,
    slow_tails,
)
from pytest_infergate.results.records import BatchInvarianceRecord, GoldenRecord, PerfRecord
from pytest_infergate.results.run import RunResults, not_run
from pytest_infergate.results.summary import HF_GENERATE, budget_metric, quality_groups, verdict_reasons
from pytest_infergate.results.summary import figure as summary_figure
from pytest_infergate.status import Status

# the perf table's figure columns: (summary key, header); the header names the metric as the budget keys and the
# metrics reference do, so a reviewer reads the figure a gate used under the name it used
PERF_COLUMNS = (("ttft_ms_p50", "ttft_ms p50"), ("ttft_ms_p95", "ttft_ms p95"), ("tpot_ms_p50", "tpot_ms p50"),
                ("tokens_per_s", "tokens_per_s"), ("peak_mem_mb", "peak_mem_mb"))
# what each column's figure is (the header's tooltip and the legend under the table)
COLUMN_DEFINITIONS = {
    "ttft_ms": "time to first token per request (sent or arrived → first token), percentile over requests",
    "tpot_ms": "time per output token after the first, per request: (e2e − TTFT) / (tokens − 1)",
    "tokens_per_s": "output tokens of completed requests / the repetition's wall time, median over repetitions "
                    "(the figure budgets gate; a stored baseline compares each side's fastest repetitions, named in "
                    "the row's verdict; per-request rates are not shown)",
    "peak_mem_mb": "weights + KV cache allocated + the process peak's rise while serving",
}
# shown in a row's details instead of a column of their own
DETAIL_KEYS = ("ttft_ms_p99", "tpot_ms_p95", "e2e_ms_p50", "e2e_ms_p99", "requests_per_s", "queue_ms_p50")


def split_test_id(test: str) -> tuple[str, str]:
    """(file, the rest, as a reader sees it): `suites/test_kv.py::test_gain[fp32]::long` -> `suites/test_kv.py`,
    `test_gain[fp32]::long`. A parameter with an empty id (pytest writes `test_x[]`) reads `test_x[(empty id)]`."""
    file, sep, rest = test.partition("::")
    rest = rest if sep else test
    return (file if sep else ""), rest.replace("[]", "[(empty id)]")


def column(key: str, pct: int | None = None) -> str:
    """The summary key (table column) a budget key or a verdict speaks about: `ttft_ms` -> `ttft_ms_p50`."""
    metric = budget_metric(key)
    if metric not in METRICS or not METRICS[metric][2]:
        return metric
    return key if metric != key else f"{metric}_p{pct or 50}"


def _budget_text(record: PerfRecord) -> dict[str, str]:
    out = {}
    for key, value in record.budget.items():
        if value is not None and key != "max_regression" and budget_metric(key) in METRICS:
            bound = "≥" if METRICS[budget_metric(key)][1] else "≤"
            out[column(key)] = f"{bound} {units.metric_value(key, value)}"
    return out


def _cell_status(record: PerfRecord) -> dict[str, str]:
    """Each figure column the gates checked: its worst verdict (a broken budget is a fail)."""
    found: dict[str, list[Status]] = {}
    for v in record.violations:
        found.setdefault(column(v.key), []).append(v.status)
    for v in record.verdicts:
        found.setdefault(column(v.metric, v.percentile), []).append(v.status)
    return {key: Status.worst(statuses).value for key, statuses in found.items()}


def _verdict_figures(record: PerfRecord) -> dict[str, str]:
    """Each figure column whose verdict compared another statistic than the column shows (a stored baseline's
    least-disturbed repetitions): that figure, the statistic named, so one metric reads as one figure."""
    return {column(v.metric, v.percentile): f"{units.metric_value(v.metric, v.candidate)} ({v.statistic()})"
            for v in record.verdicts if v.statistic()}


def _perf_row(r: PerfRecord) -> dict:
    engine = r.measurement.engine
    file, label = split_test_id(r.test)
    ran_on = RanOn.of(r)
    return {"test": r.test, "file": file, "label": label, "precision": r.precision, "endpoint": ran_on.served,
            # an endpoint run's "batching" is its load pattern; its cache is the server's business
            "batching": ran_on.setting, "cache": "server" if ran_on.served else "transformers' cache"
            if r.backend == HF_GENERATE else r.engine_config.get("cache_mode"),
            "hf_generate": r.backend == HF_GENERATE, "backend_reason": r.backend_reason,
            "status": r.status.value if r.gated or r.status != Status.PASS else "measured, not gated",
            "reasons": verdict_reasons(r), "errors": engine.get("errors") or {},
            "slo": engine.get("slo") or {}, "requests": r.measurement.num_requests, "fallback": r.fallback,
            "s": r.summary, "memory": r.measurement.memory, "notes": r.notes, "budget": _budget_text(r),
            "cell_status": _cell_status(r), "verdict_figures": _verdict_figures(r),
            "violated": {column(v.key) for v in r.violations},
            "met": [f"{key} {text}" for key, text in _budget_text(r).items()
                    if key not in {column(v.key) for v in r.violations}],
            "details": [(key, summary_figure(r.summary, key)) for key in DETAIL_KEYS if key in r.summary],
            "prefix_cache": prefix_cache_detail(r),
            "record": r}


def perf_groups(records: list[PerfRecord]) -> list[dict]:
    """Rows by test file, in the order the files first appear (an endpoint's rows too, precision `endpoint`)."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        row = _perf_row(record)
        groups.setdefault(row["file"], []).append(row)
    return [{"file": file, "rows": rows} for file, rows in groups.items()]


def backend_notes(results: RunResults) -> list[dict]:
    """Where the engine did not run a workload: each distinct reason, with the models and results it applies to
    (nothing when everything ran on the engine)."""
    notes: dict[str, dict] = {}
    for precision, m in results.models.items():
        if m.get("backend") == HF_GENERATE:
            notes.setdefault(m.get("backend_reason") or "?", {"models": [], "results": 0})["models"].append(precision)
    for record in results.records:
        if record.backend == HF_GENERATE:
            notes.setdefault(record.backend_reason or "?", {"models": [], "results": 0})["results"] += 1
    return [{"reason": reason, **where} for reason, where in notes.items()]


def _highlight(text: str, at: int | None) -> Markup:
    if at is None:
        return escape(text)
    return escape(text[:at]) + Markup('<mark class="div">') + escape(text[at:]) + Markup("</mark>")


def _changed(precision: str, s: SampleQuality) -> dict:
    return {"precision": precision, "id": s.id, "category": s.category, "rougeL": s.rougeL, "kl": s.mean_kl,
            "divergence": s.first_divergence, "regression": s.regression, "margin": s.divergence_margin,
            "reference": _highlight(s.reference_text, s.first_divergence_char),
            "candidate": _highlight(s.candidate_text, s.first_divergence_char)}


def _changed_samples(results: RunResults, groups) -> list[dict]:
    """Each changed sample once, however many tests ran its comparison."""
    out = [_changed(f"{g.precision} vs {g.reference}", s) for g in groups if not g.is_self_comparison
           for q in g.comparisons for s in q.result.samples if not s.exact_match]
    out += [_changed(g.precision + " vs accepted golden", s) for g in results.golden for s in g.changed]
    seen, unique = set(), []
    for sample in out:
        key = (sample["precision"], sample["id"], str(sample["candidate"]))
        if key not in seen:
            seen.add(key)
            unique.append(sample)
    return unique


def _quality_sections(groups) -> list[dict]:
    return [{"precision": g.precision, "reference": g.reference, "status": g.status.value,
             "self": g.is_self_comparison, "hf_generate": any(r.backend == HF_GENERATE for r in g.records),
             "tests": [{"test": r.test, "label": split_test_id(r.test)[1], "status": r.status.value,
                        "problems": r.problems, "undecided": r.undecided, "policy": r.policy,
                        "decided_by": r.decided_by}
                       for r in g.records],
             "comparisons": [r.to_dict() for r in g.comparisons]} for g in groups]


def nats(value: float | None) -> str:
    return f"{units.number(value)} nats" if units.is_number(value) else units.DASH


@dataclass
class GoldenChange:
    id: str
    category: str
    verdict: str  # near-tie / drift / "–" (a file written before the classification)
    reason: str
    margin: str  # log p(current top token) - log p(accepted token) at the first divergence
    mean_kl: str
    divergence_token: int | None


@dataclass
class GoldenSection:
    test: str
    precision: str
    status: str  # pass / fail / updated
    path: str
    compared: int
    near_ties: int
    drift: int
    changes: list[GoldenChange]
    problems: list[str]
    environment_mismatch: list[str]
    policy: str  # the regression policy applied, as text
    undecided: list[str]  # why it is inconclusive
    decided_by: str = ""  # which evidence decided (GoldenRecord.decided_by)
    travel: str = ""  # on another machine: quality against the reference, this machine vs the accepted one


def golden_sections(records: list[GoldenRecord]) -> list[GoldenSection]:
    out = []
    for r in records:
        changes = [GoldenChange(s.id, s.category, s.regression or units.DASH, s.regression_reason or "",
                                nats(s.divergence_margin), nats(s.mean_kl), s.first_divergence) for s in r.changed]
        drift_first = sorted(changes, key=lambda c: c.verdict == "near-tie")  # drift decides a failure: first
        out.append(GoldenSection(r.test, r.precision, "updated" if r.updated else r.status.value, r.path, r.compared,
                                 len(r.near_ties), len(r.drift), drift_first, list(r.problems),
                                 list(r.environment_mismatch),
                                 ", ".join(f"{key} {units.number(value)}" for key, value in r.policy.items()),
                                 list(r.undecided), r.decided_by, r.travel))
    return out


@dataclass
class VariantSummary:
    name: str
    description: str
    changed: int
    samples: int
    mean_kl: str
    max_kl: str


@dataclass
class BatchInvarianceSection:
    test: str
    precision: str
    status: str
    batch_variant: bool  # some sample's greedy answer changed with its batch
    variant_samples: int
    samples: int
    share: str
    variants: list[VariantSummary]
    example: Divergence | None
    example_variant: str  # the variant it changed in
    example_margin: str
    problems: list[str]
    notes: list[str]
    compared: str  # which tokens of each sample were compared


def batch_invariance_sections(records: list[BatchInvarianceRecord]) -> list[BatchInvarianceSection]:
    out = []
    for r in records:
        result = r.result
        example = result.example()
        where = next((v.name for v in result.variants if example is not None and example in v.changed), "")
        out.append(BatchInvarianceSection(
            r.test, r.precision, r.status.value, bool(result.variant_ids), len(result.variant_ids),
            len(result.samples), units.percent(result.variant_share),
            [VariantSummary(v.name, v.description, len(v.changed), v.samples, nats(v.mean_kl), nats(v.max_kl))
             for v in result.variants],
            example, where, nats(example.margin) if example is not None else units.DASH, list(r.problems),
            list(result.notes),
            "every token" if result.max_new_tokens is None else f"first {result.max_new_tokens} tokens"))
    return out


def build_context(results: RunResults, commit: str | None = None, history=None,
                  history_href: str | None = None) -> dict:
    from pytest_infergate.report.run_charts import figures

    env = results.environment
    reference = env.get("reference_precision", "fp32")
    groups = quality_groups(results.quality)
    methods = [r.measurement.memory.get("method") for r in results.perf if r.measurement.memory.get("method")]
    outcomes = results.outcomes
    started = results.started
    return {
        "started": dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "?",
        "commit": commit or results.commit, "run_id": results.run_id, "environment": env, "models": results.models,
        "perf_groups": perf_groups(results.perf), "perf_columns": PERF_COLUMNS,
        "column_definitions": COLUMN_DEFINITIONS,
        "memory_method": methods[0] if methods else "",
        "quality": _quality_sections(groups), "golden": golden_sections(results.golden),
        "batch_invariance": batch_invariance_sections(results.batch_invariance),
        "corpus": corpus_sections(results.corpus),
        "endpoint_perf": [_perf_row(r) for r in served(results.perf)],
        "servers": server_metric_rows(results.perf), "server_columns": SERVER_COLUMNS,
        "slow_tails": slow_tails(results.perf),
        "token_counters": TOKEN_COUNTERS, "ab_runs": ab_runs(results.perf), "ab_columns": AB_COLUMNS,
        "capacity": capacity_sections(results.perf),
        "figures": [Markup(f) for f in figures(results) if f], "changed_samples": _changed_samples(results, groups),
        "notes": diagnose(results, reference, history), "counts": results.gate_counts(),
        "warnings": results.warnings, "not_run": not_run(results)[0], "skipped_by_design": not_run(results)[1],
        "history_href": history_href, "backend_notes": backend_notes(results),
        "history_runs": len(history.runs) if history is not None else 0,
        "tests": {"passed": sum(1 for o in outcomes.values() if o == "passed"),
                  "failed": sum(1 for o in outcomes.values() if o in ("failed", "error")),
                  "skipped": sum(1 for o in outcomes.values() if o == "skipped")},
        "reference": reference,
        "verdict": results.verdict(), "verdict_strict": results.strict,
    }
