"""Range methods: pure functions from a pass-2 histogram to the range that goes into the scale file.

``percentile`` reproduces ONNX Runtime's ``HistogramCollector`` (signed histogram); ``entropy`` is TensorRT's
EntropyCalibration2 as in NVIDIA pytorch-quantization and ``mse`` minimises the int8 quantize-dequantize error,
both on |x| histograms.
"""

from __future__ import annotations

import functools

import numpy as np

from calibrators.activations.histogram import Histogram
from dopt_common.errors import CalibrationError, ConfigError

METHODS = ("minmax", "percentile", "entropy", "mse")
# The histogram each method reads; minmax needs none (the pass-1 range is final).
HISTOGRAM_KIND: dict[str, str | None] = {"minmax": None, "percentile": "signed", "entropy": "abs", "mse": "abs"}


def histogram_kind(method: str, symmetric: bool = False) -> str | None:
    """``signed``, ``abs`` or None (minmax): the histogram ``method`` needs; an unknown method is an error.

    Percentile follows the activation scheme, as ORT's two modes do: symmetric takes the p-th percentile of
    |x| (one threshold), asymmetric cuts (100 - p)/2 % off each tail of the signed values.
    """
    if method not in HISTOGRAM_KIND:
        raise ConfigError(f"calibration method '{method}' is unknown; use one of {', '.join(METHODS)}")
    if method == "percentile" and symmetric:
        return "abs"
    return HISTOGRAM_KIND[method]


def percentile_range(hist: Histogram, percentile: float = 99.99) -> tuple[float, float]:
    """ORT's ``HistogramCollector.compute_percentile`` (symmetric=False): cut (100 - p)/2 % off each tail."""
    if not 0.0 < percentile <= 100.0:
        raise ConfigError(f"percentile {percentile!r} is invalid; it must be in (0, 100]")
    counts = hist.counts
    total = counts.sum()
    if total <= 0:
        raise CalibrationError("percentile: the histogram is empty")
    cdf = np.cumsum(counts / total)
    cut = (100.0 - percentile) / 200.0
    left = hist.edges[np.searchsorted(cdf, cut)]
    right = hist.edges[np.searchsorted(cdf, 1.0 - cut)]
    # ORT clamps each side separately, comparing the float32 edge with the float32 min/max.
    return (float(max(left, np.float32(hist.low))), float(min(right, np.float32(hist.high))))


def symmetric_percentile_range(hist_abs: Histogram, percentile: float = 99.99) -> tuple[float, float]:
    """ORT's ``compute_percentile`` with symmetric=True (its default): the p-th percentile of |x| as ±amax.

    The |x| histogram must span [min |x|, max |x|] as ORT's does; the result is clamped to the observed range.
    """
    if not 0.0 < percentile <= 100.0:
        raise ConfigError(f"percentile {percentile!r} is invalid; it must be in (0, 100]")
    total = hist_abs.counts.sum()
    if total <= 0:
        raise CalibrationError("percentile: the histogram is empty")
    cdf = np.cumsum(hist_abs.counts / total)
    amax = hist_abs.edges[np.searchsorted(cdf, percentile / 100.0)]
    return (float(max(-amax, np.float32(hist_abs.low))), float(min(amax, np.float32(hist_abs.high))))


def entropy_amax(hist_abs: Histogram, num_quantized_bins: int = 128, start_bin: int = 128) -> float:
    """TensorRT EntropyCalibration2 (pytorch-quantization ``_compute_amax_entropy``): the KL-optimal |x| cut.

    For each candidate i in [start_bin, bins] the reference p is bins[:i] with the outliers sum(bins[i:]) added
    to its last bin, and q merges p's bins into ``num_quantized_bins`` groups (bin j in group j*nbins//i) and
    spreads each group's mass evenly over its nonzero bins. All candidates are evaluated at once from prefix
    sums: within a group every nonzero bin has the same q, so KL(p||q) * total is

        sum_j b_j log b_j - sum_g S_g log(S_g / C_g) + M log(M / total)      (b: counts, j < i)

    with S_g, C_g the group's mass and nonzero-bin count and M = sum(b[:i]), plus a correction for the last bin,
    whose p also holds the outliers O: (b + O) log(b + O) - b log b + O log(C M / (total S)), S and C of its
    group; KL is infinite when O > 0 lands on an empty last bin. The last minimum wins (ties: larger amax).
    Unlike pytorch-quantization, a candidate with no mass below it has KL = inf rather than NaN.
    """
    edges, counts = _abs_histogram(hist_abs, "entropy")
    if counts is None:
        return 0.0
    nbins, n = num_quantized_bins, counts.size
    if not isinstance(nbins, int) or nbins < 1:
        raise ConfigError(f"entropy: num_quantized_bins must be a positive integer, got {nbins!r}")
    if not isinstance(start_bin, int) or not 1 <= start_bin <= n:
        raise ConfigError(f"entropy: start_bin must be an integer in [1, {n}], got {start_bin!r}")
    b = counts.astype(np.int64)  # a copy: the caller's counts stay untouched
    if n > 1:
        b[0] = b[1]  # suppress the spike of exact zeros (ReLU, padding)
    total = int(b.sum())
    if total <= 0:
        raise CalibrationError("entropy: the histogram is empty")
    positive = b > 0
    mass = np.concatenate(([0.0], np.cumsum(b, dtype=np.float64)))  # exact: counts stay far below 2**53
    nonzero = np.concatenate(([0.0], np.cumsum(positive, dtype=np.float64)))
    b_log_b = np.zeros(n)
    b_log_b[positive] = b[positive] * np.log(b[positive])
    sum_b_log_b = np.concatenate(([0.0], np.cumsum(b_log_b)))

    i, bounds, last_group = _entropy_groups(n, nbins, start_bin)
    at = mass[bounds]
    s = at[:, 1:] - at[:, :-1]
    at = nonzero[bounds]
    c = at[:, 1:] - at[:, :-1]
    # S log(S / C), 0 for empty groups (S = C = 0): there S / max(C, 1) = 0 is lifted to a tiny positive value.
    group_log = np.maximum(c, 1.0)
    np.divide(s, group_log, out=group_log)
    np.maximum(group_log, np.finfo(np.float64).tiny, out=group_log)
    np.log(group_log, out=group_log)
    group_log *= s
    inside = mass[i]
    outliers = total - inside
    last = b[i - 1].astype(np.float64)
    rows = np.arange(i.size)
    s_last, c_last = s[rows, last_group], c[rows, last_group]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = sum_b_log_b[i] - group_log.sum(axis=1) + inside * np.log(inside / total)
        spill = (outliers > 0) & (last > 0)
        o, bl, sl, cl, m = outliers[spill], last[spill], s_last[spill], c_last[spill], inside[spill]
        kl[spill] += (bl + o) * np.log(bl + o) - bl * np.log(bl) + o * np.log(cl * m / (total * sl))
    kl /= total
    kl[(outliers > 0) & (last == 0)] = np.inf
    best = kl.size - 1 - int(np.argmin(kl[::-1]))
    return float(edges[start_bin + best])


