"""Inline SVG charts (those the report draws from a run's records: report.run_charts). Plain strings built
from numbers; every label goes through escape(). Axes have round ticks (1/2/5 × 10^k) labelled like the tables
(pytest_infergate/units.py); a ms or MiB axis whose values run past 10 s or 10 GiB is drawn in s or GiB."""

from __future__ import annotations

from html import escape

from pytest_infergate import units

PALETTE = ("#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00")
W, H, PAD_L, PAD_B, PAD_T, PAD_R = 560, 240, 56, 40, 28, 12


def frame(title: str, body: str, legend: list[tuple[str, str]] = (), height: int = H) -> str:
    step = (W - PAD_L) / max(1, len(legend))
    fits = max(4, int((step - 18) / 5.5))  # characters of legend text per slot (about 5.5 px each)

    def label(name: str) -> str:  # long names are cut to their slot; the full name is the tooltip
        short = name if len(name) <= fits else name[:fits - 1] + "…"
        return f"<title>{escape(name)}</title>{escape(short)}"

    items = "".join(f'<rect x="{PAD_L + i * step:.0f}" y="{height - 12}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{PAD_L + 14 + i * step:.0f}" y="{height - 3}" class="lg">{label(name)}</text>'
                    for i, (name, color) in enumerate(legend))
    return (f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {W} {height}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
            f'<text x="{W / 2}" y="16" text-anchor="middle" class="ttl">{escape(title)}</text>{body}{items}</svg>')


def scaled(values: list[float], unit: str) -> tuple[float, str]:
    """(divisor, unit) for an axis: ms shown as s, MiB as GiB when the largest value needs it."""
    top = max((abs(v) for v in values), default=0)
    if unit == "ms" and top >= 10_000:
        return 1000.0, "s"
    if unit == "MiB" and top >= 10 * 1024:
        return 1024.0, "GiB"
    return 1.0, unit


def value_text(value: float, unit: str) -> str:
    """A value for a tooltip, in the tables' format."""
    if unit == "ms":
        return units.duration_ms(value)
    if unit == "MiB":
        return units.mebibytes(value)
    return f"{units.number(value)} {unit}".strip()


def _axis(top: float, unit: str, height: int = H, low: float = 0.0) -> tuple[str, float, float]:
    """The y axis from `low` to a round value at or above `top`: (svg, axis low, axis high)."""
    ticks = units.nice_ticks(low, top if top > low else low + 1.0)
    plot_h = height - PAD_B - PAD_T
    out = [f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{height - PAD_B}" class="ax"/>',
           f'<line x1="{PAD_L}" y1="{height - PAD_B}" x2="{W - PAD_R}" y2="{height - PAD_B}" class="ax"/>']
    span = (ticks[-1] - ticks[0]) or 1.0
    for value, label in zip(ticks, units.tick_labels(ticks)):
        y = height - PAD_B - plot_h * (value - ticks[0]) / span
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end" class="tk">{label}</text>'
                   f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="grid"/>')
    out.append(f'<text x="12" y="{PAD_T + plot_h / 2}" transform="rotate(-90 12 {PAD_T + plot_h / 2})" '
               f'text-anchor="middle" class="tk">{escape(unit)}</text>')
    return "".join(out), ticks[0], ticks[-1]


