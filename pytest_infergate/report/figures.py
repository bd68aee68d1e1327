"""The report's charts, each from the run's own records: throughput and memory by precision, the TTFT
distribution, one engine timeline, KV cache on vs off over generation length."""

from __future__ import annotations

from pytest_infergate.report import charts
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults


def _best(records: list[PerfRecord], precision: str, value) -> float | None:
    """The largest value of `value(record)` over a precision's records (None if none has one)."""
    values = [v for r in records if r.precision == precision for v in [value(r)] if v is not None]
    return max(values) if values else None


def throughput(records: list[PerfRecord], precisions: list[str]) -> str:
    tps = [_best(records, p, lambda r: r.summary.get("tokens_per_s")) for p in precisions]
    return charts.bar_chart("Tokens/s by precision (best run)", precisions, {"tokens/s": tps}, "tok/s") \
        if any(tps) else ""


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
    if any(peak):
        series["peak serving"] = peak
    return charts.bar_chart("Memory by precision", precisions, series, "MiB")


def ttft(records: list[PerfRecord]) -> str:
    samples = {}
    for r in records:
        name = engine_name(r) if r.is_endpoint else f"{r.precision} {engine_name(r)}"
        if r.measurement.samples.get("ttft_ms") and name not in samples:
            samples[name] = r.measurement.samples["ttft_ms"]
    samples = dict(list(samples.items())[:6])
    return charts.histogram("TTFT distribution", samples, "ms") if samples else ""


def engine_name(r: PerfRecord) -> str:
    return str(r.engine_config.get("pattern") if r.is_endpoint else r.engine_config.get("batching"))


def timeline(records: list[PerfRecord]) -> str:
    with_steps = [r for r in records if r.measurement.steps]
    record = next((r for r in with_steps if r.engine_config.get("batching") == "continuous"),
                  with_steps[0] if with_steps else None)
    if record is None:
        return ""
    name = record.test.split("::")[-1]
    return charts.timeline(f"Engine timeline: {name[:50]}", record.measurement.steps[:400])


def kv_over_length(records: list[PerfRecord]) -> str:
    kv: dict[str, dict] = {}
    for r in records:
        if "max_new_tokens" in r.tags and r.tags.get("experiment") == "kv-cache-length":
            kv.setdefault(r.engine_config["cache_mode"], {})[r.tags["max_new_tokens"]] = r.summary["tokens_per_s"]
    if len(kv) < 2:
        return ""
    xs = sorted({x for series in kv.values() for x in series})
    return charts.line_chart("KV cache on vs off over generation length", xs,
                             {("cache " + mode if mode != "none" else "no cache"): [series.get(x) for x in xs]
                              for mode, series in kv.items()}, "tok/s", "max_new_tokens")


def figures(results: RunResults) -> list[str]:
    records = results.perf
    local = [r for r in records if not r.is_endpoint]
    precisions = list(results.models) or sorted({r.precision for r in local})
    if any(r.is_endpoint for r in records):  # the server beside the local precisions
        precisions.append("endpoint")
    return [throughput(records, precisions), memory(local, results.models), ttft(records), timeline(records),
            kv_over_length(records)]
