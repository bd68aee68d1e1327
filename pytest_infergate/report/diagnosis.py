"""Diagnosis notes drawn from the guide's list of pitfalls, each computed from the run's own data."""

from __future__ import annotations

from dataclasses import dataclass

QUANTIZED = ("int8", "nf4")


@dataclass
class Note:
    severity: str  # "warn" or "info"
    pitfall: str
    text: str


def _perf(records):
    """Measurements of the reference engine (the engine-level pitfalls are about it, not a remote server)."""
    return [r for r in records if r.get("kind") == "perf" and r.get("summary") and r.get("backend") != "endpoint"]


def _endpoint(records):
    return [r for r in records if r.get("kind") == "perf" and r.get("backend") == "endpoint"]


def _base_test(record) -> str:
    """The test id without its precision parameter, so one test's precisions can be compared."""
    test = record["test"]
    precision = record.get("precision", "")
    return test.replace(f"[{precision}]", "[]").replace(f"[{precision}-", "[").replace(f"-{precision}]", "]")


def kv_cache_gain(records) -> list[Note]:
    notes = []
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in _perf(records):
        tags = r.get("tags") or {}
        key = (_base_test(r), r.get("precision"), tags.get("max_new_tokens"), tags.get("prompt_tokens"))
        by_key.setdefault(key, {})[r["engine_config"]["cache_mode"]] = r
    for (_, precision, max_new, _), modes in by_key.items():
        if "none" in modes and ("paged" in modes or "contiguous" in modes):
            on = modes.get("paged") or modes.get("contiguous")
            speedup = on["summary"]["tokens_per_s"] / modes["none"]["summary"]["tokens_per_s"]
            if speedup < 1.5:
                notes.append(Note("info", "Pitfall 1: KV cache gain small",
                                  f"{precision}, max_new_tokens={max_new}: KV cache only x{speedup:.2f} faster than "
                                  "recomputing. Short generations, a small model or a prefill-dominated workload "
                                  "hide its benefit; raise max_new_tokens to 128-256 and use longer prompts."))
    return notes


def quantized_slower(records, reference: str) -> list[Note]:
    """One note per quantized precision that was slower than the reference in the same test."""
    groups: dict[str, dict[str, dict]] = {}
    for r in _perf(records):
        groups.setdefault(_base_test(r) + "|" + str(r.get("label")), {})[r["precision"]] = r
    slower: dict[str, list[tuple[str, float, float]]] = {}
    compared: dict[str, int] = {}
    for name, by_precision in groups.items():
        ref_tps = by_precision.get(reference, {}).get("summary", {}).get("tokens_per_s")
        for precision in QUANTIZED:
            if precision in by_precision and ref_tps:
                compared[precision] = compared.get(precision, 0) + 1
                tps = by_precision[precision]["summary"].get("tokens_per_s", 0)
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


def dynamic_ttft(records) -> list[Note]:
    notes = []
    by_mode: dict[str, list[float]] = {}
    for r in _perf(records):
        mode = r["engine_config"]["batching"]
        if "ttft_ms_p50" in r["summary"]:
            by_mode.setdefault(mode, []).append(r["summary"]["ttft_ms_p50"])
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


def padding_waste(records) -> list[Note]:
    wasteful = []
    for r in _perf(records):
        steps = r.get("measurement", {}).get("steps") or []
        useful = sum(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in steps)
        padding = sum(s.get("num_padding_tokens", 0) for s in steps)
        if useful and padding / (useful + padding) > 0.2:
            wasteful.append((padding / (useful + padding), r))
    if not wasteful:
        return []
    share, worst = max(wasteful, key=lambda w: w[0])
    return [Note("warn", "Pitfall 5: padding wastes compute",
                 f"{len(wasteful)} measurement(s) spent over 20% of computed tokens on padding (worst {share:.0%}: "
                 f"{worst['test']}, {worst['engine_config']['batching']} batching). Bucket requests by length, cap "
                 "the length spread in a batch, or use continuous batching.")]


