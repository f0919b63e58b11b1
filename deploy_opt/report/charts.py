"""The inline SVG charts of the report pages: grouped bars, drops against the gate's limit, and a scatter.

Each should read at a glance. Labels are sized to fit: a long one is shortened from the left, and the whole name
is in its tooltip. The gate's limit is drawn where it applies. An axis spans what it shows, not 0 to 100, so
100 and 99.34 do not look the same. Every chart is well-formed XML, so tests can parse it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deploy_opt.report.html_parts import esc, fmt

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
LIMIT_COLOR = "#c44e52"
GRID_COLOR = "#e4e4e4"
CHAR_PX = 6.4  # a generous average width of one character at font-size 11
MAX_LABEL_PX = 380  # a label column wider than this shortens its labels instead
Scale = Callable[[float], float]  # a value to its pixel position on one axis
Frame = tuple[float, float, float, float]  # a plot's left, right, top and bottom, in pixels


@dataclass(frozen=True)
class Point:
    """One point of a scatter; ``marked`` ones (what shipped) are drawn larger, in red, with their label."""

    x: float
    y: float
    label: str
    marked: bool = False


@dataclass(frozen=True)
class Limit:
    """A dashed line across a chart at ``value`` on one axis ("x" or "y"), with the text that names it."""

    axis: str
    value: float
    text: str


def fit(text: str, max_px: float) -> str:
    """``text`` shortened from the left to fit ``max_px``: a tensor's name ends in the part that tells it apart."""
    room = max(4, int(max_px / CHAR_PX))
    return text if len(text) <= room else "…" + text[-(room - 1) :]


def label_width(labels: Sequence[str]) -> float:
    """The width of a label column that fits the longest label, up to MAX_LABEL_PX."""
    longest = max((len(label) for label in labels), default=0)
    return min(MAX_LABEL_PX, longest * CHAR_PX + 16)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) from ``low`` to ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 12) for i in range(first, math.floor(high / step + 1e-9) + 1)]


def _svg(width: float, height: float, parts: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img">{"".join(parts)}</svg>'
    )


TITLE_CHAR_PX = 7.8  # one bold character at font-size 13


def _title(title: str, note: str = "") -> str:
    """The title, and under it a note in small grey type (what the chart leaves out, say)."""
    text = f'<text x="8" y="18" font-size="13" font-weight="bold">{esc(title)}</text>'
    return text + (f'<text x="8" y="33" font-size="10" fill="#555">{esc(note)}</text>' if note else "")


def _fit_width(width: float, title: str, note: str = "") -> float:
    """A chart at least as wide as its title and note, so neither is cut off."""
    return max(width, len(title) * TITLE_CHAR_PX + 16, len(note) * CHAR_PX + 16)


def _row_label(text: str, x: float, y: float, max_px: float) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="11" text-anchor="end">{esc(fit(text, max_px))}'
        f"<title>{esc(text)}</title></text>"
    )