@functools.lru_cache(maxsize=8)
def _entropy_groups(n: int, nbins: int, start_bin: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates i, the first bin of each of their groups (ceil(g * i / nbins), g = 0..nbins) and the
    group of their last bin; they depend on the shape only, so every tensor shares them."""
    i = np.arange(start_bin, n + 1, dtype=np.int64)
    bounds = (np.arange(nbins + 1, dtype=np.int64)[None, :] * i[:, None] + nbins - 1) // nbins
    last_group = ((i - 1) * nbins) // i
    for array in (i, bounds, last_group):
        array.flags.writeable = False
    return i, bounds, last_group


def mse_amax(hist_abs: Histogram, num_levels: int = 127) -> float:
    """The upper bin edge T minimising sum(count * (c - clip(round(c / s), -L, L) * s)^2), s = T / L, c = center.

    Symmetric int8 (L = 127) quantize-dequantize error over the |x| histogram, in float64, every candidate at
    once; ties go to the larger T. With c >= 0 the level is q(c) = #{q in 1..L : c >= (q - 1/2) s} (at an
    exact midpoint either rounding has the same error), so from tail sums of counts w and w c:

        error = sum w c^2 - 2 s sum_q tail(w c)[(q - 1/2) s] + s^2 sum_q (2q - 1) tail(w)[(q - 1/2) s]
    """
    edges, counts = _abs_histogram(hist_abs, "mse")
    if counts is None:
        return 0.0
    if not isinstance(num_levels, int) or num_levels < 1:
        raise ConfigError(f"mse: num_levels must be a positive integer, got {num_levels!r}")
    wide = edges.astype(np.float64)
    centers = (wide[:-1] + wide[1:]) / 2
    weights = counts.astype(np.float64)
    if not weights.sum() > 0:
        raise CalibrationError("mse: the histogram is empty")
    tail_w = np.concatenate((np.cumsum(weights[::-1])[::-1], [0.0]))  # tail_w[k] = sum(weights[k:])
    tail_wc = np.concatenate((np.cumsum((weights * centers)[::-1])[::-1], [0.0]))
    candidates = wide[1:]
    step = candidates / num_levels
    level = np.arange(1, num_levels + 1, dtype=np.float64)
    first_above = np.searchsorted(centers, (level - 0.5)[None, :] * step[:, None])
    errors = float(np.sum(weights * centers * centers)) - 2 * step * tail_wc[first_above].sum(axis=1)
    errors += step * step * (tail_w[first_above] @ (2 * level - 1))
    best = errors.size - 1 - int(np.argmin(errors[::-1]))
    return float(candidates[best])


def amax_range(amax: float, low: float, high: float) -> tuple[float, float]:
    """A symmetric threshold as a range inside the pass-1 one: a ReLU output stays (0, amax)."""
    return (max(low, -amax), min(high, amax))


def range_for(
    method: str,
    low: float,
    high: float,
    histogram: Histogram | None = None,
    percentile: float = 99.99,
    symmetric: bool = False,
) -> tuple[float, float]:
    """The range of one tensor by ``method``; ``histogram`` is of the kind :func:`histogram_kind` names."""
    kind = histogram_kind(method, symmetric)
    if kind is None:
        return (low, high)
    if histogram is None:
        raise CalibrationError(f"calibration method '{method}' needs the '{kind}' histogram of the tensor; none given")
    if method == "percentile":
        return (
            symmetric_percentile_range(histogram, percentile) if symmetric else percentile_range(histogram, percentile)
        )
    amax = entropy_amax(histogram) if method == "entropy" else mse_amax(histogram)
    return amax_range(amax, low, high)


def _abs_histogram(hist: Histogram, method: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The edges and counts of an |x| histogram; counts None when the tensor is all zeros (amax 0)."""
    if max(abs(hist.low), abs(hist.high)) == 0.0:
        return hist.edges, None
    if hist.edges[0] != 0:
        raise CalibrationError(f"{method}: needs an |x| histogram (edges from 0), got edges from {hist.edges[0]}")
    return hist.edges, hist.counts
