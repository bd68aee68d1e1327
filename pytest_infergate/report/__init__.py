"""The HTML regression report: one self-contained file (no external assets), rendered with jinja2 and
autoescaping, since model outputs are untrusted text."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

from markupsafe import Markup

from pytest_infergate.perf import METRICS
from pytest_infergate.report import charts
from pytest_infergate.report.diagnosis import diagnose

# budgets on these are lower bounds (">="); on every other metric upper bounds
METRICS_HIGHER = tuple(metric for metric, (_, higher_is_better, _) in METRICS.items() if higher_is_better)


def git_commit(where: Path | None = None) -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _perf_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in records:
        if r.get("kind") != "perf":
            continue
        s, memory = r.get("summary", {}), r.get("measurement", {}).get("memory", {})
        verdicts = {v["metric"]: v for v in r.get("verdicts", [])}
        violated = {v["key"] for v in r.get("violations", [])}
        budget_text = {}
        for key, value in (r.get("budget") or {}).items():
            if value is not None and key in METRICS_HIGHER:
                budget_text[key] = f"≥ {value:.4g}"
            elif value is not None and key != "max_regression":
                budget_text[key] = f"≤ {value:.4g}"
        config = r.get("engine_config") or {}
        endpoint = r.get("backend") == "endpoint"
        engine = r.get("measurement", {}).get("engine", {})
        rows.append({"test": r["test"], "precision": r.get("precision"), "endpoint": endpoint,
                     # an endpoint run's "batching" is its load pattern; its cache is the server's business
                     "batching": config.get("pattern") if endpoint else config.get("batching"),
                     "cache": "server" if endpoint else config.get("cache_mode"), "status": r.get("status", "pass"),
                     "errors": engine.get("errors") or {}, "slo": engine.get("slo") or {},
                     "requests": r.get("measurement", {}).get("num_requests"),
                     "fallback": r.get("fallback"), "s": s, "memory": memory, "verdicts": verdicts,
                     "violated": violated, "budget": budget_text, "notes": r.get("notes", [])})
    return rows


def _highlight(text: str, at: int | None) -> Markup:
    from markupsafe import escape

    if at is None:
        return escape(text)
    return escape(text[:at]) + Markup('<mark class="div">') + escape(text[at:]) + Markup("</mark>")


def build_context(data: dict, commit: str | None = None) -> dict:
    records = data.get("records", [])
    env = data.get("environment", {})
    reference = env.get("reference_precision", "fp32")
    perf = _perf_rows(records)
    quality = [r for r in records if r.get("kind") == "quality"]
    golden = [r for r in records if r.get("kind") == "golden"]

    models = data.get("models", {})
    precisions = list(models) or sorted({r["precision"] for r in perf if not r["endpoint"]})
    if any(r["endpoint"] for r in perf):  # the server beside the local precisions
        precisions.append("endpoint")
    figures = []
    # tokens/s and peak memory by precision (best run of each precision)
    tps = {p: max((r["s"].get("tokens_per_s", 0) for r in perf if r["precision"] == p), default=None) for p in precisions}
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
            r_full["measurement"]["samples"].get("ttft_ms", [])
            for r, r_full in zip(perf, [x for x in records if x.get("kind") == "perf"])}
    ttft = {k: v for k, v in list(ttft.items())[:6] if v}
    if ttft:
        figures.append(charts.histogram("TTFT distribution", ttft, "ms"))
    timeline_record = next((r for r in records if r.get("kind") == "perf" and r["measurement"].get("steps")
                            and r["engine_config"].get("batching") == "continuous"), None) or next(
        (r for r in records if r.get("kind") == "perf" and r["measurement"].get("steps")), None)
    if timeline_record:
        name = timeline_record["test"].split("::")[-1]
        figures.append(charts.timeline(f"Engine timeline: {name[:50]}",
                                       timeline_record["measurement"]["steps"][:400]))
    kv = {}
    for r in records:
        tags = r.get("tags") or {}
        if r.get("kind") == "perf" and "max_new_tokens" in tags and tags.get("experiment") == "kv-cache-length":
            kv.setdefault(r["engine_config"]["cache_mode"], {})[tags["max_new_tokens"]] = r["summary"]["tokens_per_s"]
    if len(kv) >= 2:
        xs = sorted({x for series in kv.values() for x in series})
        figures.append(charts.line_chart("KV cache on vs off over generation length", xs,
                                         {("cache " + mode if mode != "none" else "no cache"): [series.get(x) for x in xs]
                                          for mode, series in kv.items()}, "tok/s", "max_new_tokens"))

    changed_samples = []
    for q in quality:
        for s in q.get("samples", []):
            if not s["exact_match"]:
                changed_samples.append({"precision": q["precision"], "id": s["id"], "category": s["category"],
                                        "rougeL": s["rougeL"], "kl": s.get("mean_kl"),
                                        "divergence": s.get("first_divergence"),
                                        "reference": _highlight(s["reference_text"], s.get("first_divergence_char")),
                                        "candidate": _highlight(s["candidate_text"], s.get("first_divergence_char"))})
    for g in golden:
        for s in g.get("changed", []):
            changed_samples.append({"precision": g["precision"] + " vs accepted golden", "id": s["id"],
                                    "category": s["category"], "rougeL": s["rougeL"], "kl": s.get("mean_kl"),
                                    "divergence": s.get("first_divergence"),
                                    "reference": _highlight(s["reference_text"], s.get("first_divergence_char")),
                                    "candidate": _highlight(s["candidate_text"], s.get("first_divergence_char"))})
    counts = data.get("gate_counts") or {}
    outcomes = data.get("outcomes", {})
    started = data.get("started")
    return {
        "started": dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "?",
        "commit": commit, "environment": env, "models": models, "perf": perf, "quality": quality,
        "golden": golden, "endpoint_perf": [r for r in perf if r["endpoint"]], "figures": [Markup(f) for f in figures if f], "changed_samples": changed_samples,
        "notes": diagnose(records, reference), "counts": counts,
        "tests": {"passed": sum(1 for o in outcomes.values() if o == "passed"),
                  "failed": sum(1 for o in outcomes.values() if o in ("failed", "error")),
                  "skipped": sum(1 for o in outcomes.values() if o == "skipped")},
        "reference": reference,
    }


def render(data: dict, commit: str | None = None) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("pytest_infergate.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = lambda v, digits=3: "–" if v is None else (f"{v:.{digits}g}" if isinstance(v, float) else v)
    return env.get_template("report.html").render(**build_context(data, commit))


def write_report(data: dict, path: Path, commit: str | None = None) -> None:
    from pytest_infergate.atomic import write_text_atomic

    write_text_atomic(Path(path), render(data, commit))
