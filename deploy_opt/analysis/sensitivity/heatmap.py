"""The sensitivity report: a per-node heatmap PNG and one self-contained, sortable HTML page."""

from __future__ import annotations

import base64
import html
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.analysis.sensitivity.analyze import proxy_key
from dopt_common.deps import require
from dopt_common.files import save_png, write_text

log = logging.getLogger(__name__)

COLUMNS = ("both (a)", "weight only", "activation only", "all but this (c)", "proxy SQNR dB")
DROP_KEYS = ("drop_both", "drop_weight_only", "drop_activation_only", "recovered_all_but")
ROW_IN = 0.22  # inches per node row
CELL_IN = 0.6  # inches per heatmap column
SPLIT_ABOVE = 150  # more rows than this: several side-by-side panels
PANEL_ROWS = 100  # at most this many rows per panel once split
PANELS_ACROSS = 3  # panels per band; further bands are stacked below (one tall PNG)
ANNOTATE_UPTO = 80
LABEL_CHARS = 56
MISSING = "#d9d9d9"
HEAD_IN, COLHEAD_IN, GAP_IN = 1.3, 0.75, 0.3  # title + colour bars; rotated column labels; below a band


def number(value: Any) -> float | None:
    """A finite float, or None for a missing, non-numeric or non-finite value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def shorten(name: str, width: int = LABEL_CHARS) -> str:
    """``name`` cut from the left with "…" so that its informative end stays."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _label(node: Mapping[str, Any]) -> str:
    """The PyTorch module beside the ONNX name when the export recorded it, else the ONNX name."""
    name = str(node.get("name", "?"))
    return f"{node['module']} · {name}" if node.get("module") else name


def sig2(value: float) -> str:
    """A value to two significant digits (whole numbers from 100 up)."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2g}"


def graph_order(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The result's nodes in graph order (by ``order``, else as listed)."""
    nodes = list(result.get("nodes") or [])
    return [n for _, n in sorted(enumerate(nodes), key=lambda p: (number(p[1].get("order")) or 0.0, p[0]))]


def cell_matrix(nodes: list[dict[str, Any]]) -> np.ndarray:
    """Rows x 5 floats: the four drop/recovered columns and proxy SQNR; NaN where not evaluated."""
    rows = [[number(n.get(k)) for k in DROP_KEYS] + [number(proxy_key(n.get("proxy") or {}))] for n in nodes]
    return np.array([[math.nan if v is None else v for v in r] for r in rows], dtype=float).reshape(len(nodes), 5)


