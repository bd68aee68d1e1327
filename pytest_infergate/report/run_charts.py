"""The charts the report draws from a run's records (`figures`): throughput and memory by precision, the TTFT
distribution, one engine timeline, KV cache on vs off over generation length. Drawn by report.charts."""

from __future__ import annotations

from pytest_infergate.perf.verdict import Verdict
from pytest_infergate.report.charts import bar_chart, histogram, line_chart, timeline
from pytest_infergate.report.serving import RanOn, local, served
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults


def _best(records: list[PerfRecord], precision: str, value) -> float | None:
    """The largest value of `value(record)` over a precision's records (None if none has one)."""
    values = [v for r in records if r.precision == precision for v in [value(r)] if v is not None]
    return max(values) if values else None


def _baseline(records: list[PerfRecord], precision: str, key: str) -> float | None:
    """What a gate compared a precision's records with (the stored baseline, A of an A/B), `key` of its summary."""
    return _best(records, precision, lambda r: (r.compared_with or {}).get(key))


def _gated(records: list[PerfRecord], precision: str, metric: str, pct: float | None = None) -> Verdict | None:
    """The verdict a gate decided a precision's `metric` (at percentile `pct`) by, None where none compared it: its
    figures are the ones the gate used (a stored baseline's: the least-disturbed repetitions), not the run's best."""
    return next((v for r in records if r.precision == precision for v in r.verdicts
                 if v.metric == metric and (pct is None or v.percentile == pct)), None)


def _gated_series(records: list[PerfRecord], precisions: list[str], metric: str, pct: float | None = None
                  ) -> tuple[list[float | None], list[float | None], str] | None:
    """(baseline, now, which statistic) by precision as the gates decided them, None where no gate compared
    `metric`."""
    verdicts = [_gated(records, p, metric, pct) for p in precisions]
    decided = [v for v in verdicts if v is not None]
    if not decided:
        return None
    return ([v.baseline if v else None for v in verdicts], [v.candidate if v else None for v in verdicts],
            decided[0].statistic())


def throughput(records: list[PerfRecord], precisions: list[str]) -> str:
    """Tokens/s by precision; where a gate compared it, the figures the gate decided on, the baseline's beside."""
    tps = [_best(records, p, lambda r: r.summary.get("tokens_per_s")) for p in precisions]
    gated = _gated_series(records, precisions, "tokens_per_s")
    if gated is not None:
        baseline, now, statistic = gated
        # the statistic's name only (its full wording is the verdict's): a longer title runs off the chart
        title = "Tokens/s by precision, as the gate decided" + (f" ({statistic.split(':')[0]})" if statistic else "")
        return bar_chart(title, precisions, {"baseline": baseline, "now": now}, "tok/s")
    series = {"tokens/s": tps}
    baseline = [_baseline(records, p, "tokens_per_s") for p in precisions]
    if any(baseline):  # compared, but not on tokens/s: the two runs' own figures
        series = {"baseline": baseline, "now": tps}
    return bar_chart("Tokens/s by precision (best run)", precisions, series, "tok/s") if any(tps) else ""


def memory(records: list[PerfRecord], models: dict[str, dict]) -> str:
    """Per precision: weights, then the KV cache each precision's runs actually used at their peak beside the
    budget the engine allocated up front (the same for every precision, so only the used bar shows what
    quantization saved), then the process peak while serving."""
    precisions = [p for p in models]  # a remote server's memory is not measured here
    if not precisions:
        return ""
    series = {"weights": [models[p]["weight_bytes"] / 2**20 for p in precisions]}
    used = [_best(records, p, lambda r: r.measurement.memory.get("kv_used_peak_mb")) for p in precisions]
    allocated = [_best(records, p, lambda r: r.measurement.memory.get("kv_allocated_mb")) for p in precisions]
    if any(used):
        series["KV used"] = used
    if any(allocated):
        series["KV allocated"] = allocated
    peak = [_best(records, p, lambda r: r.summary.get("peak_mem_mb")) for p in precisions]
    baseline = [_baseline(records, p, "peak_mem_mb") for p in precisions]
    if any(baseline):
        series["baseline peak"] = baseline
    if any(peak):
        series["peak serving"] = peak
    return bar_chart("Memory by precision", precisions, series, "MiB")


def ttft(records: list[PerfRecord]) -> str:
    """The TTFT distribution of each precision and engine, and of its baseline where a gate compared with one (a
    run's own report; a results file keeps the baseline's summary only: ttft_compared)."""
    samples = {}
    for r in records:
        name = RanOn.of(r).name
        if r.measurement.samples.get("ttft_ms") and name not in samples:
            baseline = r.outcome.baseline
            if baseline is not None and baseline.samples.get("ttft_ms"):
                samples[f"{name} baseline"] = baseline.samples["ttft_ms"]
            samples[name] = r.measurement.samples["ttft_ms"]
    samples = dict(list(samples.items())[:6])
    return histogram("TTFT distribution", samples, "ms") if samples else ""


def ttft_compared(records: list[PerfRecord], precisions: list[str]) -> str:
    """TTFT p50 and p95 by precision beside the baseline's, where a gate compared with one; the percentile a gate
    decided on shows the figures it used (a stored baseline's: the least-disturbed repetitions), labelled so."""
    series, as_gated = {}, []
    for pct in ("p50", "p95"):
        gated = _gated_series(records, precisions, "ttft_ms", int(pct[1:]))
        if gated is not None:  # named in the title: a legend slot holds about 19 characters
            series[f"baseline {pct}"], series[f"now {pct}"] = gated[0], gated[1]
            as_gated.append(pct)
            continue
        baseline = [_baseline(records, p, f"ttft_ms_{pct}") for p in precisions]
        if any(baseline):
            series[f"baseline {pct}"] = baseline
            series[f"now {pct}"] = [_best(records, p, lambda r, k=f"ttft_ms_{pct}": r.summary.get(k))
                                    for p in precisions]
    gated_note = f" ({' and '.join(as_gated)} as the gate decided)" if as_gated else ""
    return bar_chart(f"TTFT by precision: baseline → now{gated_note}", precisions, series, "ms") if series else ""


def engine_timeline(records: list[PerfRecord]) -> str:
    with_steps = [r for r in records if r.measurement.steps]
    record = next((r for r in with_steps if r.engine_config.get("batching") == "continuous"),
                  with_steps[0] if with_steps else None)
    if record is None:
        return ""
    name = record.test.split("::")[-1]
    return timeline(f"Engine timeline: {name[:50]}", record.measurement.steps[:400])


def kv_over_length(records: list[PerfRecord]) -> str:
    kv: dict[str, dict] = {}
    for r in records:
        if "max_new_tokens" in r.tags and r.tags.get("experiment") == "kv-cache-length":
            kv.setdefault(r.engine_config["cache_mode"], {})[r.tags["max_new_tokens"]] = r.summary["tokens_per_s"]
    if len(kv) < 2:
        return ""
    xs = sorted({x for series in kv.values() for x in series})
    return line_chart("KV cache on vs off over generation length", xs,
                             {("cache " + mode if mode != "none" else "no cache"): [series.get(x) for x in xs]
                              for mode, series in kv.items()}, "tok/s", "max_new_tokens")


def figures(results: RunResults) -> list[str]:
    records = results.perf
    on_engine = local(records)
    precisions = list(results.models) or sorted({r.precision for r in on_engine})
    if served(records):  # the server beside the local precisions
        precisions.append("endpoint")
    return [throughput(records, precisions), memory(on_engine, results.models), ttft_compared(records, precisions),
            ttft(records), engine_timeline(records), kv_over_length(records)]
