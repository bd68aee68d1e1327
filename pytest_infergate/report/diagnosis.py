"""Diagnosis notes drawn from the guide's list of pitfalls, each computed from the run's own data; where a perf gate
failed against a baseline that names what changed since it (engine config, model, precision, libraries), the note
is about that change alone: a pitfall's generic advice (KV cache, quantization, batching) would point elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_infergate import units
from pytest_infergate.measurement import Measurement
from pytest_infergate.report.serving import local, served
from pytest_infergate.requirements import QUANTIZED
from pytest_infergate.results.reasons import change_failure, changes_phrase
from pytest_infergate.results.records import PerfRecord
from pytest_infergate.results.run import RunResults
from pytest_infergate.stats import bootstrap_ratio_ci, percentile

MIN_REPETITIONS = 3  # tokens/s per repetition: fewer, and the per-request TPOT decides
MIN_REQUESTS = 5
# a quantized precision counts as slower when its whole interval is beyond 10%: less is no pitfall worth a note
# (and, on a shared runner, what two precisions measured apart in time differ by anyway)
SLOWER_BEYOND = 1.10


@dataclass(frozen=True)
class Slowdown:
    """How much slower `slow` ran than `fast`, with its 95% interval and the figure it was read from; a note
    fires only when the whole interval is beyond its threshold (evidence beyond noise)."""

    ratio: float
    low: float
    high: float
    evidence: str

    def describe(self) -> str:
        return (f"{units.ratio(self.ratio)} (95% CI {units.number(self.low)}–{units.number(self.high)}, "
                f"{self.evidence})")


def slowdown(slow: Measurement, fast: Measurement) -> Slowdown | None:
    """`slow`'s cost over `fast`'s: tokens/s per repetition where both have MIN_REPETITIONS, else the median
    per-request TPOT; None when neither has enough samples to tell."""
    def median(values):
        return percentile(values, 50)

    a, b = slow.samples.get("tokens_per_s") or [], fast.samples.get("tokens_per_s") or []
    if len(a) >= MIN_REPETITIONS and len(b) >= MIN_REPETITIONS and min(a) > 0 and min(b) > 0:
        point, low, high = bootstrap_ratio_ci(b, a, median, resamples=1000)
        return Slowdown(point, low, high, f"tokens/s of {len(a)} and {len(b)} repetitions")
    a, b = slow.samples.get("tpot_ms") or [], fast.samples.get("tpot_ms") or []
    if len(a) >= MIN_REQUESTS and len(b) >= MIN_REQUESTS and median(b) > 0:
        point, low, high = bootstrap_ratio_ci(a, b, median, resamples=1000)
        return Slowdown(point, low, high, f"median TPOT of {len(a)} and {len(b)} requests")
    return None


@dataclass
class Note:
    severity: str  # "warn" or "info"
    pitfall: str
    text: str


# pitfall -> (severity, title, what to do); each check below says what it found, the table says the rest
PITFALLS = {
    "kv_gain": ("info", "Pitfall 1: KV cache gain small",
                "Short generations, a small model or a prefill-dominated workload hide its benefit; raise "
                "max_new_tokens to 128-256 and use longer prompts."),
    "quantized_slower": ("warn", "Pitfall 2: quantized slower than the reference",
                         "Low-bit kernels on this device cost more than the memory they save; try larger batches "
                         "(the freed memory allows them), and check that bitsandbytes / torch / CUDA versions "
                         "match."),
    "dynamic_ttft": ("warn", "Pitfall 3: dynamic batching raises TTFT",
                     "Keep the window small for chat, or use continuous batching."),
    "kv_pressure": ("warn", "Pitfall 4: KV memory near the budget",
                    "Cap context length and max_new_tokens, or give the cache more memory."),
    "padding": ("warn", "Pitfall 5: padding wastes compute",
                "Bucket requests by length, cap the length spread in a batch, or use continuous batching."),
    "slow_creep": ("warn", "slow creep across runs",
                   "Every run passed its gate against the baseline, so no single run failed; read the history "
                   "page for the commits in the window, and re-take the baseline only once the cause is known."),
}


def note(pitfall: str, finding: str) -> Note:
    severity, title, advice = PITFALLS[pitfall]
    return Note(severity, title, f"{finding} {advice}")


def _perf(results: RunResults) -> list[PerfRecord]:
    """Measurements of the reference engine (the engine-level pitfalls are about it, not a remote server)."""
    return [r for r in local(results.perf) if r.summary]


def _endpoint(results: RunResults) -> list[PerfRecord]:
    return served(results.perf)


def _base_test(record: PerfRecord) -> str:
    """The test id without its precision parameter, so one test's precisions can be compared."""
    test = record.test
    precision = record.precision
    return test.replace(f"[{precision}]", "[]").replace(f"[{precision}-", "[").replace(f"-{precision}]", "]")