def bar_chart(title: str, categories: list[str], series: dict[str, list[float | None]], unit: str) -> str:
    """Grouped bars: one group per category, one bar per series."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not categories or not values:
        return ""
    divisor, unit = scaled(values, unit)
    axis, _, ymax = _axis(max(values) / divisor, unit)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    group_w = plot_w / len(categories)
    bar_w = group_w * 0.8 / max(1, len(series))
    body = [axis]
    for ci, category in enumerate(categories):
        x0 = PAD_L + ci * group_w + group_w * 0.1
        for si, (name, vs) in enumerate(series.items()):
            value = vs[ci]
            if value is None:
                continue
            h = plot_h * value / divisor / ymax
            body.append(f'<rect x="{x0 + si * bar_w:.1f}" y="{H - PAD_B - h:.1f}" width="{bar_w * 0.95:.1f}" '
                        f'height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}"><title>{escape(name)} '
                        f'{escape(category)}: {escape(value_text(value / divisor, unit))}</title></rect>')
        body.append(f'<text x="{PAD_L + (ci + 0.5) * group_w:.1f}" y="{H - PAD_B + 14}" text-anchor="middle" '
                    f'class="tk">{escape(category)}</text>')
    legend = [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)] if len(series) > 1 else []
    return frame(title, "".join(body), legend)


def line_chart(title: str, xs: list[float], series: dict[str, list[float | None]], unit: str, x_unit: str) -> str:
    values = [v for vs in series.values() for v in vs if v is not None]
    if len(xs) < 1 or not values:
        return ""
    divisor, unit = scaled(values, unit)
    axis, _, ymax = _axis(max(values) / divisor, unit)
    xmin, xmax = min(xs), max(xs)
    span = (xmax - xmin) or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T

    def px(x):
        return PAD_L + plot_w * (x - xmin) / span

    def py(y):
        return H - PAD_B - plot_h * y / divisor / ymax

    body = [axis]
    for x in sorted(set(xs)):
        body.append(f'<text x="{px(x):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">'
                    f'{units.number(x)}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">{escape(x_unit)}</text>')
    for si, vs in enumerate(series.values()):
        color = PALETTE[si % len(PALETTE)]
        points = [(px(x), py(v)) for x, v in zip(xs, vs) if v is not None]
        if len(points) > 1:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points]
    return frame(title, "".join(body), [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(series)])


def histogram(title: str, samples: dict[str, list[float]], unit: str, bins: int = 20) -> str:
    values = [v for vs in samples.values() for v in vs]
    if not values:
        return ""
    divisor, unit = scaled(values, unit)
    ticks = units.nice_ticks(min(values) / divisor, max(values) / divisor)
    low, high = ticks[0], ticks[-1]
    width = (high - low) / bins or 1.0
    counts = {}
    for name, vs in samples.items():
        row = [0] * bins
        for v in vs:
            row[min(bins - 1, int((v / divisor - low) / width))] += 1
        counts[name] = [c / max(1, len(vs)) for c in row]  # fractions, so series of different sizes compare
    axis, _, ymax = _axis(max(max(r) for r in counts.values()), "fraction of requests")
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    body = [axis]
    bar_w = plot_w / bins
    for si, (name, row) in enumerate(counts.items()):
        color = PALETTE[si % len(PALETTE)]
        for bi, c in enumerate(row):
            if c:
                h = plot_h * c / ymax
                body.append(f'<rect x="{PAD_L + bi * bar_w:.1f}" y="{H - PAD_B - h:.1f}" width="{bar_w:.1f}" '
                            f'height="{h:.1f}" fill="{color}" fill-opacity="0.55"><title>{escape(name)}: '
                            f'{units.number(low + bi * width)}–{units.number(low + (bi + 1) * width)} '
                            f'{escape(unit)}: {c:.0%}</title></rect>')
    for tick, label in zip(ticks, units.tick_labels(ticks)):
        x = PAD_L + plot_w * (tick - low) / ((high - low) or 1.0)
        body.append(f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">{label}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">{escape(unit)}</text>')
    return frame(title, "".join(body), [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(counts)])


def timeline(title: str, steps: list[dict]) -> str:
    """Per engine step: prefill and decode tokens as stacked bars, batch size and KV blocks as lines."""
    if not steps:
        return ""
    n = len(steps)
    tokens = [s["num_prefill_tokens"] + s["num_decode_tokens"] + s.get("num_padding_tokens", 0) for s in steps]
    axis, _, ymax = _axis(max(max(tokens), max(s["batch_size"] for s in steps), 1), "tokens / sequences")
    kv_max = max(max(s["kv_blocks_used"] for s in steps), 1)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    bar_w = plot_w / n
    body = [axis]
    for i, s in enumerate(steps):
        x = PAD_L + i * bar_w
        y = H - PAD_B
        for key, color in (("num_decode_tokens", PALETTE[0]), ("num_prefill_tokens", PALETTE[2]),
                           ("num_padding_tokens", PALETTE[1])):
            h = plot_h * s.get(key, 0) / ymax
            if h:
                body.append(f'<rect x="{x:.2f}" y="{y - h:.2f}" width="{max(bar_w, 0.5):.2f}" height="{h:.2f}" '
                            f'fill="{color}"/>')
                y -= h
    batch = " ".join(f"{PAD_L + (i + 0.5) * bar_w:.1f},{H - PAD_B - plot_h * s['batch_size'] / ymax:.1f}"
                     for i, s in enumerate(steps))
    kv = " ".join(f"{PAD_L + (i + 0.5) * bar_w:.1f},{H - PAD_B - plot_h * s['kv_blocks_used'] / kv_max:.1f}"
                  for i, s in enumerate(steps))
    body.append(f'<polyline fill="none" stroke="{PALETTE[3]}" stroke-width="1.5" points="{batch}"/>')
    body.append(f'<polyline fill="none" stroke="{PALETTE[4]}" stroke-width="1.5" stroke-dasharray="4 2" '
                f'points="{kv}"/>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 14}" text-anchor="end" class="tk">{n} steps</text>')
    legend = [("decode", PALETTE[0]), ("prefill", PALETTE[2]), ("padding", PALETTE[1]),
              ("batch", PALETTE[3]), (f"KV blk ≤{kv_max}", PALETTE[4])]
    return frame(title, "".join(body), legend)


def marked_xy_chart(title: str, series: dict[str, list[tuple[float, float]]], unit: str, x_unit: str, *,
                    guides: tuple[tuple[float, str], ...] = (), mark: tuple[float, str] | None = None,
                    band: tuple[float, float] | None = None) -> str:
    """Lines over a numeric x axis (round ticks, not one per point) with horizontal `guides` (an SLO: value,
    label), a vertical `mark` (the capacity: x, label) and a shaded x `band` (where the knee lies)."""
    values = [y for points in series.values() for _, y in points] + [value for value, _ in guides]
    xs = [x for points in series.values() for x, _ in points]
    if not xs or not values:
        return ""
    divisor, unit = scaled(values, unit)
    axis, _, ymax = _axis(max(values) / divisor * 1.05, unit)
    x_ticks = units.nice_ticks(0.0, max(xs))
    xmax = x_ticks[-1] or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T

    def px(x: float) -> float:
        return PAD_L + plot_w * x / xmax

    def py(y: float) -> float:
        return H - PAD_B - plot_h * y / divisor / ymax

    body = [axis]
    if band is not None:
        body.append(f'<rect x="{px(band[0]):.1f}" y="{PAD_T}" width="{max(1.0, px(band[1]) - px(band[0])):.1f}" '
                    f'height="{plot_h}" fill="#fff8c5"><title>the knee lies in here</title></rect>')
    for tick, label in zip(x_ticks, units.tick_labels(x_ticks)):
        body.append(f'<text x="{px(tick):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">{label}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">{escape(x_unit)}</text>')
    for value, label in guides:
        y = py(value)
        body.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="{PALETTE[1]}" '
                    f'stroke-dasharray="6 3"/><text x="{W - PAD_R - 2}" y="{y - 3:.1f}" text-anchor="end" '
                    f'class="tk">{escape(label)}</text>')
    if mark is not None:
        x = px(mark[0])
        body.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" stroke="{PALETTE[3]}" '
                    f'stroke-width="2"><title>{escape(mark[1])}</title></line>'
                    + (f'<text x="{x + 4:.1f}" y="{PAD_T + 10}" class="tk">' if x < W / 2 else
                       f'<text x="{x - 4:.1f}" y="{PAD_T + 10}" text-anchor="end" class="tk">')
                    + f'{escape(mark[1])}</text>')
    for si, (name, points) in enumerate(series.items()):
        color = PALETTE[(si + 4) % len(PALETTE)] if len(series) > 1 else PALETTE[0]
        points = sorted(points)
        coords = [(px(x), py(y)) for x, y in points]
        if len(coords) > 1:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"/>')
        body += [f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}"><title>{escape(name)} at '
                 f'{units.number(x)} {escape(x_unit)}: {escape(value_text(y / divisor, unit))}</title></circle>'
                 for (cx, cy), (x, y) in zip(coords, points)]
    legend = [(name, PALETTE[(i + 4) % len(PALETTE)] if len(series) > 1 else PALETTE[0])
              for i, name in enumerate(series)]
    return frame(title, "".join(body), legend)
