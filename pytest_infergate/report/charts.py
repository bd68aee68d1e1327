"""Inline SVG charts. Plain strings built from numbers; every label goes through escape()."""

from __future__ import annotations

from html import escape

PALETTE = ("#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00")
W, H, PAD_L, PAD_B, PAD_T, PAD_R = 560, 240, 56, 40, 28, 12


def _frame(title: str, body: str, legend: list[tuple[str, str]] = (), height: int = H) -> str:
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


def _axis(ymax: float, unit: str, height: int = H) -> str:
    plot_h = height - PAD_B - PAD_T
    out = [f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{height - PAD_B}" class="ax"/>',
           f'<line x1="{PAD_L}" y1="{height - PAD_B}" x2="{W - PAD_R}" y2="{height - PAD_B}" class="ax"/>']
    for i in range(5):
        value = ymax * i / 4
        y = height - PAD_B - plot_h * i / 4
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end" class="tk">{value:.3g}</text>'
                   f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="grid"/>')
    out.append(f'<text x="12" y="{PAD_T + plot_h / 2}" transform="rotate(-90 12 {PAD_T + plot_h / 2})" '
               f'text-anchor="middle" class="tk">{escape(unit)}</text>')
    return "".join(out)


def bar_chart(title: str, categories: list[str], series: dict[str, list[float | None]], unit: str) -> str:
    """Grouped bars: one group per category, one bar per series."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not categories or not values:
        return ""
    ymax = max(values) * 1.1 or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    group_w = plot_w / len(categories)
    bar_w = group_w * 0.8 / max(1, len(series))
    body = [_axis(ymax, unit)]
    for ci, category in enumerate(categories):
        x0 = PAD_L + ci * group_w + group_w * 0.1
        for si, (name, vs) in enumerate(series.items()):
            value = vs[ci]
            if value is None:
                continue
            h = plot_h * value / ymax
            body.append(f'<rect x="{x0 + si * bar_w:.1f}" y="{H - PAD_B - h:.1f}" width="{bar_w * 0.95:.1f}" '
                        f'height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}"><title>{escape(name)} '
                        f'{escape(category)}: {value:.4g} {escape(unit)}</title></rect>')
        body.append(f'<text x="{PAD_L + (ci + 0.5) * group_w:.1f}" y="{H - PAD_B + 14}" text-anchor="middle" '
                    f'class="tk">{escape(category)}</text>')
    legend = [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)] if len(series) > 1 else []
    return _frame(title, "".join(body), legend)


def line_chart(title: str, xs: list[float], series: dict[str, list[float | None]], unit: str, x_unit: str) -> str:
    values = [v for vs in series.values() for v in vs if v is not None]
    if len(xs) < 1 or not values:
        return ""
    ymax = max(values) * 1.1 or 1.0
    xmin, xmax = min(xs), max(xs)
    span = (xmax - xmin) or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T

    def px(x):
        return PAD_L + plot_w * (x - xmin) / span

    def py(y):
        return H - PAD_B - plot_h * y / ymax

    body = [_axis(ymax, unit)]
    for x in sorted(set(xs)):
        body.append(f'<text x="{px(x):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">{x:g}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">{escape(x_unit)}</text>')
    for si, vs in enumerate(series.values()):
        color = PALETTE[si % len(PALETTE)]
        points = [(px(x), py(v)) for x, v in zip(xs, vs) if v is not None]
        if len(points) > 1:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points]
    return _frame(title, "".join(body), [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(series)])


def histogram(title: str, samples: dict[str, list[float]], unit: str, bins: int = 20) -> str:
    values = [v for vs in samples.values() for v in vs]
    if not values:
        return ""
    low, high = min(values), max(values)
    width = (high - low) / bins or 1.0
    counts = {}
    for name, vs in samples.items():
        row = [0] * bins
        for v in vs:
            row[min(bins - 1, int((v - low) / width))] += 1
        counts[name] = [c / max(1, len(vs)) for c in row]  # fractions, so series of different sizes compare
    ymax = max(max(r) for r in counts.values()) * 1.1 or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    body = [_axis(ymax, "fraction of requests")]
    bar_w = plot_w / bins
    for si, (name, row) in enumerate(counts.items()):
        color = PALETTE[si % len(PALETTE)]
        for bi, c in enumerate(row):
            if c:
                h = plot_h * c / ymax
                body.append(f'<rect x="{PAD_L + bi * bar_w:.1f}" y="{H - PAD_B - h:.1f}" width="{bar_w:.1f}" '
                            f'height="{h:.1f}" fill="{color}" fill-opacity="0.55"><title>{escape(name)}: '
                            f'{low + bi * width:.4g}-{low + (bi + 1) * width:.4g} {escape(unit)}: {c:.0%}'
                            '</title></rect>')
    for i in range(5):
        x = PAD_L + plot_w * i / 4
        body.append(f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tk">'
                    f'{low + (high - low) * i / 4:.4g}</text>')
    body.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 28}" text-anchor="end" class="tk">{escape(unit)}</text>')
    return _frame(title, "".join(body), [(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(counts)])


def timeline(title: str, steps: list[dict]) -> str:
    """Per engine step: prefill and decode tokens as stacked bars, batch size and KV blocks as lines."""
    if not steps:
        return ""
    n = len(steps)
    tokens = [s["num_prefill_tokens"] + s["num_decode_tokens"] + s.get("num_padding_tokens", 0) for s in steps]
    ymax = max(max(tokens), max(s["batch_size"] for s in steps), 1) * 1.1
    kv_max = max(max(s["kv_blocks_used"] for s in steps), 1)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_B - PAD_T
    bar_w = plot_w / n
    body = [_axis(ymax, "tokens / sequences")]
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
    return _frame(title, "".join(body), legend)