def kv_cache_gain(results: RunResults) -> list[Note]:
    """The cache's speedup over recomputing, where its whole interval is below 1.5x."""
    notes = []
    by_key: dict[tuple, dict[str, PerfRecord]] = {}
    for r in _perf(results):
        key = (_base_test(r), r.precision, r.tags.get("max_new_tokens"), r.tags.get("prompt_tokens"))
        by_key.setdefault(key, {})[r.engine_config.get("cache_mode")] = r
    for (_, precision, max_new, _), modes in by_key.items():
        if "none" in modes and ("paged" in modes or "contiguous" in modes):
            on = modes.get("paged") or modes.get("contiguous")
            gain = slowdown(modes["none"].measurement, on.measurement)
            if gain is not None and gain.high < 1.5:
                notes.append(note("kv_gain", f"{precision}, max_new_tokens={max_new}: KV cache only "
                                             f"{gain.describe()} faster than recomputing."))
    return notes


def quantized_slower(results: RunResults, reference: str) -> list[Note]:
    """One note per quantized precision slower than the reference beyond noise: the whole interval above
    SLOWER_BEYOND."""
    groups: dict[str, dict[str, PerfRecord]] = {}
    for r in _perf(results):
        groups.setdefault(_base_test(r) + "|" + r.label, {})[r.precision] = r
    slower: dict[str, list[tuple[str, Slowdown]]] = {}
    compared: dict[str, int] = {}
    for name, by_precision in groups.items():
        if reference not in by_precision:
            continue
        for precision in sorted(QUANTIZED):
            if precision not in by_precision:
                continue
            found = slowdown(by_precision[precision].measurement, by_precision[reference].measurement)
            if found is None:
                continue
            compared[precision] = compared.get(precision, 0) + 1
            if found.low > SLOWER_BEYOND:
                slower.setdefault(precision, []).append((name.split("|")[0], found))
    notes = []
    for precision, cases in slower.items():
        test, worst = max(cases, key=lambda c: c[1].ratio)
        beyond = units.percent(SLOWER_BEYOND - 1)
        notes.append(note("quantized_slower", f"{precision} was more than {beyond} slower than {reference} in "
                          f"{len(cases)} of {compared[precision]} comparable tests (worst: {worst.describe()} in "
                          f"{test})."))
    return notes


def dynamic_ttft(results: RunResults) -> list[Note]:
    """Dynamic batching's TTFT against the best other mode's, where the whole interval is above 1.5x."""
    notes = []
    by_mode: dict[str, list[PerfRecord]] = {}
    for r in _perf(results):
        if r.measurement.samples.get("ttft_ms"):
            by_mode.setdefault(r.engine_config.get("batching"), []).append(r)
    other = by_mode.get("continuous") or by_mode.get("sequential")
    if "dynamic" in by_mode and other:
        def p50(r: PerfRecord) -> float:
            return percentile(r.measurement.samples["ttft_ms"], 50)

        dyn, best = min(by_mode["dynamic"], key=p50), min(other, key=p50)
        a, b = dyn.measurement.samples["ttft_ms"], best.measurement.samples["ttft_ms"]
        if len(a) >= MIN_REQUESTS and len(b) >= MIN_REQUESTS and p50(best) > 0:
            point, low, high = bootstrap_ratio_ci(a, b, lambda xs: percentile(xs, 50), resamples=1000)
            if low > 1.5:
                notes.append(note("dynamic_ttft", f"dynamic batching's p50 TTFT is {units.duration_ms(p50(dyn))} "
                                  f"against {units.duration_ms(p50(best))} without the batching window "
                                  f"({units.ratio(point)}, 95% CI {units.number(low)}–{units.number(high)}, "
                                  f"{len(a)} and {len(b)} requests): throughput went up but users wait longer for "
                                  "the first token."))
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
    return [note("padding", f"{len(wasteful)} measurement(s) spent over 20% of computed tokens on padding (worst "
                 f"{share:.0%}: {worst.test}, {worst.engine_config.get('batching')} batching).")]


