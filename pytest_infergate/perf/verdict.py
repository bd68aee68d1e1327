"""Noise-aware verdicts: is a candidate worse than a baseline by more than `max_regression`? A confidence interval
of their ratio decides: pass at or below the threshold, fail above it, inconclusive across it (more samples decide).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pytest_infergate import units
from pytest_infergate.measurement import MEMORY_METRICS, METRICS
from pytest_infergate.perf import interference
from pytest_infergate.stats import (
    FAST_QUANTILE,
    bootstrap_ratio_ci,
    interval_status,
    percentile,
    resolution,
)
from pytest_infergate.status import Status

# the figures as a reviewer names them
FIGURE_NAMES = {"tokens_per_s": "tokens/s", "ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL",
                "e2e_ms": "end-to-end latency", "queue_ms": "queue time", "peak_mem_mb": "peak memory",
                "kv_mem_mb": "KV memory", "requests_per_s": "requests/s", "goodput_per_s": "goodput"}
# the ratio of a figure better higher is baseline ÷ now, a cost: named (a new user read "19.4% higher (×0.838 …)")
COST_NAMES = {"tokens_per_s": "time per token", "requests_per_s": "time per request",
              "goodput_per_s": "time per good request", "capacity_rps": "time per request at capacity"}
# a figure grown by this factor or more is said as one: "×10.3 slower", not "926% slower" (a fall stays a percentage)
AS_FACTOR = 2.0
# what decides a comparison whose interval straddles its threshold after the re-measurements (one action each)
UNDECIDED_ACTION = ("measure more (a larger `repeats=` or `min_time_s=` in the `infergate_bench(...)` call), or "
                    "compare in one run, where the runner's drift hits both sides alike (--infergate-baseline-python "
                    "OLD_ENV/bin/python for a library change, infergate_bench.ab() for a model, precision or config)")


def cost_name(metric: str) -> str:
    """What the ratio measures where it is not the figure's own: 'time per token' for tokens/s; '' for a latency."""
    return COST_NAMES.get(metric, "baseline ÷ now") if METRICS[metric][1] else ""


def figure_name(metric: str, pct: float | None) -> str:
    """'tokens/s', 'TTFT p95'."""
    name = FIGURE_NAMES.get(metric, metric)
    return f"{name} p{pct:g}" if pct else name


