"""Diagnosis notes drawn from the guide's list of pitfalls, each computed from the run's own data."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate.models.precision import QUANTIZED
from pytest_infergate.results.records import PerfRecord, RunResults


@dataclass
class Note:
    severity: str  # "warn" or "info"
    pitfall: str
    text: str


def _perf(results: RunResults) -> list[PerfRecord]:
    """Measurements of the reference engine (the engine-level pitfalls are about it, not a remote server)."""
    return [r for r in results.perf if r.summary and not r.is_endpoint]


def _endpoint(results: RunResults) -> list[PerfRecord]:
    return [r for r in results.perf if r.is_endpoint]


def _base_test(record: PerfRecord) -> str:
    """The test id without its precision parameter, so one test's precisions can be compared."""
    test = record.test
    precision = record.precision
    return test.replace(f"[{precision}]", "[]").replace(f"[{precision}-", "[").replace(f"-{precision}]", "]")


def kv_cache_gain(results: RunResults) -> list[Note]:
    notes = []
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in _perf(results):
        key = (_base_test(r), r.precision, r.tags.get("max_new_tokens"), r.tags.get("prompt_tokens"))
        by_key.setdefault(key, {})[r.engine_config.get("cache_mode")] = r
    for (_, precision, max_new, _), modes in by_key.items():
        if "none" in modes and ("paged" in modes or "contiguous" in modes):
            on = modes.get("paged") or modes.get("contiguous")
            speedup = on.summary["tokens_per_s"] / modes["none"].summary["tokens_per_s"]
            if speedup < 1.5:
                notes.append(Note("info", "Pitfall 1: KV cache gain small",
                                  f"{precision}, max_new_tokens={max_new}: KV cache only x{speedup:.2f} faster than "
                                  "recomputing. Short generations, a small model or a prefill-dominated workload "
                                  "hide its benefit; raise max_new_tokens to 128-256 and use longer prompts."))
    return notes


def quantized_slower(results: RunResults, reference: str) -> list[Note]:
    """One note per quantized precision that was slower than the reference in the same test."""
    groups: dict[str, dict[str, dict]] = {}
    for r in _perf(results):
        groups.setdefault(_base_test(r) + "|" + r.label, {})[r.precision] = r
    slower: dict[str, list[tuple[str, float, float]]] = {}
    compared: dict[str, int] = {}
    for name, by_precision in groups.items():
        ref_tps = by_precision[reference].summary.get("tokens_per_s") if reference in by_precision else None
        for precision in sorted(QUANTIZED):
            if precision in by_precision and ref_tps:
                compared[precision] = compared.get(precision, 0) + 1
                tps = by_precision[precision].summary.get("tokens_per_s", 0)
                if tps < ref_tps:
                    slower.setdefault(precision, []).append((name.split("|")[0], tps, ref_tps))
    notes = []
    for precision, cases in slower.items():
        test, tps, ref_tps = min(cases, key=lambda c: c[1] / c[2])
        notes.append(Note("warn", "Pitfall 2: quantized slower than the reference",
                          f"{precision} was slower than {reference} in {len(cases)} of {compared[precision]} "
                          f"comparable tests (worst: {tps:.3g} vs {ref_tps:.3g} tok/s in {test}). Low-bit kernels "
                          "on this device cost more than the memory they save; try larger batches (the freed "
                          "memory allows them), and check that bitsandbytes / torch / CUDA versions match."))
    return notes


def dynamic_ttft(results: RunResults) -> list[Note]:
    notes = []
    by_mode: dict[str, list[float]] = {}
    for r in _perf(results):
        mode = r.engine_config.get("batching")
        if "ttft_ms_p50" in r.summary:
            by_mode.setdefault(mode, []).append(r.summary["ttft_ms_p50"])
    if "dynamic" in by_mode:
        other = by_mode.get("continuous") or by_mode.get("sequential")
        if other:
            dyn, best = min(by_mode["dynamic"]), min(other)
            if dyn > 1.5 * best:
                notes.append(Note("warn", "Pitfall 3: dynamic batching raises TTFT",
                                  f"dynamic batching's p50 TTFT is {dyn:.0f} ms against {best:.0f} ms without the "
                                  "batching window: throughput went up but users wait longer for the first token. "
                                  "Keep the window small for chat, or use continuous batching."))
    return notes


