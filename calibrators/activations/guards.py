"""Calibration guards: a clipping range method may not clip a material share of a tensor's values.

Entropy, percentile and mse clip by design: they trade the rare outlier for resolution where the mass is. On a
tensor with few distinct levels (an image with 17 grey levels, a one-hot or mask input) the same search can
clip half the values; entropy on such an input lost 90 top-1 points where min/max lost none. A graph input is
the model's data as given, and a range that clips it rewrites the data, so inputs always take min/max.
"""

from __future__ import annotations

import numpy as np

from calibrators.activations.histogram import Histogram

CLIPPING_METHODS = ("entropy", "percentile", "mse")
# The share of a tensor's values a clipping method may clip before the guard falls back to min/max. Entropy and
# mse typically clip 0.001-0.1% of a continuous activation; clipping 1% or more is not an outlier trade-off.
MAX_CLIPPED_FRACTION = 0.01


def clipped_fraction(hist: Histogram | None, chosen: tuple[float, float]) -> float | None:
    """The share of the histogram's values outside ``chosen`` (beyond its magnitude for an |x| histogram)."""
    if hist is None or hist.counts.sum() == 0:
        return None
    centers = (hist.edges[:-1] + hist.edges[1:]) / 2
    low, high = chosen
    if hist.edges[0] < 0:  # a signed histogram: clipped means outside [low, high]
        clipped = hist.counts[(centers < low) | (centers > high)].sum()
    else:  # an |x| histogram: clipped means beyond the symmetric threshold
        clipped = hist.counts[centers > max(abs(low), abs(high))].sum()
    return float(clipped) / float(hist.counts.sum())


def guard_reason(method: str, is_input: bool, hist: Histogram | None, chosen: tuple[float, float]) -> str | None:
    """Why ``method``'s range must give way to min/max for this tensor, or None when it may stand."""
    if method not in CLIPPING_METHODS:
        return None
    if is_input:
        return f"graph input: {method} would clip the model's own data; min/max used"
    fraction = clipped_fraction(hist, chosen)
    if fraction is not None and fraction >= MAX_CLIPPED_FRACTION:
        levels = int(np.count_nonzero(hist.counts)) if hist is not None else 0
        return (
            f"{method} clipped {fraction:.1%} of the values ({levels} non-empty histogram bins: few distinct "
            f"levels or a heavy mass at the edge); min/max used"
        )
    return None