def write_heatmap(result: Mapping[str, Any], path: Path) -> Path:
    """Render the per-node heatmap (drops in one colour scale, proxy SQNR in its own) as a PNG."""
    matplotlib = require("matplotlib", purpose="the sensitivity heatmap")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors
    from matplotlib.cm import ScalarMappable

    nodes = graph_order(result)
    data, count = cell_matrix(nodes), len(nodes)
    labels = [f"{shorten(_label(n))} ({n.get('op_type', '?')})" for n in nodes]
    metric = str((result.get("metric") or {}).get("name", "metric"))
    panels = 1 if count <= SPLIT_ABOVE else math.ceil(count / PANEL_ROWS)
    per = max(1, math.ceil(count / panels))
    bands = math.ceil(panels / PANELS_ACROSS)
    across = math.ceil(panels / bands)  # balanced bands: 4 panels are 2 + 2, not 3 + 1
    label_in = 0.25 + 0.055 * max((len(text) for text in labels), default=12)
    panel_in = label_in + 5 * CELL_IN + 0.3
    band_in = COLHEAD_IN + per * ROW_IN + GAP_IN
    width, height = max(8.0, across * panel_in + 0.3), HEAD_IN + max(bands * band_in, 1.0) + 0.2
    fig = plt.figure(figsize=(width, height))

    drops = data[:, :4][np.isfinite(data[:, :4])]
    top = float(drops.max()) if drops.size and drops.max() > 0 else 1.0
    drop_norm = colors.PowerNorm(0.5, vmin=0.0, vmax=top, clip=True)
    sqnr = data[:, 4][np.isfinite(data[:, 4])]
    low, high = (float(sqnr.min()), float(sqnr.max())) if sqnr.size else (0.0, 1.0)
    pad = 0.5 if high - low < 1e-9 else 0.0
    sqnr_norm = colors.Normalize(vmin=low - pad, vmax=high + pad)
    drop_cmap = matplotlib.colormaps["Reds"].with_extremes(bad=(0, 0, 0, 0))
    sqnr_cmap = matplotlib.colormaps["Blues_r"].with_extremes(bad=(0, 0, 0, 0))

    title = f"{result.get('model', '?')}: per-node INT8 sensitivity ({metric} drop, points)"
    fig.text(0.5, 1 - 0.25 / height, title, ha="center", va="center", fontsize=11, weight="bold")
    note = "grey = not evaluated; (a) drop with only this node INT8; (c) points recovered keeping only this node FP"
    samples = (result.get("metric") or {}).get("subset_samples")
    if samples is not None:
        note += f"; exact drops on {samples} samples"
    fig.text(0.5, 1 - 0.5 / height, note, ha="center", va="center", fontsize=7, color="#444444")
    bar_w = min(3.2, (width - 1.6) / 2)
    for x_in, norm, cmap, label in (
        (0.6, drop_norm, drop_cmap, f"{metric} drop (points)  [(c): recovered points]"),
        (width / 2 + 0.4, sqnr_norm, sqnr_cmap, "proxy SQNR (dB), dark = low = bad"),
    ):
        cax = fig.add_axes((x_in / width, 1 - 0.95 / height, bar_w / width, 0.16 / height))
        extend = "min" if norm is drop_norm and drops.size and drops.min() < 0 else "neither"
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal", extend=extend)
        bar.set_label(label, fontsize=8)
        if norm is drop_norm:  # the scale is square-root: place ticks evenly along it, not crowded at the top
            bar.set_ticks([float(sig2(top * f * f)) for f in np.linspace(0, 1, 5)])
        bar.ax.tick_params(labelsize=7)
    if not count:
        fig.text(0.5, 0.3, "no nodes to show", ha="center", fontsize=10)

    for panel in range(panels):
        lo, hi = panel * per, min(count, (panel + 1) * per)
        if lo >= hi:
            break
        column, band = panel % across, panel // across
        top_in = HEAD_IN + band * band_in + COLHEAD_IN
        rect = ((column * panel_in + label_in + 0.15) / width, 1 - (top_in + (hi - lo) * ROW_IN) / height)
        ax = fig.add_axes((*rect, 5 * CELL_IN / width, (hi - lo) * ROW_IN / height))
        scales = ((drop_cmap, drop_norm), (sqnr_cmap, sqnr_norm))
        _draw_panel(ax, data[lo:hi], labels[lo:hi], scales, annotate=count <= ANNOTATE_UPTO)
    dpi = min(110.0, 60000.0 / height)
    save_png(fig, path, dpi=dpi)
    log.info("wrote the sensitivity heatmap (%d nodes, %d panel(s)) to %s", count, panels, path)
    return Path(path)


def _draw_panel(ax: Any, rows: np.ndarray, labels: list[str], scales: tuple, annotate: bool) -> None:
    """One panel of the heatmap: the four drop columns in the first colour scale, the SQNR column in the second."""
    (drop_cmap, drop_norm), (sqnr_cmap, sqnr_norm) = scales
    ax.set_facecolor(MISSING)
    block = np.ma.masked_invalid(rows)
    for cmap, norm, hidden in ((drop_cmap, drop_norm, [4]), (sqnr_cmap, sqnr_norm, [0, 1, 2, 3])):
        part = block.copy()
        part[:, hidden] = np.ma.masked  # each colour scale draws only its own columns
        ax.imshow(part, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(5), COLUMNS, fontsize=7, rotation=35, ha="left", rotation_mode="anchor")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.xaxis.tick_top()
    ax.set_xticks(np.arange(-0.5, 5), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.tick_params(which="minor", length=0)
    ax.axvline(3.5, color="white", lw=3)
    if not annotate:
        return
    for (row, col), value in np.ndenumerate(rows):
        if math.isfinite(value):
            norm, cmap = (drop_norm, drop_cmap) if col < 4 else (sqnr_norm, sqnr_cmap)
            r, g, b, _ = cmap(float(norm(value)))
            ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
            ax.text(col, row, sig2(value), ha="center", va="center", fontsize=6, color=ink)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em}
