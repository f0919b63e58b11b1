"""The calibration part of the report: per-tensor ranges in build.json and a plot of the widest histograms."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from calibrators.activations.guards import clipped_fraction
from calibrators.activations.histogram import Histogram
from dopt_common.deps import require

DISPLAY_BINS = 256  # the most bins a histogram is drawn with


def widest(ranges: Mapping[str, tuple[float, float]], count: int = 8) -> list[str]:
    """The ``count`` tensors with the largest absolute range (where outliers usually live)."""
    return sorted(ranges, key=lambda n: -max(abs(ranges[n][0]), abs(ranges[n][1])))[:count]


def plotted_tensors(hists: Mapping[str, Histogram], quantized: Collection[str], count: int = 8) -> list[str]:
    """The ``count`` widest quantized activations with a histogram: a tensor left in float has no threshold."""
    return widest({n: (h.low, h.high) for n, h in hists.items() if n in quantized}, count)


def tensor_summary(
    method: str, observed: tuple[float, float], chosen: tuple[float, float], hist: Histogram | None
) -> dict[str, Any]:
    """One tensor's calibration facts: observed and chosen range, and the share of values the choice clips."""
    entry: dict[str, Any] = {"method": method, "observed": list(observed), "range": list(chosen)}
    if hist is None or hist.counts.sum() == 0:
        return entry
    entry["histogram"] = {
        "bins": int(hist.counts.size),
        "nonzero_bins": int(np.count_nonzero(hist.counts)),
        "clipped_fraction": clipped_fraction(hist, chosen),
    }
    return entry


def histogram_figure(
    hists: Mapping[str, Histogram],
    chosen: Mapping[str, tuple[float, float]],
    methods: Mapping[str, str],
    quantized: Collection[str],
) -> Any:
    """The widest quantized activations' |x| histograms (log counts), the chosen threshold and the observed maximum."""
    matplotlib = require("matplotlib", purpose="the calibration plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    names = plotted_tensors(hists, quantized)
    cols = 2
    rows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        hist = hists[name]
        counts, edges = display_bins(hist)
        centers = (edges[:-1] + edges[1:]) / 2
        ax.fill_between(
            centers, np.maximum(counts, 0.8), 0.8, step="mid", color="#4c72b0", alpha=0.8, label="calibration |x|"
        )
        ax.set_yscale("log")
        threshold = max(abs(chosen[name][0]), abs(chosen[name][1]))
        observed = max(abs(hist.low), abs(hist.high))
        ax.axvline(threshold, color="#c44e52", lw=1.5, label=f"{methods[name]} threshold {threshold:.3g}")
        ax.axvline(observed, color="#555555", lw=1, ls="--", label=f"observed max {observed:.3g}")
        # A fixed title height and no minor log ticks: placing the title by the axis's measured extent and drawing
        # ~70 minor ticks an axis took most of the plot's second.
        ax.set_title(name if len(name) <= 60 else "…" + name[-59:], fontsize=9, y=1.0)
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.set_xlabel("|x|", fontsize=8)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper right")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if not names:
        axes.flat[0].text(0.5, 0.5, "no quantized activation to show", ha="center", va="center")
    fig.suptitle(
        f"Calibration: the {len(names)} widest quantized activations, |x| histograms and chosen thresholds", fontsize=11
    )
    # Fixed margins, in inches, for the fixed fonts: tight_layout measured every text, most of the figure's 0.7 s.
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.75 / height, bottom=0.5 / height, wspace=0.22, hspace=0.6)
    return fig


def display_bins(hist: Histogram, most: int = DISPLAY_BINS) -> tuple[np.ndarray, np.ndarray]:
    """The histogram's counts and edges with neighbouring bins summed into at most ``most`` (a 2,048-bin
    histogram on a 450-pixel axis draws the same picture from 256 bins, in an eighth of the time)."""
    group = -(-hist.counts.size // most)
    if group <= 1:
        return hist.counts, hist.edges
    padded = np.zeros(group * -(-hist.counts.size // group), hist.counts.dtype)
    padded[: hist.counts.size] = hist.counts
    edges = hist.edges[::group]
    if edges[-1] != hist.edges[-1]:
        edges = np.append(edges, hist.edges[-1])
    return padded.reshape(-1, group).sum(axis=1), edges