def kv_pressure(results: RunResults) -> list[Note]:
    pressed = []
    for r in _perf(results):
        memory = r.measurement.memory
        allocated, used = memory.get("kv_allocated_mb"), memory.get("kv_used_peak_mb")
        preempted = sum(s.get("num_preempted", 0) for s in r.measurement.steps)
        # a budget sized from the workload is full by design: only preemptions say it was too small
        sized = str(memory.get("kv_budget") or "").startswith("sized")
        if allocated and used is not None and ((used / allocated > 0.9 and not sized) or preempted):
            pressed.append((r, used, allocated, preempted))
    if not pressed:
        return []
    r, used, allocated, preempted = pressed[0]
    return [note("kv_pressure", f"{len(pressed)} measurement(s) ran the KV cache to its budget, e.g. {r.test}: peak "
                 f"{units.mebibytes(used)} of {units.mebibytes(allocated)}"
                 + (f", {preempted} preemptions." if preempted else "."))]


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
    kinds = ", ".join(f"{kind} ×{count}" for kind, count in sorted(total.items(), key=lambda kv: -kv[1]))
    advice = ("raise --infergate-endpoint-timeout or lower the load" if "timeout" in total else
              "read the server's log for the failing status codes")
    return [Note("warn", "endpoint requests failed",
                 f"{len(failing)} endpoint load run(s) lost requests ({kinds}); worst: {worst.test} at "
                 f"{worst.summary.get('success_rate', 0):.0%} success. Failed requests are excluded from the "
                 f"latency figures; {advice}.")]


def _describe_slo(slo: dict) -> str:
    return ", ".join(f"{key} ≤ {units.metric_value(key, value)}" for key, value in slo.items()
                     if value is not None) or "(none)"


def endpoint_goodput(results: RunResults) -> list[Note]:
    """Throughput that misses the SLO is not capacity: compare goodput with the request rate achieved."""
    notes = []
    for r in _endpoint(results):
        s = r.summary
        if "goodput_per_s" in s and s.get("requests_per_s") and s["goodput_per_s"] < 0.9 * s["requests_per_s"]:
            notes.append(Note("warn", "SLO misses under load",
                              f"{r.test}: goodput {units.number(s['goodput_per_s'])} req/s of "
                              f"{units.number(s['requests_per_s'])} req/s served "
                              f"({s['goodput_per_s'] / s['requests_per_s']:.0%} met the SLO "
                              f"{_describe_slo(r.measurement.engine.get('slo') or {})}). Lower the load or relax "
                              "the SLO; the sweep shows where goodput stops growing."))
            break
    return notes


def slow_creep(history) -> list[Note]:
    """A metric drifting the wrong way over the last runs of a history (history/series.py findings) while every
    gate on it passed; only creeps that reach the history's latest run (this run, in a report)."""
    if history is None:
        return []
    from pytest_infergate.history.series import findings

    latest = history.runs[-1].index if history.runs else None
    notes = []
    for f in findings(history):
        if f.kind == "creep" and f.worse and f.passed and f.series.points[-1].run == latest:
            window = latest - f.run.index + 1
            notes.append(note("slow_creep", f"{f.series.test} {f.series.metric}: {units.change(f.change)} over the "
                              f"last {window} runs ({units.change(f.per_run)} per run, Mann-Kendall p = "
                              f"{units.number(f.p_value, 2)}) since {f.run.label}."))
    return notes


def named_change(results: RunResults) -> list[Note]:
    """Perf gates that failed against a baseline naming what changed since it: one note on those changes, made of
    what the verdict line leads with (results.reasons.change_failure)."""
    failed = change_failure(results.records)
    if failed is None:
        return []
    return [Note("warn", "what changed since the baseline",
                 f"{failed.gates} perf gate{'s' if failed.gates != 1 else ''} failed{changes_phrase(failed.changes)} "
                 f"(e.g. {failed.test}: {'; '.join(failed.figures)}). Look at that change first: it is what the "
                 "baseline records as different; if the new figures are intended, accept them with "
                 "--infergate-save-baseline.")]


def diagnose(results: RunResults, reference: str, history=None) -> list[Note]:
    changed = named_change(results)
    if changed:  # the failure's own cause is named: the pitfalls' generic advice would send a reviewer elsewhere
        return changed
    return (kv_cache_gain(results) + quantized_slower(results, reference) + dynamic_ttft(results)
            + padding_waste(results) + kv_pressure(results) + phase_balance(results) + endpoint_errors(results)
            + endpoint_goodput(results) + slow_creep(history))