.facts{margin:.2em 0 1em;color:#444}
.warn{color:#8a3b00;font-weight:600}
.plot{overflow:auto;max-height:80vh;border:1px solid #ddd;margin-bottom:1em}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}
td.s,th[data-type=str]{text-align:left}
td.s{white-space:nowrap}
td.n{white-space:normal;overflow-wrap:anywhere;min-width:18em;max-width:40em}
th{background:#f2f2f2;cursor:pointer;position:sticky;top:0;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#fafafa}
"""

_JS = """
(function () {
  "use strict";
  var table = document.getElementById("nodes");
  var body = table.tBodies[0];
  var heads = table.tHead.rows[0].cells;
  var state = {col: -1, dir: 1};
  function sortBy(col) {
    var numeric = heads[col].getAttribute("data-type") === "num";
    state.dir = state.col === col ? -state.dir : 1;
    state.col = col;
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].getAttribute("data-v"), y = b.cells[col].getAttribute("data-v");
      if (x === "" || y === "") { return (x === "" ? 1 : 0) - (y === "" ? 1 : 0); }
      var c = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
      return c * state.dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    for (var i = 0; i < heads.length; i++) {
      heads[i].setAttribute("aria-sort", i === col ? (state.dir > 0 ? "ascending" : "descending") : "none");
    }
  }
  Array.prototype.forEach.call(heads, function (th, i) {
    th.addEventListener("click", function () { sortBy(i); });
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortBy(i); } });
  });
  if (window.location.hash === "#selftest") {
    var both = table.querySelector('th[data-key="drop_both"]');
    both.click();
    both.click();
    document.body.dataset.sorted = body.rows.length ? body.rows[0].cells[0].textContent : "";
  }
  document.body.dataset.ready = "1";
})();
"""


def _cell(value: float | None, spec: str = ".3g", text: str | None = None) -> str:
    """A numeric table cell whose ``data-v`` drives the sort; "–" (sorted last) when missing."""
    if value is None:
        return '<td data-v="">–</td>'
    return f'<td data-v="{value!r}">{html.escape(text if text is not None else format(value, spec))}</td>'


def _row(node: Mapping[str, Any]) -> str:
    """One table row for a node."""
    proxy = node.get("proxy") or {}
    shape = node.get("weight_shape")
    dims = [number(d) for d in shape] if isinstance(shape, list | tuple) and shape else []
    size = float(np.prod(dims)) if dims and None not in dims else None
    share = number(node.get("mac_share"))
    name, op = html.escape(str(node.get("name", "?"))), html.escape(str(node.get("op_type", "?")))
    module = html.escape(str(node.get("module") or ""))
    cells = [
        _cell(number(node.get("rank")), "g"),
        f'<td class="s n" data-v="{name}">{name}</td>',
        f'<td class="s n" data-v="{module}">{module or "–"}</td>',
        f'<td class="s" data-v="{op}">{op}</td>',
        _cell(size, text="×".join(f"{d:g}" for d in dims if d is not None)),
        _cell(None if share is None else share * 100, ".2f"),
        *(_cell(number(node.get(key))) for key in DROP_KEYS),
        _cell(number(proxy.get("propagated_sqnr_db")), ".1f"),
        _cell(number(proxy.get("predicted_drop"))),
        _cell(number(proxy.get("local_sqnr_db")), ".1f"),
        _cell(number(proxy.get("sqnr_db")), ".1f"),
        _cell(number(proxy.get("cosine")), ".4f"),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


_HEADERS = (
    ("rank", "num", "rank"),
    ("node", "str", "name"),
    ("PyTorch module", "str", "module"),
    ("op", "str", "op_type"),
    ("weight shape", "num", "weight_shape"),
    ("share of MACs (%)", "num", "mac_share"),
    ("drop both", "num", "drop_both"),
    ("weight-only", "num", "drop_weight_only"),
    ("activation-only", "num", "drop_activation_only"),
    ("recovered (all-but)", "num", "recovered_all_but"),
    ("propagated SQNR dB (proxy)", "num", "propagated_sqnr_db"),
    ("predicted drop", "num", "predicted_drop"),
    ("local SQNR dB", "num", "local_sqnr_db"),
    ("output SQNR dB", "num", "sqnr_db"),
    ("output cosine", "num", "cosine"),
)


def _figures(scores: Mapping[str, Any], fp32: str, int8: str) -> str | None:
    """``FP32 97.556 → INT8 97.333`` from two keys of ``scores``, or None when either is missing."""
    a, b = number(scores.get(fp32)), number(scores.get(int8))
    return None if a is None or b is None else f"FP32 <b>{a:.3f}</b> &rarr; INT8 <b>{b:.3f}</b>"


def _scores(result: Mapping[str, Any]) -> str:
    """Which FP32/INT8 figures are which: the build's (as build.json has them) and the exact drops' subset, and
    how finely that subset resolves the metric."""
    esc, metric = html.escape, result.get("metric") or {}
    build, resolution = result.get("build") or {}, result.get("resolution") or {}
    built = _figures(build, "ort_fp32", "ort_int8")
    facts = []
    if built is not None:
        facts.append(
            f"The build: {built} on its {esc(str(build.get('samples', '?')))} evaluation samples (against "
            f"{esc(str(build.get('reference') or '?'))}), the figures build.json reports."
        )
    facts.append(
        f"The exact drops below{'' if built else ' (not build.json figures)'} are measured on a seeded subset of "
        f"{esc(str(metric.get('subset_samples', '?')))} samples: there {_figures(metric, 'fp32', 'int8') or '?'}."
    )
    page = f'<p class="facts">{" ".join(facts)}</p>'
    if resolution.get("text"):
        kind = "facts warn" if resolution.get("coarser_than_gate") else "facts"
        page += f'\n<p class="{kind}">Resolution: {esc(str(resolution["text"]))}.</p>'
    return page


def write_html(result: Mapping[str, Any], png: Path, path: Path) -> Path:
    """Write one self-contained HTML page: facts, the embedded heatmap and a sortable per-node table."""
    metric = result.get("metric") or {}
    esc = html.escape
    model, name = esc(str(result.get("model", "?"))), esc(str(metric.get("name", "metric")))
    direction = "higher is better" if metric.get("higher_is_better", True) else "lower is better"
    mode = esc(str(result.get("mode", "?")))
    if result.get("top_k") is not None:
        mode += f" (top {esc(str(result['top_k']))})"
    timings = ", ".join(
        f"{esc(str(k))} {v:.1f} s" for k, v in (result.get("timings_s") or {}).items() if number(v) is not None
    )
    timings = f" &middot; timings {timings}" if timings else ""
    image = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    heads = "".join(
        f'<th data-type="{kind}" data-key="{key}" tabindex="0" aria-sort="none">{esc(label)}</th>'
        for label, kind, key in _HEADERS
    )
    rows = "\n".join(_row(node) for node in graph_order(result))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{model}: INT8 sensitivity</title>
<style>{_CSS}</style></head>
<body>
<h1>{model}: per-node INT8 sensitivity</h1>
<p class="facts">Metric <b>{name}</b> ({direction}) &middot; mode <b>{mode}</b>{timings}.</p>
{_scores(result)}
<p class="facts">Drops are in metric points (positive = worse); &ldquo;recovered&rdquo; is the points regained when
every node except this one is quantized; &ndash; = not evaluated exactly.</p>
<div class="plot"><img alt="per-node sensitivity heatmap" src="data:image/png;base64,{image}"></div>
<table id="nodes"><thead><tr>{heads}</tr></thead>
<tbody>
{rows}
</tbody></table>
<script>{_JS}</script>
</body></html>
"""
    write_text(path, page)
    log.info("wrote the sensitivity page (%d nodes) to %s", len(result.get("nodes") or []), path)
    return Path(path)