@dataclass
class Verdict:
    """Candidate vs baseline for one metric. `ratio` > 1 means the candidate is worse, whatever the direction."""

    metric: str
    status: Status
    ratio: float
    low: float
    high: float
    threshold: float  # 1 + max_regression
    percentile: int | None
    candidate: float
    baseline: float
    samples: tuple[int, int]
    paired: bool = False  # the ratio is the median of per-round ratios of an interleaved A/B run
    # the calibration probe's time now / at the save (1.2: the machine is 20% slower now), against a stored baseline:
    # it never scales the figures, it says which verdicts the machine's move could have made. None: no probe.
    machine_slowdown: float | None = None
    repetitions: bool = False  # each side summarized by its least-disturbed repetitions (perf.stored)
    note: str = ""  # why a decisive comparison was made inconclusive, or what evidence decided it on a busy runner
    # the note blames the baseline (saved on a busy runner, or disturbed): measuring this run more cannot decide it
    baseline_at_fault: bool = False
    # inconclusive by the two sides' own spread, which re-measuring cannot narrow below the threshold: said at once
    unresolvable: bool = False
    # decided on the figures with the co-tenants' load taken out (an A/B on a busy runner: perf.paired; a
    # stored comparison: perf.busy.load_free_failure), and by what (perf.interference.RUN_QUEUE / DEVICE_TIME)
    load_corrected: bool = False
    load_free_by: str = ""
    # the ratio and its interval are not as measured but at the save's thread speed (perf.speed_pass.at_thread_speed):
    # a pass the drift between processes left undecided; the candidate's figure stays as measured
    at_thread_speed: bool = False
    # blamed on a save the host slowed, but straddling the bar at the save's thread speed: measuring this run more
    # may still decide it (perf.sides.StoredVerdict.narrowable)
    narrowable: bool = False
    # the ratio the interval's low end must clear to fail on this runner where that exceeds the threshold (the runs'
    # drift, the co-tenants' load, the load correction's error), in the sentence's figures (fail_bar_load_corrected:
    # the load-corrected ones); None: the threshold, or no failure can be decided here
    fail_bar: float | None = None
    fail_bar_load_corrected: bool = False

    @property
    def resolution(self) -> float:
        """The smallest slowdown this comparison can tell from no change, from the two sides' own spread: its
        interval's half-width as a factor, √(high/low). A threshold below it cannot be decided either way."""
        return resolution(self.low, self.high)

    def evidence(self) -> str:
        """Which evidence decided the verdict (or failed to), in one short phrase for the report and the terminal:
        the figures as measured (paired by A/B round, or each side's least-disturbed repetitions), or load-corrected
        by the kernel's run-queue delays where a busy side's figures could not decide (perf.stored)."""
        speed = ", at the save's thread speed" if self.at_thread_speed else ""
        if self.load_corrected:
            return interference.load_corrected(self.load_free_by) + (", paired by round" if self.paired else "") \
                + speed
        if self.at_thread_speed:
            return "fastest repetitions at the save's thread speed"
        if self.paired:
            return "as measured, paired by round"
        if self.repetitions:
            return "as measured, fastest repetitions"
        return "as measured"

    def statistic(self) -> str:
        """What the two figures are where they are not the run's own summary (the report's table: the median over
        repetitions of a throughput, the percentile over all requests of a latency); "" where they are."""
        if self.repetitions:  # perf.stored: each side by its least-disturbed repetitions (the low quantile of cost)
            of = f"per-repetition p{self.percentile}s" if self.percentile else "per-repetition values"
            fast = 100 - FAST_QUANTILE * 100 if METRICS[self.metric][1] else FAST_QUANTILE * 100
            return f"fastest repetitions: p{fast:g} of {of}"
        if self.paired and self.load_corrected:
            return "median of per-round values, load-corrected"
        return ""

    def sentence(self) -> str:
        """The one sentence every output prints: 'TTFT p50 ×3.1 slower (×3.1 [2.9–3.3], limit ×1.1)'."""
        # a ratio at the save's thread speed is not the two figures' as measured: said where the change is (a new
        # user read "13.7% faster" beside "6.6 ms → now 6.67 ms" as a contradiction)
        speed = " at the save's thread speed" if self.at_thread_speed else " load-corrected" if self.load_corrected \
            else ""
        cost = f"{name} " if (name := cost_name(self.metric)) else ""
        return (f"{figure_name(self.metric, self.percentile)} {self.change_in_words()}{speed} ({cost}"
                f"{units.ratio(self.ratio)} [{self._bound(self.low)}–{self._bound(self.high)}], limit "
                f"{units.ratio(self.threshold)}{self._past_limit()})")

    def _bound(self, value: float) -> str:
        """An interval's end, with the digits that tell it from the limit ("[1.02–1.0996]", not "[1.02–1.1]" beside
        "limit ×1.1", which a new user could not place)."""
        shown, places = units.number(value), 3
        while shown == units.number(self.threshold) and value != self.threshold and places < 8:
            places += 1
            shown = f"{value:.{places}f}".rstrip("0").rstrip(".")
        return shown

    def _past_limit(self) -> str:
        """Why an undecided interval that lies wholly past its limit is no failure, in the sentence itself (a reviewer
        read 'inconclusive tokens/s 21.6% lower (×1.28 [1.16–1.58], limit ×1.1)' as a failure): the bar a failure
        needs on this runner, or that none is decided here."""
        if self.status != Status.INCONCLUSIVE or self.low <= self.threshold:
            return ""
        if self.fail_bar:
            which = "load-corrected interval" if self.fail_bar_load_corrected else "interval"
            return f"; to fail on this runner the {which} must clear {units.ratio(self.fail_bar)}"
        return "; above it, but undecided here (see why)"

    def details(self) -> str:
        """What the sentence rests on, after it: the two figures, the evidence that decided, why it is undecided.
        'itl_ms p50 baseline 20 ms → now 23 ms, as measured, fastest repetitions, noise ±2.6%' (the noise: the
        interval's half-width, `resolution`)."""
        where = f" p{self.percentile}" if self.percentile else ""
        # a note that opens with the evidence phrase (busy.py: "load-corrected by …: …") says it once: after it
        evidence = self.evidence()
        lead = interference.load_corrected(self.load_free_by) if self.load_corrected else evidence
        opens = self.note.startswith(lead) and self.note[len(lead):len(lead) + 2] in (": ", ", ")
        note = self.note[len(lead) + 2:] if opens else self.note
        # at the save's thread speed, or load-corrected against a stored baseline, the two figures stay each side's
        # as measured, and the ratio is not theirs: said, or "45.2 → 39.3 tok/s" beside "0.6% lower" reads as a
        # contradiction (a new user's first reading)
        measured = ","
        if self.at_thread_speed or (self.load_corrected and self.repetitions):
            measured = " as measured, the ratio" + ("" if self.load_corrected else " compared by")
        return (f"{self.metric}{where} baseline {units.metric_value(self.metric, self.baseline)} → now "
                f"{units.metric_value(self.metric, self.candidate)}{measured} {evidence}"
                + (f", noise {units.noise(self.resolution)}" if self.repetitions else "")
                + (f", calibration probe {units.ratio(self.machine_slowdown)}" if self.machine_slowdown else "")
                + (f": {note}" if note else ""))

    def change_in_words(self) -> str:
        """"12% slower", "3% faster", "8% higher" (peak memory), "60% lower" (a throughput at ×2.5 its baseline's cost),
        "×10.3 slower", "×3.49 higher" (a figure grown by AS_FACTOR or more): the ratio (>1 worse) said for the
        metric's kind, of the figure itself."""
        unit, higher_is_better = METRICS[self.metric][0], METRICS[self.metric][1]
        up, down = ("higher", "lower") if unit == "MiB" or higher_is_better else ("slower", "faster") \
            if unit in ("ms", "s") else ("worse", "better")
        if abs(self.ratio - 1.0) < 0.0005:
            return "unchanged"
        factor = 1.0 / self.ratio if higher_is_better else self.ratio  # the figure now over the baseline's
        if factor >= AS_FACTOR:
            return f"{units.ratio(factor)} {up}"
        return f"{units.percent(abs(factor - 1.0))} {up if factor > 1 else down}"

    def to_dict(self) -> dict:
        return {**asdict(self), "sentence": self.sentence()}  # the sentence for readers of the JSON; not read back

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "status": Status(data["status"]), "samples": tuple(data.get("samples", (0, 0)))})


