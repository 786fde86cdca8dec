"""Inline SVG line plots, drawn on the server: the cell page's metrics over runs with no JavaScript and nothing
fetched by the browser. Every text that goes into the SVG is escaped here; the result is Markup.

x is the run (categorical, in order, labelled by run id), y is linear from 0 (speedups, seconds and bytes are
all read against zero). A missing value breaks the line instead of joining across it. Each point carries a
<title>, so hovering shows the exact value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from markupsafe import Markup, escape

# Colour-blind-safe (Okabe–Ito) and distinct enough for five token counts.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9", "#000000", "#f0e442")
W, H = 560, 190
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 14, 40


def _nice_max(v: float) -> float:
    """1, 2, 2.5 or 5 × 10^k at or above v, so the top tick reads well."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = 10.0 ** math.floor(math.log10(v))  # a float: an int power of ten near 1e308 overflows when scaled
    return next((m * exp for m in (1, 2, 2.5, 5, 10) if math.isfinite(m * exp) and m * exp >= v), v)


def line_plot(title: str, x_labels: Sequence[str], series: Mapping[str, Sequence[float | None]],
              fmt: Callable[[float], str] = lambda v: f"{v:.3g}", unit: str = "") -> Markup:
    """One plot: `series` maps a legend name to one value (or None) per x label."""
    values = [v for ys in series.values() for v in ys if v is not None and math.isfinite(v)]
    label = escape(title)
    if not values or not x_labels:
        return Markup(f'<figure class="plot"><figcaption>{label}</figcaption><p class="muted">no data</p></figure>')
    top = _nice_max(max(values))
    n = len(x_labels)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (pw / 2 if n == 1 else pw * i / (n - 1))

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    parts = [(f'<svg class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
              f'aria-label="{label}" xmlns="http://www.w3.org/2000/svg">')]
    for frac in (0, 0.5, 1):
        yy = y(top * frac)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{escape(fmt(top * frac))}</text>')
    step = max(1, math.ceil(n / 12))  # at most ~12 run labels under the axis
    for i in range(0, n, step):
        parts.append(f'<text x="{x(i):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{escape(x_labels[i])}</text>')
    parts.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 6}" text-anchor="middle" class="axis">run</text>')
    legend = []
    for k, (name, ys) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        segment: list[str] = []
        segments = [segment]
        for i, v in enumerate(ys):
            if v is None or not math.isfinite(v):
                segment = []
                segments.append(segment)
                continue
            segment.append(f"{x(i):.1f},{y(v):.1f}")
        for seg in segments:
            if len(seg) > 1:
                parts.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for i, v in enumerate(ys):
            if v is not None and math.isfinite(v):
                tip = escape(f"{name}: {fmt(v)}{unit} (run {x_labels[i]})")
                parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="{colour}"><title>{tip}</title></circle>')
        legend.append(f'<span class="key"><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" '
                      f'fill="{colour}"/></svg>{escape(name)}</span>')
    parts.append("</svg>")
    caption = f'<figcaption>{label}{" — " + " ".join(legend) if len(series) > 1 else ""}</figcaption>'
    return Markup(f'<figure class="plot">{caption}{"".join(parts)}</figure>')
