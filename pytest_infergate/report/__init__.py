"""The HTML regression report: one self-contained file (no external assets), rendered with jinja2 and
autoescaping, since model outputs are untrusted text."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

from markupsafe import Markup

from pytest_infergate.perf.metrics import METRICS
from pytest_infergate.quality.metrics import SampleQuality
from pytest_infergate.report import charts
from pytest_infergate.report.diagnosis import diagnose
from pytest_infergate.results.records import PerfRecord, RunResults

# budgets on these are lower bounds (">="); on every other metric upper bounds
METRICS_HIGHER = tuple(metric for metric, (_, higher_is_better, _) in METRICS.items() if higher_is_better)


def git_commit(where: Path | None = None) -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _perf_rows(records: list[PerfRecord]) -> list[dict]:
    rows = []
    for r in records:
        budget_text = {}
        for key, value in r.budget.items():
            if value is not None and key in METRICS_HIGHER:
                budget_text[key] = f"≥ {value:.4g}"
            elif value is not None and key != "max_regression":
                budget_text[key] = f"≤ {value:.4g}"
        engine = r.measurement.engine
        rows.append({"test": r.test, "precision": r.precision, "endpoint": r.is_endpoint,
                     # an endpoint run's "batching" is its load pattern; its cache is the server's business
                     "batching": r.engine_config.get("pattern") if r.is_endpoint else r.engine_config.get("batching"),
                     "cache": "server" if r.is_endpoint else r.engine_config.get("cache_mode"),
                     "status": r.status.value, "errors": engine.get("errors") or {}, "slo": engine.get("slo") or {},
                     "requests": r.measurement.num_requests, "fallback": r.fallback, "s": r.summary,
                     "memory": r.measurement.memory, "verdicts": {v.metric: v for v in r.verdicts},
                     "violated": {v.key for v in r.violations}, "budget": budget_text, "notes": r.notes,
                     "record": r})
    return rows


def _highlight(text: str, at: int | None) -> Markup:
    from markupsafe import escape

    if at is None:
        return escape(text)
    return escape(text[:at]) + Markup('<mark class="div">') + escape(text[at:]) + Markup("</mark>")


def _changed(precision: str, s: SampleQuality) -> dict:
    return {"precision": precision, "id": s.id, "category": s.category, "rougeL": s.rougeL, "kl": s.mean_kl,
            "divergence": s.first_divergence, "reference": _highlight(s.reference_text, s.first_divergence_char),
            "candidate": _highlight(s.candidate_text, s.first_divergence_char)}


def build_context(results: RunResults, commit: str | None = None) -> dict:
    env = results.environment
    reference = env.get("reference_precision", "fp32")
    perf = _perf_rows(results.perf)

    models = results.models
    precisions = list(models) or sorted({r["precision"] for r in perf if not r["endpoint"]})
    if any(r["endpoint"] for r in perf):  # the server beside the local precisions
        precisions.append("endpoint")
    figures = []
    # tokens/s and peak memory by precision (best run of each precision)
    tps = {p: max((r["s"].get("tokens_per_s", 0) for r in perf if r["precision"] == p), default=None)
           for p in precisions}
    if any(tps.values()):
        figures.append(charts.bar_chart("Tokens/s by precision", precisions, {"tokens/s": [tps[p] for p in precisions]},
                                        "tok/s"))
    if models:
        precisions = [p for p in precisions if p in models]  # a remote server's memory is not measured here
        series = {"weights": [models[p]["weight_bytes"] / 2**20 for p in precisions]}
        kv = {p: max((r["memory"].get("kv_allocated_mb", 0) for r in perf if r["precision"] == p), default=None)
              for p in precisions}
        if any(kv.values()):
            series["KV cache"] = [kv[p] for p in precisions]
        run_peak = {p: max((r["s"].get("peak_mem_mb", 0) for r in perf if r["precision"] == p), default=None)
                    for p in precisions}
        if any(run_peak.values()):
            series["peak while serving"] = [run_peak[p] for p in precisions]
        figures.append(charts.bar_chart("Memory by precision", precisions, series, "MiB"))
    ttft = {(r["batching"] if r["endpoint"] else f"{r['precision']} {r['batching']}"):
            r["record"].measurement.samples.get("ttft_ms", []) for r in perf}
    ttft = {k: v for k, v in list(ttft.items())[:6] if v}
    if ttft:
        figures.append(charts.histogram("TTFT distribution", ttft, "ms"))
    with_steps = [r for r in results.perf if r.measurement.steps]
    timeline_record = next((r for r in with_steps if r.engine_config.get("batching") == "continuous"),
                           with_steps[0] if with_steps else None)
    if timeline_record:
        name = timeline_record.test.split("::")[-1]
        figures.append(charts.timeline(f"Engine timeline: {name[:50]}", timeline_record.measurement.steps[:400]))
    kv = {}
    for r in results.perf:
        if "max_new_tokens" in r.tags and r.tags.get("experiment") == "kv-cache-length":
            kv.setdefault(r.engine_config["cache_mode"], {})[r.tags["max_new_tokens"]] = r.summary["tokens_per_s"]
    if len(kv) >= 2:
        xs = sorted({x for series in kv.values() for x in series})
        figures.append(charts.line_chart("KV cache on vs off over generation length", xs,
                                         {("cache " + mode if mode != "none" else "no cache"):
                                          [series.get(x) for x in xs] for mode, series in kv.items()},
                                         "tok/s", "max_new_tokens"))

    changed_samples = [_changed(q.precision, s) for q in results.quality for s in q.result.samples
                       if not s.exact_match]
    changed_samples += [_changed(g.precision + " vs accepted golden", s) for g in results.golden for s in g.changed]
    outcomes = results.outcomes
    started = results.started
    return {
        "started": dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "?",
        "commit": commit, "environment": env, "models": models, "perf": perf,
        "quality": [r.to_dict() for r in results.quality], "golden": [r.to_dict() for r in results.golden],
        "endpoint_perf": [r for r in perf if r["endpoint"]], "figures": [Markup(f) for f in figures if f],
        "changed_samples": changed_samples, "notes": diagnose(results, reference), "counts": results.gate_counts(),
        "warnings": results.warnings,
        "tests": {"passed": sum(1 for o in outcomes.values() if o == "passed"),
                  "failed": sum(1 for o in outcomes.values() if o in ("failed", "error")),
                  "skipped": sum(1 for o in outcomes.values() if o == "skipped")},
        "reference": reference,
    }


def render(results: RunResults, commit: str | None = None) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("pytest_infergate.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = lambda v, digits=3: "–" if v is None else (f"{v:.{digits}g}" if isinstance(v, float) else v)
    return env.get_template("report.html").render(**build_context(results, commit))


def write_report(results: RunResults, path: Path, commit: str | None = None) -> None:
    from pytest_infergate.atomic import write_text_atomic

    write_text_atomic(Path(path), render(results, commit))
