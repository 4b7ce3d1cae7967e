"""Inline SVG charts for the HTML report: line charts, horizontal bars and heat maps.

Plain SVG markup with no script and no external reference, so the report opens offline and
in any browser. Input is a normalized plot spec from ``plots.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H = 680, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 140, 30, 60


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(lo), math.ceil(hi)
        every = max(1, (b - a) // 6)
        return [float(e) for e in range(a, b + 1, every)]
    if hi == lo:
        return [lo]
    raw = (hi - lo) / 5
    mag = 10.0 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = float(math.ceil(lo / step) * step)
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _header(kind: str, title: str, width: int, height: int) -> list[str]:
    return [f'<svg class="plot plot-{kind}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title or kind)}">',
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
            f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>']


def line_chart(p: dict[str, Any]) -> str:
    log = p["log_y"]

    def ty(v: float | None) -> float | None:
        if v is None or (log and v <= 0):
            return None
        return math.log10(v) if log else v

    pts = [[(x, ty(y)) for x, y in zip(s["x"], s["y"])] for s in p["series"]]
    xs = [x for s in pts for x, y in s if x is not None and y is not None]
    ys = [y for s in pts for x, y in s if x is not None and y is not None]
    thr = ty(p["threshold"])
    if thr is not None:
        ys.append(thr)
    out = _header("line", p["title"], W, H)
    if not xs:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no finite values to plot</text></svg>')
        return "\n".join(out)
    x0, x1 = float(min(xs)), float(max(xs))
    y0, y1 = float(min(ys)), float(max(ys))
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        y0, y1 = (y0 - 1, y1 + 1) if log else (y0 - abs(y0) * 0.1 - 1e-12, y1 + abs(y1) * 0.1 + 1e-12)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for t in _ticks(y0, y1, log):
        if y0 <= t <= y1:
            label = f"1e{int(t)}" if log else _fmt(t)
            out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                       f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    names = p["x_ticks"]
    if names:
        every = max(1, math.ceil(len(names) / 20))
        for i in range(0, len(names), every):
            if x0 <= i <= x1:
                out.append(f'<text x="{sx(i):.1f}" y="{TOP + ph + 12}" font-size="9" text-anchor="end" '
                           f'transform="rotate(-40 {sx(i):.1f} {TOP + ph + 12})">{escape(names[i][:24])}</text>')
    else:
        for t in _ticks(x0, x1, False):
            out.append(f'<text x="{sx(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="11">{_fmt(t)}</text>')
    if thr is not None:
        out.append(f'<line class="threshold" x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(thr):.1f}" y2="{sy(thr):.1f}" '
                   f'stroke="#555" stroke-dasharray="6 4"/>')
    for i, (s, series) in enumerate(zip(pts, p["series"])):
        color = PALETTE[i % len(PALETTE)]
        segment: list[str] = []
        segments: list[list[str]] = []
        for x, y in s:
            if x is None or y is None:
                if segment:
                    segments.append(segment)
                segment = []
                continue
            segment.append(f"{sx(x):.1f},{sy(y):.1f}")
        if segment:
            segments.append(segment)
        for seg in segments:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(seg)}"/>')
            if len(s) <= 64:
                out += [f'<circle cx="{c.split(",")[0]}" cy="{c.split(",")[1]}" r="2.5" fill="{color}"/>' for c in seg]
        ly = TOP + 14 + 16 * i
        out.append(f'<rect x="{W - RIGHT + 10}" y="{ly - 9}" width="12" height="4" fill="{color}"/>'
                   f'<text x="{W - RIGHT + 26}" y="{ly - 4}" font-size="11">{escape(series["name"][:18])}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 4}" text-anchor="middle" font-size="11">{escape(p["x_label"])}</text>')
    out.append(f'<text x="14" y="{TOP + ph / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 14 {TOP + ph / 2})">{escape(p["y_label"])}{" (log)" if log else ""}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(p: dict[str, Any]) -> str:
    bars = p["bars"]
    label_w, row, bar_w = 180, 22, 380
    height = TOP + row * len(bars) + 20
    width = label_w + bar_w + 110
    top = max((b["value"] for b in bars if b["value"] is not None), default=0.0)
    scale = bar_w / top if top > 0 else 0.0
    out = _header("bars", p["title"], width, height)
    for i, b in enumerate(bars):
        y = TOP + i * row
        out.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="11">{escape(b["label"][:30])}</text>')
        v = b["value"]
        if v is None:
            out.append(f'<text x="{label_w + 4}" y="{y + 15}" font-size="11" fill="#a00">not a number</text>')
            continue
        w = max(v * scale, 1.0) if v > 0 else 1.0
        out.append(f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                   f'fill="{PALETTE[i % len(PALETTE)]}"/>'
                   f'<text x="{label_w + w + 4:.1f}" y="{y + 15}" font-size="11">{_fmt(v)} {escape(p["unit"])}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _color(t: float) -> str:
    """White (0) to dark red (1)."""
    t = min(max(t, 0.0), 1.0)
    r, g, b = 255 - int(75 * t), 255 - int(230 * t), 255 - int(215 * t)
    return f"rgb({r},{g},{b})"


def heat_map(p: dict[str, Any]) -> str:
    rows, cols, values = p["rows"], p["cols"], p["values"]
    cell_w, cell_h, label_w, label_h = 84, 28, 120, 50
    width, height = label_w + cell_w * len(cols) + 20, TOP + label_h + cell_h * len(rows) + 10
    log = p["log"]
    finite: Sequence[float] = [v for row in values for v in row if v is not None and (not log or v > 0)]
    tv = [math.log10(v) for v in finite] if log else list(finite)
    lo, hi = (min(tv), max(tv)) if tv else (0.0, 1.0)
    out = _header("matrix", p["title"], width, height)
    for j, c in enumerate(cols):
        x = label_w + j * cell_w + cell_w / 2
        out.append(f'<text x="{x:.0f}" y="{TOP + label_h - 8}" text-anchor="middle" font-size="11">{escape(c[:14])}</text>')
    for i, r in enumerate(rows):
        y = TOP + label_h + i * cell_h
        out.append(f'<text x="{label_w - 6}" y="{y + cell_h / 2 + 4:.0f}" text-anchor="end" font-size="11">{escape(r[:18])}</text>')
        for j, v in enumerate(values[i]):
            x = label_w + j * cell_w
            if v is None:
                fill, text = "#f4f4f4", "—"
            else:
                t = (math.log10(v) if log and v > 0 else v) if not (log and v <= 0) else lo
                fill, text = _color((t - lo) / (hi - lo) if hi > lo else 0.0), _fmt(v)
            out.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell_w}" height="{cell_h}" fill="{fill}" stroke="#fff"/>'
                       f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 4:.0f}" text-anchor="middle" font-size="11">{text}</text>')
    out.append("</svg>")
    return "\n".join(out)


def chart(p: dict[str, Any]) -> str:
    return {"line": line_chart, "bars": bar_chart, "matrix": heat_map}[p["kind"]](p)
