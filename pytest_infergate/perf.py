"""Performance budgets, measurements and noise-aware verdicts. No pytest here.

A budget key is a metric, optionally with a percentile suffix: `ttft_ms`, `ttft_ms_p95`, `tokens_per_s`...
Distribution metrics (latencies) use the key's percentile, else the budget's `percentile` (default 50).
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_infergate.errors import InfergateError, OptionError
from pytest_infergate.stats import bootstrap_ratio_ci, paired_bootstrap_ci, percentile

# metric -> (unit, higher_is_better, is a per-request distribution)
METRICS: dict[str, tuple[str, bool, bool]] = {
    "ttft_ms": ("ms", False, True),
    "tpot_ms": ("ms", False, True),
    "itl_ms": ("ms", False, True),
    "e2e_ms": ("ms", False, True),
    "queue_ms": ("ms", False, True),
    "tokens_per_s": ("tok/s", True, False),
    "requests_per_s": ("req/s", True, False),
    "peak_mem_mb": ("MiB", False, False),
    "kv_mem_mb": ("MiB", False, False),
    "load_s": ("s", False, False),
    "success_rate": ("fraction", True, False),  # endpoint runs: requests answered / requests sent
    "goodput_per_s": ("req/s", True, False),  # endpoint runs: requests that met every SLO, per second
}
PERCENTILES = (50, 90, 95, 99)
_KEY = re.compile(r"^(?P<metric>[a-z0-9_]+?)(?:_p(?P<pct>\d+))?$")
_OPTION_KEYS = {"percentile": int, "max_regression": float}


class BudgetError(OptionError):
    """An infergate_budget marker or ini budget that names an unknown key or has a wrong value."""


class BudgetExceeded(InfergateError, AssertionError):
    """A measured value broke an absolute budget or regressed against the baseline."""


@dataclass(frozen=True)
class Limit:
    key: str  # as written, e.g. "ttft_ms_p95"
    metric: str
    percentile: int | None  # None for non-distribution metrics
    value: float

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric][1]


@dataclass(frozen=True)
class Budget:
    limits: tuple[Limit, ...] = ()
    percentile: int = 50
    max_regression: float | None = None

    @property
    def is_empty(self) -> bool:
        return not self.limits and self.max_regression is None


def allowed_keys() -> list[str]:
    keys = list(METRICS)
    keys += [f"{m}_p{p}" for m, (_, _, dist) in METRICS.items() if dist for p in PERCENTILES]
    return keys + list(_OPTION_KEYS)


def parse_budget(values: dict[str, Any], where: str = "infergate_budget") -> Budget:
    """Validate budget keys and values; raise BudgetError naming the key and the allowed ones."""
    percentile_default = values.get("percentile", 50)
    if not isinstance(percentile_default, int) or isinstance(percentile_default, bool) or percentile_default not in PERCENTILES:
        raise BudgetError(f"{where}: percentile={percentile_default!r} must be one of {PERCENTILES}")
    max_regression = values.get("max_regression")
    if max_regression is not None:
        if isinstance(max_regression, bool) or not isinstance(max_regression, (int, float)) or not 0 <= max_regression < 10:
            raise BudgetError(f"{where}: max_regression={max_regression!r} must be a fraction such as 0.10 (10%)")
        max_regression = float(max_regression)
    limits = []
    for key, value in values.items():
        if key in _OPTION_KEYS:
            continue
        match = _KEY.match(key)
        metric, pct = (match.group("metric"), match.group("pct")) if match else (key, None)
        if metric not in METRICS and key in METRICS:
            metric, pct = key, None
        if metric not in METRICS or (pct is not None and (int(pct) not in PERCENTILES or not METRICS[metric][2])):
            raise BudgetError(f"{where}: unknown budget key {key!r}; allowed: {', '.join(allowed_keys())}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise BudgetError(f"{where}: {key}={value!r} must be a positive number ({METRICS[metric][0]})")
        pct_value = (int(pct) if pct else percentile_default) if METRICS[metric][2] else None
        limits.append(Limit(key, metric, pct_value, float(value)))
    return Budget(tuple(limits), percentile_default, max_regression)


def parse_scoped_lines(lines: list[str], option: str, error: type[OptionError] = OptionError
                       ) -> dict[str, dict[str, float]]:
    """ini lines of the form `SCOPE: key=number, key=number` (blank lines and # comments skipped)."""
    scoped: dict[str, dict[str, float]] = {}
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        scope, sep, rest = line.partition(":")
        if not sep:
            raise error(f"{option} line {line!r} needs the form 'SCOPE: key=value, ...'")
        values: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, text = item.partition("=")
            try:
                number = float(text)
            except ValueError:
                number = None
            if not eq or number is None:
                raise error(f"{option} line {line!r}: {item!r} is not key=number")
            values[key.strip()] = int(number) if number.is_integer() and key.strip() == "percentile" else number
        scoped[scope.strip()] = values
    return scoped


def parse_ini_budgets(lines: list[str]) -> dict[str, Budget]:
    """ini `infergate_budgets`, one line per scope: `SCOPE: key=value, key=value`. SCOPE is a precision,
    a substring of the test id (and measurement label), or `*`. Example: `int8: tokens_per_s=5, peak_mem_mb=900`."""
    return {scope: parse_budget(values, f"infergate_budgets ({scope})")
            for scope, values in parse_scoped_lines(lines, "infergate_budgets", BudgetError).items()}


def merge_budgets(*budgets: Budget) -> Budget:
    """Later budgets override earlier ones key by key (marker over ini)."""
    limits: dict[str, Limit] = {}
    percentile_, max_regression = 50, None
    for budget in budgets:
        for limit in budget.limits:
            limits[limit.key] = limit
        percentile_ = budget.percentile if budget.percentile != 50 else percentile_
        max_regression = budget.max_regression if budget.max_regression is not None else max_regression
    return Budget(tuple(limits.values()), percentile_, max_regression)


@dataclass
class Measurement:
    """Samples of each metric from one measured workload. Latency metrics hold one value per request (warm-up
    requests excluded); throughput and memory hold one value per repetition."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    repetitions: int = 0
    num_requests: int = 0
    num_failed: int = 0
    memory: dict[str, float] = field(default_factory=dict)  # weights / kv / other split, MiB
    engine: dict[str, Any] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # per-step timeline of the last repetition
    label: str = ""

    def value(self, metric: str, pct: int | None = 50) -> float:
        values = self.samples.get(metric)
        if not values:
            raise KeyError(f"no samples of {metric} in this measurement")
        if METRICS[metric][2]:
            return percentile(values, pct or 50)
        return percentile(values, 50)

    def summary(self) -> dict[str, float]:
        out = {}
        for metric, values in self.samples.items():
            if not values:
                continue
            if METRICS[metric][2]:
                for pct in (50, 95, 99):
                    out[f"{metric}_p{pct}"] = percentile(values, pct)
            else:
                out[metric] = percentile(values, 50)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Measurement":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def add_request_latencies(samples: dict[str, list[float]], ttft_s: float | None, tpot_s: float | None,
                          itl_s: list[float], e2e_s: float, queue_s: float | None = None) -> None:
    """One finished request's latencies, in ms, into a Measurement's samples (engine and endpoint alike)."""
    if ttft_s is not None:
        samples.setdefault("ttft_ms", []).append(ttft_s * 1000)
    if tpot_s is not None:
        samples.setdefault("tpot_ms", []).append(tpot_s * 1000)
    samples.setdefault("itl_ms", []).extend(x * 1000 for x in itl_s)
    samples.setdefault("e2e_ms", []).append(e2e_s * 1000)
    if queue_s is not None:
        samples.setdefault("queue_ms", []).append(queue_s * 1000)


@dataclass
class Violation:
    key: str
    measured: float
    limit: float
    unit: str
    percentile: int | None
    samples: int
    higher_is_better: bool

    @property
    def margin(self) -> float:
        """How far past the limit, as a fraction of the limit (positive = violated)."""
        if self.higher_is_better:
            return (self.limit - self.measured) / self.limit
        return (self.measured - self.limit) / self.limit

    def describe(self) -> str:
        bound = ">=" if self.higher_is_better else "<="
        where = f"p{self.percentile} " if self.percentile else ""
        return (f"{self.key}: measured {where}{self.measured:.4g} {self.unit}, budget {bound} {self.limit:.4g} "
                f"{self.unit} (off by {self.margin:+.1%}, n={self.samples})")


def check_budget(measurement: Measurement, budget: Budget) -> list[Violation]:
    violations = []
    for limit in budget.limits:
        if limit.metric not in measurement.samples or not measurement.samples[limit.metric]:
            raise BudgetError(f"budget key {limit.key!r} cannot be checked: this measurement has no "
                              f"{limit.metric} samples")
        measured = measurement.value(limit.metric, limit.percentile)
        bad = measured < limit.value if limit.higher_is_better else measured > limit.value
        if bad:
            violations.append(Violation(limit.key, measured, limit.value, METRICS[limit.metric][0], limit.percentile,
                                        len(measurement.samples[limit.metric]), limit.higher_is_better))
    return violations


@dataclass
class Verdict:
    """Candidate vs baseline for one metric. `ratio` > 1 means the candidate is worse, whatever the direction."""

    metric: str
    status: str  # "pass", "fail", "inconclusive"
    ratio: float
    low: float
    high: float
    threshold: float  # 1 + max_regression
    percentile: int | None
    candidate: float
    baseline: float
    samples: tuple[int, int]
    paired: bool = False  # the ratio is the median of per-round ratios of an interleaved A/B run

    def describe(self) -> str:
        where = f"p{self.percentile} " if self.percentile else ""
        pairing = ", paired by round" if self.paired else ""
        return (f"{self.metric} {where}{self.status.upper()}: candidate/baseline slowdown x{self.ratio:.3f} "
                f"(95% CI {self.low:.3f}-{self.high:.3f}, threshold x{self.threshold:.3f}; "
                f"{self.candidate:.4g} vs {self.baseline:.4g}, n={self.samples[0]}/{self.samples[1]}{pairing})")

    def to_dict(self) -> dict:
        return asdict(self)


def compare_samples(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                    pct: int | None = 50, confidence: float = 0.95, resamples: int = 2000) -> Verdict:
    """Bootstrap CI of the candidate/baseline ratio of the chosen percentile, oriented so that > 1 is worse.

    pass: the whole CI lies at or below 1 + max_regression; fail: the whole CI lies above it;
    inconclusive: the CI straddles it (more samples would decide).
    """
    higher_is_better = METRICS[metric][1]
    stat = (lambda xs: percentile(xs, pct)) if METRICS[metric][2] else (lambda xs: percentile(xs, 50))
    if higher_is_better:  # worse = smaller, so take baseline/candidate
        point, low, high = bootstrap_ratio_ci(baseline, candidate, stat, confidence, resamples)
    else:
        point, low, high = bootstrap_ratio_ci(candidate, baseline, stat, confidence, resamples)
    threshold = 1.0 + max_regression
    return Verdict(metric, _decide(low, high, threshold), point, low, high, threshold,
                   pct if METRICS[metric][2] else None, stat(candidate), stat(baseline),
                   (len(candidate), len(baseline)))


def compare_paired(metric: str, candidate: list[float], baseline: list[float], max_regression: float,
                   confidence: float = 0.95, resamples: int = 2000) -> Verdict:
    """Like compare_samples for a per-repetition metric of an interleaved A/B run, where candidate[i] and
    baseline[i] were measured back to back: the ratio is taken within each round, so drift of the machine
    between rounds cancels instead of widening the interval; the CI bootstraps the median over rounds."""
    higher_is_better = METRICS[metric][1]
    ratios = [(b / c if higher_is_better else c / b) for c, b in zip(candidate, baseline) if c > 0 and b > 0]
    if len(ratios) != len(candidate):
        return compare_samples(metric, candidate, baseline, max_regression)
    point, low, high = paired_bootstrap_ci(ratios, lambda xs: percentile(xs, 50), confidence, resamples)
    threshold = 1.0 + max_regression
    return Verdict(metric, _decide(low, high, threshold), point, low, high, threshold, None,
                   percentile(candidate, 50), percentile(baseline, 50), (len(candidate), len(baseline)),
                   paired=True)


def _decide(low: float, high: float, threshold: float) -> str:
    return "fail" if low > threshold else "pass" if high <= threshold else "inconclusive"


def compare_measurements(candidate: Measurement, baseline: Measurement, budget: Budget,
                         metrics: list[str] | None = None, paired: bool = False) -> list[Verdict]:
    """Verdicts for every metric the budget names (or `metrics`), present in both measurements. `paired`:
    the two were measured in interleaved rounds, so per-repetition metrics compare round by round."""
    if budget.max_regression is None:
        return []
    names = metrics or sorted({limit.metric for limit in budget.limits} or {"tokens_per_s", "ttft_ms"})
    verdicts = []
    for metric in names:
        a, b = candidate.samples.get(metric), baseline.samples.get(metric)
        if not a or not b or metric in ("load_s",):
            continue
        if paired and not METRICS[metric][2] and len(a) == len(b) > 1:
            verdicts.append(compare_paired(metric, a, b, budget.max_regression))
            continue
        pct = next((l.percentile for l in budget.limits if l.metric == metric), budget.percentile)
        verdicts.append(compare_samples(metric, a, b, budget.max_regression, pct))
    return verdicts


@contextmanager
def injected_slowdown(model, fraction: float):
    """Make every forward of `model` take (1 + fraction) times as long, by sleeping after it for `fraction` of
    its own measured time. For checking that a gate detects a known slowdown."""
    starts: list[float] = []

    def before(module, args, kwargs):
        starts.append(time.perf_counter())

    def after(module, args, kwargs, output):
        elapsed = time.perf_counter() - starts.pop()
        time.sleep(elapsed * fraction)
        return output

    pre = model.register_forward_pre_hook(before, with_kwargs=True)
    post = model.register_forward_hook(after, with_kwargs=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