def padding_waste(results: RunResults) -> list[Note]:
    wasteful = []
    for r in _perf(results):
        steps = r.measurement.steps
        useful = sum(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in steps)
        padding = sum(s.get("num_padding_tokens", 0) for s in steps)
        if useful and padding / (useful + padding) > 0.2:
            wasteful.append((padding / (useful + padding), r))
    if not wasteful:
        return []
    share, worst = max(wasteful, key=lambda w: w[0])
    return [Note("warn", "Pitfall 5: padding wastes compute",
                 f"{len(wasteful)} measurement(s) spent over 20% of computed tokens on padding (worst {share:.0%}: "
                 f"{worst.test}, {worst.engine_config.get('batching')} batching). Bucket requests by length, cap "
                 "the length spread in a batch, or use continuous batching.")]


def kv_pressure(results: RunResults) -> list[Note]:
    pressed = []
    for r in _perf(results):
        memory = r.measurement.memory
        allocated, used = memory.get("kv_allocated_mb"), memory.get("kv_used_peak_mb")
        preempted = sum(s.get("num_preempted", 0) for s in r.measurement.steps)
        if allocated and used is not None and (used / allocated > 0.9 or preempted):
            pressed.append((r, used, allocated, preempted))
    if not pressed:
        return []
    r, used, allocated, preempted = pressed[0]
    return [Note("warn", "Pitfall 4: KV memory near the budget",
                 f"{len(pressed)} measurement(s) ran the KV cache to its budget, e.g. {r.test}: peak {used:.0f} of "
                 f"{allocated:.0f} MiB" + (f", {preempted} preemptions" if preempted else "")
                 + ". Cap context length and max_new_tokens, or give the cache more memory.")]


def phase_balance(results: RunResults) -> list[Note]:
    notes = []
    for r in _perf(results):
        s = r.summary
        if "ttft_ms_p50" in s and "e2e_ms_p50" in s and s["e2e_ms_p50"]:
            share = s["ttft_ms_p50"] / s["e2e_ms_p50"]
            phase = "prefill (time to first token)" if share > 0.5 else "decode (time per output token)"
            advice = ("shorter prompts, chunked prefill or a faster prefill path" if share > 0.5 else
                      "KV cache, larger decode batches, or quantization that speeds up memory-bound decode")
            notes.append(Note("info", "prefill or decode?",
                              f"{r.test}: {phase} dominates latency ({share:.0%} of p50 end-to-end is TTFT); "
                              f"look at {advice}."))
            break  # one representative note; the tables show the rest
    return notes


def endpoint_errors(results: RunResults) -> list[Note]:
    """Guide, "timeouts, rate limits, fallback": a load run whose requests failed says which way they failed."""
    failing = [(r, r.measurement.engine.get("errors") or {}) for r in _endpoint(results)]
    failing = [(r, errors) for r, errors in failing if errors]
    if not failing:
        return []
    total: dict[str, int] = {}
    for _, errors in failing:
        for kind, count in errors.items():
            total[kind] = total.get(kind, 0) + count
    worst = min(failing, key=lambda f: f[0].summary.get("success_rate", 1.0))[0]
    kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(total.items(), key=lambda kv: -kv[1]))
    advice = ("raise --infergate-endpoint-timeout or lower the load" if "timeout" in total else
              "read the server's log for the failing status codes")
    return [Note("warn", "endpoint requests failed",
                 f"{len(failing)} endpoint load run(s) lost requests ({kinds}); worst: {worst.test} at "
                 f"{worst.summary.get('success_rate', 0):.0%} success. Failed requests are excluded from the "
                 f"latency figures; {advice}.")]


def _describe_slo(slo: dict) -> str:
    return ", ".join(f"{key} <= {value:g}" for key, value in slo.items() if value is not None) or "(none)"


def endpoint_goodput(results: RunResults) -> list[Note]:
    """Throughput that misses the SLO is not capacity: compare goodput with the request rate achieved."""
    notes = []
    for r in _endpoint(results):
        s = r.summary
        if "goodput_per_s" in s and s.get("requests_per_s") and s["goodput_per_s"] < 0.9 * s["requests_per_s"]:
            notes.append(Note("warn", "SLO misses under load",
                              f"{r.test}: goodput {s['goodput_per_s']:.3g} req/s of {s['requests_per_s']:.3g} "
                              f"req/s served ({s['goodput_per_s'] / s['requests_per_s']:.0%} met the SLO "
                              f"{_describe_slo(r.measurement.engine.get('slo') or {})}). Lower the "
                              "load or relax the SLO; "
                              "the sweep shows where goodput stops growing."))
            break
    return notes


def diagnose(results: RunResults, reference: str) -> list[Note]:
    return (kv_cache_gain(results) + quantized_slower(results, reference) + dynamic_ttft(results)
            + padding_waste(results) + kv_pressure(results) + phase_balance(results) + endpoint_errors(results)
            + endpoint_goodput(results))