def kv_pressure(records) -> list[Note]:
    pressed = []
    for r in _perf(records):
        memory = r.get("measurement", {}).get("memory") or {}
        allocated, used = memory.get("kv_allocated_mb"), memory.get("kv_used_peak_mb")
        preempted = sum(s.get("num_preempted", 0) for s in r.get("measurement", {}).get("steps") or [])
        if allocated and used is not None and (used / allocated > 0.9 or preempted):
            pressed.append((r, used, allocated, preempted))
    if not pressed:
        return []
    r, used, allocated, preempted = pressed[0]
    return [Note("warn", "Pitfall 4: KV memory near the budget",
                 f"{len(pressed)} measurement(s) ran the KV cache to its budget, e.g. {r['test']}: peak {used:.0f} of "
                 f"{allocated:.0f} MiB" + (f", {preempted} preemptions" if preempted else "")
                 + ". Cap context length and max_new_tokens, or give the cache more memory.")]


def phase_balance(records) -> list[Note]:
    notes = []
    for r in _perf(records):
        s = r["summary"]
        if "ttft_ms_p50" in s and "e2e_ms_p50" in s and s["e2e_ms_p50"]:
            share = s["ttft_ms_p50"] / s["e2e_ms_p50"]
            phase = "prefill (time to first token)" if share > 0.5 else "decode (time per output token)"
            advice = ("shorter prompts, chunked prefill or a faster prefill path" if share > 0.5 else
                      "KV cache, larger decode batches, or quantization that speeds up memory-bound decode")
            notes.append(Note("info", "prefill or decode?",
                              f"{r['test']}: {phase} dominates latency ({share:.0%} of p50 end-to-end is TTFT); "
                              f"look at {advice}."))
            break  # one representative note; the tables show the rest
    return notes


def endpoint_errors(records) -> list[Note]:
    """Guide, "timeouts, rate limits, fallback": a load run whose requests failed says which way they failed."""
    failing = [(r, r["measurement"].get("engine", {}).get("errors") or {}) for r in _endpoint(records)]
    failing = [(r, errors) for r, errors in failing if errors]
    if not failing:
        return []
    total: dict[str, int] = {}
    for _, errors in failing:
        for kind, count in errors.items():
            total[kind] = total.get(kind, 0) + count
    worst = min(failing, key=lambda f: f[0]["summary"].get("success_rate", 1.0))[0]
    kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(total.items(), key=lambda kv: -kv[1]))
    advice = ("raise --infergate-endpoint-timeout or lower the load" if "timeout" in total else
              "read the server's log for the failing status codes")
    return [Note("warn", "endpoint requests failed",
                 f"{len(failing)} endpoint load run(s) lost requests ({kinds}); worst: {worst['test']} at "
                 f"{worst['summary'].get('success_rate', 0):.0%} success. Failed requests are excluded from the "
                 f"latency figures; {advice}.")]


def _describe_slo(slo: dict) -> str:
    return ", ".join(f"{key} <= {value:g}" for key, value in slo.items() if value is not None) or "(none)"


def endpoint_goodput(records) -> list[Note]:
    """Throughput that misses the SLO is not capacity: compare goodput with the request rate achieved."""
    notes = []
    for r in _endpoint(records):
        s = r["summary"]
        if "goodput_per_s" in s and s.get("requests_per_s") and s["goodput_per_s"] < 0.9 * s["requests_per_s"]:
            notes.append(Note("warn", "SLO misses under load",
                              f"{r['test']}: goodput {s['goodput_per_s']:.3g} req/s of {s['requests_per_s']:.3g} "
                              f"req/s served ({s['goodput_per_s'] / s['requests_per_s']:.0%} met the SLO "
                              f"{_describe_slo(r['measurement'].get('engine', {}).get('slo') or {})}). Lower the "
                              "load or relax the SLO; "
                              "the sweep shows where goodput stops growing."))
            break
    return notes


def diagnose(records: list[dict], reference: str) -> list[Note]:
    return (kv_cache_gain(records) + quantized_slower(records, reference) + dynamic_ttft(records)
            + padding_waste(records) + kv_pressure(records) + phase_balance(records) + endpoint_errors(records)
            + endpoint_goodput(records))
