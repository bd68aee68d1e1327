"""Numbers as people read them, for every output (terminal summary, `infergate summary`, the HTML report, its chart
axes and the history page): units chosen by magnitude (4,540 ms, 16.8 s, 1,160 MiB), thousands separators, three
significant digits, never e-notation for a figure someone reads in milliseconds, and round chart ticks.

A value that is missing or not finite is never printed as `inf` / `nan`: it prints as a dash, or as "undefined"
where the results say why (see `results.records.undefined_reason`)."""

from __future__ import annotations

import math

from pytest_infergate.measurement import METRICS

DASH = "–"
# quality figures: fractions in [0, 1], divergences in nats
QUALITY_UNITS = {"rougeL": "", "rouge1": "", "rouge2": "", "exact_match": "", "top1": "", "mean_kl": "nats",
                 "p99_kl": "nats", "task_ratio": "×", "length_ratio": "×", "delta_ppl": "", "delta_ppl_rel": ""}
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(value: object, digits: int = 3) -> str:
    """`digits` significant digits with thousands separators: 16843 -> 16,800; 0.01234 -> 0.0123; 1.2e-7 -> 1.2×10⁻⁷
    (only below 0.0001, where a row of zeros reads worse than a power of ten)."""
    if not is_number(value):
        return DASH
    if value == 0:
        return "0"
    if isinstance(value, int) and abs(value) < 10 ** digits:
        return f"{value:,}"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude < -4:
        mantissa = f"{value / 10 ** magnitude:.{max(0, digits - 2)}f}".rstrip("0").rstrip(".")
        return f"{mantissa}×10{str(magnitude).translate(_SUPERSCRIPT)}"
    decimals = digits - 1 - magnitude
    rounded = round(value, decimals)  # a negative `decimals` rounds to tens, hundreds...
    if decimals <= 0:
        return f"{rounded:,.0f}"
    return f"{rounded:,.{decimals}f}".rstrip("0").rstrip(".")


def duration_ms(value: object) -> str:
    """Milliseconds below 10 s (0.42 ms, 4,540 ms), seconds above (16.8 s)."""
    if not is_number(value):
        return DASH
    if abs(value) >= 10_000:
        return f"{number(value / 1000)} s"
    return f"{number(value)} ms"


def mebibytes(value: object) -> str:
    """MiB below 10 GiB (1,160 MiB), GiB above (12.5 GiB)."""
    if not is_number(value):
        return DASH
    if abs(value) >= 10 * 1024:
        return f"{number(value / 1024)} GiB"
    return f"{number(value)} MiB"


def ratio(value: object) -> str:
    return f"×{number(value)}" if is_number(value) else DASH


def change(value: object) -> str:
    """A relative change: +12.3%, −4.1%."""
    if not is_number(value):
        return DASH
    return f"{'+' if value >= 0 else '−'}{number(abs(value) * 100, 3 if abs(value) >= 0.1 else 2)}%"


def percent(value: object) -> str:
    return f"{number(value * 100)}%" if is_number(value) else DASH


def noise(resolution: float, places: int = 1) -> str:
    """An interval's resolution (stats.resolution, a factor) as the noise a reader knows: '±2.6%'."""
    return f"±{resolution - 1:.{places}%}"


def metric_value(metric: str, value: object) -> str:
    """A perf figure in its metric's unit (budget keys and summary keys such as `ttft_ms_p95` too)."""
    unit = metric_unit(metric)
    if unit == "ms":
        return duration_ms(value)
    if unit == "MiB":
        return mebibytes(value)
    if unit == "fraction":
        return percent(value)
    if unit == "s":
        return f"{number(value)} s" if is_number(value) else DASH
    return f"{number(value)} {unit}" if is_number(value) and unit else number(value)


def metric_unit(metric: str) -> str:
    """The unit of a metric or summary key (`ttft_ms_p95` -> ms), "" for quality figures and unknown keys."""
    base = metric.rsplit("_p", 1)[0] if metric.rsplit("_p", 1)[-1].isdigit() else metric
    if base in METRICS:
        return METRICS[base][0]
    return "MiB" if base.endswith("_mb") else ""


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 × 10^k) covering [low, high] with about `count` ticks."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:  # one value: a band around it
        span = abs(low) * 0.1 or 1.0
        low, high = low - span, high + span
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    ticks = [math.floor(low / step) * step]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(ticks[-1] + step)
    ticks = [round(t, 12) for t in ticks]
    return ticks


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels for round ticks, with as many decimals as their step needs (16.80, 16.82 rather than 16.8, 16.8)."""
    if len(ticks) < 2:
        return [number(t) for t in ticks]
    step = abs(ticks[1] - ticks[0]) or 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [f"{t:,.{decimals}f}" for t in ticks]