def compare_samples(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                    pct: int | None = 50, confidence: float = 0.95, resamples: int = 2000) -> Verdict:
    """Bootstrap CI of the candidate/baseline ratio of the chosen percentile, oriented so that > 1 is worse.

    pass: the whole CI lies at or below 1 + max_regression; fail: the whole CI lies above it;
    inconclusive: the CI straddles it (more samples would decide).
    """
    higher_is_better = METRICS[metric][1]
    stat = (lambda xs: percentile(xs, pct)) if METRICS[metric][2] else (lambda xs: percentile(xs, 50))
    top, bottom = (baseline, candidate) if higher_is_better else (candidate, baseline)  # top / bottom > 1: worse
    point, low, high = bootstrap_ratio_ci(top, bottom, stat, confidence, resamples)
    threshold = 1.0 + max_regression
    return Verdict(metric, interval_status(low, high, threshold), point, low, high, threshold,
                   pct if METRICS[metric][2] else None, stat(candidate), stat(baseline),
                   (len(candidate), len(baseline)))


# How far one workload's peak memory moves between fresh processes, which one process's repetitions do not show
# (benchmarks/memory_repro.py; docs/measurements.md): a stored comparison's interval is widened by it each way.
MEMORY_DRIFT = 1.05


def compare_memory(metric: str, candidate: list[float], baseline: list[float], max_regression: float) -> Verdict:
    """A memory figure against a stored baseline: the ratio of the two sides' medians with its bootstrap interval
    widened by MEMORY_DRIFT each way, so that a pass and a failure hold across processes. Memory does not care
    about co-tenants: it decides on a busy runner too."""
    verdict = compare_samples(metric, candidate, baseline, max_regression)
    low, high = verdict.low / MEMORY_DRIFT, verdict.high * MEMORY_DRIFT
    return replace(verdict, low=low, high=high, status=interval_status(low, high, verdict.threshold),
                   note=f"allowing {units.percent(MEMORY_DRIFT - 1)} either way for how peak memory moves between "
                        "processes")


# The smallest change of peak memory a check tells apart (MiB): on the CPU what serving raises the process by is
# sampled (process_meters.PeakMemory), and it moves by up to 1.9 MiB between fresh processes of one workload
# (benchmarks/memory_repro.py, docs/measurements.md). A budget's share of a model of a few MiB is finer than that.
MEMORY_RESOLUTION_MIB = 2.0


def within_memory_resolution(verdict: Verdict) -> Verdict:
    """A memory verdict with its limit at least the baseline + MEMORY_RESOLUTION_MIB: where `max_regression` of the
    baseline is less than that, a change the meter cannot resolve neither fails nor stays undecided, and a larger
    one still fails."""
    if verdict.metric not in MEMORY_METRICS or verdict.baseline <= 0:
        return verdict
    floor = 1.0 + MEMORY_RESOLUTION_MIB / verdict.baseline
    if floor <= verdict.threshold:
        return verdict
    why = (f"the limit is the baseline + {MEMORY_RESOLUTION_MIB:g} MiB, the smallest change peak memory resolves "
           f"({units.percent(verdict.threshold - 1)} of {units.metric_value(verdict.metric, verdict.baseline)} is "
           "less)")
    return replace(verdict, threshold=floor, status=interval_status(verdict.low, verdict.high, floor),
                   note="; ".join(filter(None, (verdict.note, why))))