def bar_chart(
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    unit: str,
    plot_width: int = 400,
    bar_height: int = 16,
    note: str = "",
) -> str:
    """Horizontal grouped bars from 0 (for quantities, not scores): one group per label, one bar per series.

    A legend names the series when there are several; a single series is named by the title.
    """
    values = [v for s in series.values() for v in s if v is not None and math.isfinite(v)]
    if not groups or not values:
        return ""
    top = max(max(values), 0.0) or 1.0
    label_w = label_width(groups)
    width = _fit_width(label_w + plot_width + 90, title, note)
    head = 44 if note else 30
    group_h = len(series) * (bar_height + 2) + 10
    legend_rows = math.ceil(len(series) / 3) if len(series) > 1 else 0
    height = head + len(groups) * group_h + 12 + 16 * legend_rows
    parts = [_title(title, note)]
    for g, group in enumerate(groups):
        y0 = head + g * group_h
        parts.append(_row_label(group, label_w - 8, y0 + group_h / 2, label_w - 16))
        for s, (name, data) in enumerate(series.items()):
            value = data[g] if g < len(data) else None
            if value is None or not math.isfinite(value):
                continue
            y = y0 + s * (bar_height + 2)
            w = max(1.0, plot_width * max(value, 0.0) / top)
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_height}" '
                f'fill="{PALETTE[s % len(PALETTE)]}"><title>{esc(name)}: {fmt(value)} {esc(unit)}</title>'
                f'</rect><text x="{label_w + w + 4:.1f}" y="{y + bar_height - 4}" font-size="10">'
                f"{esc(fmt(value))} {esc(unit)}</text>"
            )
    legend_y = head + len(groups) * group_h + 8
    for s, name in enumerate(series if legend_rows else ()):
        x, y = 8 + (s % 3) * 200, legend_y + 16 * (s // 3)
        parts.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{PALETTE[s % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{y + 9}" font-size="10">{esc(name)}</text>'
        )
    return _svg(width, height, parts)


def drop_chart(
    title: str,
    rows: Sequence[tuple[str, float | None]],
    limit: float | None,
    unit: str = "points",
    plot_width: int = 420,
    bar_height: int = 16,
) -> str:
    """Each row's drop against the reference as a bar from 0 (left: better), with the gate's limit dashed.

    The axis spans the drops and the limit, so a drop of 0.66 against a limit of 1 is two thirds of the way.
    """
    shown = [(label, v) for label, v in rows if v is not None and math.isfinite(v)]
    if not shown:
        return ""
    values = [v for _, v in shown] + [0.0] + ([limit] if limit is not None else [])
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or 0.5
    low, high = low - (pad if low < 0 else 0.0), high + pad
    label_w = label_width([label for label, _ in shown])
    left, width = label_w, _fit_width(label_w + plot_width + 70, title)
    top = 46
    bottom = top + len(shown) * (bar_height + 6)
    height = bottom + 34

    def px(value: float) -> float:
        return left + (value - low) / (high - low) * plot_width

    parts = [_title(title)]
    for tick in nice_ticks(low, high):
        parts.append(
            f'<line x1="{px(tick):.1f}" y1="{top}" x2="{px(tick):.1f}" y2="{bottom}" stroke="{GRID_COLOR}"/>'
            f'<text x="{px(tick):.1f}" y="{bottom + 13}" font-size="10" text-anchor="middle">'
            f"{fmt(tick, '.3g')}</text>"
        )
    for i, (label, value) in enumerate(shown):
        y = top + i * (bar_height + 6)
        x0, x1 = sorted((px(0.0), px(value)))
        parts.append(_row_label(label, left - 8, y + bar_height - 4, label_w - 16))
        fill = LIMIT_COLOR if limit is not None and value > limit else PALETTE[0]
        parts.append(
            f'<rect class="drop" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.0):.1f}" '
            f'height="{bar_height}" fill="{fill}"><title>{esc(label)}: drop {fmt(value)} {esc(unit)}</title>'
            f'</rect><text x="{x1 + 4:.1f}" y="{y + bar_height - 4}" font-size="10">'
            f"{esc(fmt(value, '.3g'))}</text>"
        )
    parts.append(f'<line x1="{px(0.0):.1f}" y1="{top - 4}" x2="{px(0.0):.1f}" y2="{bottom}" stroke="#555"/>')
    if limit is not None:
        parts.append(
            f'<line class="limit" x1="{px(limit):.1f}" y1="{top - 4}" x2="{px(limit):.1f}" y2="{bottom}" '
            f'stroke="{LIMIT_COLOR}" stroke-dasharray="5,3"/><text x="{px(limit):.1f}" y="{top - 6}" '
            f'font-size="10" fill="{LIMIT_COLOR}" text-anchor="middle">max_drop {fmt(limit)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_width / 2:.1f}" y="{height - 6}" font-size="11" text-anchor="middle">'
        f"drop ({esc(unit)}; left of 0: better than the reference)</text>"
    )
    return _svg(width, height, parts)


def _span(values: list[float]) -> tuple[float, float]:
    """An axis range around ``values`` with a margin, so no point sits on the frame."""
    low, high = min(values), max(values)
    pad = (high - low) * 0.06 or max(abs(high) * 0.1, 0.5)
    return low - pad, high + pad


def scatter_chart(
    title: str,
    points: Sequence[Point],
    x_label: str,
    y_label: str,
    limits: Sequence[Limit] = (),
    width: int = 680,
    height: int = 360,
) -> str:
    """Points with gridlines and dashed limits; marked points are drawn larger in red, with their label."""
    finite = [p for p in points if math.isfinite(p.x) and math.isfinite(p.y)]
    if not finite:
        return ""
    width = round(_fit_width(width, title))
    x0, x1 = _span([p.x for p in finite] + [lim.value for lim in limits if lim.axis == "x"])
    y0, y1 = _span([p.y for p in finite] + [lim.value for lim in limits if lim.axis == "y"])
    left, right, top, bottom = 64, width - 24, 34, height - 58

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    parts = [_title(title)] + _grid(nice_ticks(x0, x1), nice_ticks(y0, y1), px, py, (left, right, top, bottom))
    parts += [
        f'<text x="{(left + right) / 2}" y="{bottom + 30}" font-size="11" text-anchor="middle">{esc(x_label)}</text>',
        f'<text x="14" y="{(top + bottom) / 2}" font-size="11" transform="rotate(-90 14 {(top + bottom) / 2})" '
        f'text-anchor="middle">{esc(y_label)}</text>',
    ]
    for lim in limits:
        parts.append(_limit_line(lim, px, py, (left, right, top, bottom)))
    for p in sorted(finite, key=lambda p: p.marked):
        r, color = (7, LIMIT_COLOR) if p.marked else (4, PALETTE[0])
        css = ' class="marked"' if p.marked else ""
        parts.append(
            f'<circle{css} cx="{px(p.x):.1f}" cy="{py(p.y):.1f}" r="{r}" fill="{color}" fill-opacity="0.8">'
            f"<title>{esc(p.label)}: {fmt(p.x, '.3g')}, {fmt(p.y, '.3g')}</title></circle>"
        )
        if p.marked:  # the label goes on the side with room, so it is never cut off at the frame
            east = px(p.x) < (left + right) / 2
            anchor, dx = ("start", 10) if east else ("end", -10)
            parts.append(
                f'<text x="{px(p.x) + dx:.1f}" y="{py(p.y) - 8:.1f}" font-size="10" '
                f'text-anchor="{anchor}">{esc(p.label)}</text>'
            )
    parts.append(_scatter_legend(bottom + 46, any(p.marked for p in finite), bool(limits)))
    return _svg(width, height, parts)


def _grid(xs: list[float], ys: list[float], px: Scale, py: Scale, frame: Frame) -> list[str]:
    """Light gridlines with their values, and the frame's bottom and left edges."""
    left, right, top, bottom = frame
    parts = []
    for x in xs:
        parts.append(
            f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{bottom}" stroke="{GRID_COLOR}"/>'
            f'<text x="{px(x):.1f}" y="{bottom + 14}" font-size="10" text-anchor="middle">'
            f"{fmt(x, '.3g')}</text>"
        )
    for y in ys:
        parts.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{right}" y2="{py(y):.1f}" stroke="{GRID_COLOR}"/>'
            f'<text x="{left - 5}" y="{py(y) + 3:.1f}" font-size="10" text-anchor="end">'
            f"{fmt(y, '.3g')}</text>"
        )
    return parts + [
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#888"/>',
    ]


def _limit_line(lim: Limit, px: Scale, py: Scale, frame: Frame) -> str:
    left, right, top, bottom = frame
    style = f'stroke="{LIMIT_COLOR}" stroke-dasharray="5,3"'
    if lim.axis == "y":
        y = py(lim.value)
        return (
            f'<line class="limit" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" {style}/>'
            f'<text x="{right - 4}" y="{y - 4:.1f}" font-size="10" fill="{LIMIT_COLOR}" text-anchor="end">'
            f"{esc(lim.text)}</text>"
        )
    x = px(lim.value)
    return (
        f'<line class="limit" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" {style}/>'
        f'<text x="{x + 4:.1f}" y="{top + 10}" font-size="10" fill="{LIMIT_COLOR}">{esc(lim.text)}</text>'
    )


def _scatter_legend(y: float, marked: bool, limited: bool) -> str:
    parts = [
        f'<circle cx="70" cy="{y - 4}" r="4" fill="{PALETTE[0]}"/><text x="78" y="{y}" font-size="10">trial</text>'
    ]
    if marked:
        parts.append(
            f'<circle cx="130" cy="{y - 4}" r="6" fill="{LIMIT_COLOR}"/>'
            f'<text x="140" y="{y}" font-size="10">shipped</text>'
        )
    if limited:
        parts.append(
            f'<line x1="210" y1="{y - 4}" x2="234" y2="{y - 4}" stroke="{LIMIT_COLOR}" '
            f'stroke-dasharray="5,3"/><text x="240" y="{y}" font-size="10">gate limit</text>'
        )
    return "".join(parts)
