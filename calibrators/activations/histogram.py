"""Fixed-range histograms (pass 2): memory holds ``bins`` counts per tensor, whatever the sample count.

The edges come from the pass-1 (min, max), so counts are additive across batches and equal one
``np.histogram`` of all the data at once: that is what ONNX Runtime's ``HistogramCalibrater`` builds after
holding every activation in memory. Values are binned as float32 (the activation dtype of the models we
calibrate; float16 converts exactly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dopt_common.errors import CalibrationError, ConfigError, NumericsError

KINDS = ("signed", "abs", "both")
BLOCK = 65536
# The fast binning trusts its arithmetic bin index unless it lies within NEAR of a bin boundary. In bin units
# the float32 index is within 4 * 2**-24 * bins of exact and each edge within 2**-24 * bins * (1 + 2 * M / span)
# (M = max(|first|, |last|)), so with bins <= MAX_FAST_BINS and span >= M * bins / MAX_FAST_BINS the total stays
# under 3e-3 bins and 1/64 leaves a wide margin; the rest (about 3% of values) get numpy's own edge comparisons.
NEAR = np.float32(1.0 / 64.0)
MAX_FAST_BINS = 8192
# Outside these magnitudes float32 rounding is no longer relative (subnormals) or the span overflows.
FAST_MAGNITUDE = (1e-30, 1e37)


@dataclass(frozen=True, eq=False)
class Histogram:
    """Counts of one tensor over fixed edges; ``low``/``high`` are its pass-1 min and max."""

    counts: np.ndarray
    edges: np.ndarray
    low: float
    high: float


def histogram_edges(first: float, last: float, bins: int) -> np.ndarray:
    """Exactly the edges ``np.histogram`` uses for float32 data over ``range=(float32(first), float32(last))``."""
    first32, last32 = np.float32(first), np.float32(last)
    try:
        return np.histogram(np.empty(0, np.float32), bins, range=(first32, last32))[1]
    except ValueError as exc:
        raise CalibrationError(f"cannot make {bins} histogram bins over [{first}, {last}]: {exc}") from exc


def bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """int64 counts of float32 ``values`` over uniform ``edges`` from :func:`histogram_edges`.

    Identical to ``np.histogram(np.clip(values, edges[0], edges[-1]), len(edges) - 1, range=(edges[0],
    edges[-1]))``: values outside the edges land in the first or last bin instead of being dropped.
    ``values`` must be finite.
    """
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    bins = edges.size - 1
    first, last = edges[0], edges[-1]
    counts = np.zeros(bins, np.int64)
    magnitude, span = float(max(abs(first), abs(last))), float(last) - float(first)
    fast = FAST_MAGNITUDE[0] <= magnitude <= FAST_MAGNITUDE[1] and span * MAX_FAST_BINS >= magnitude * bins
    if not (fast and bins <= MAX_FAST_BINS):
        counts += np.histogram(np.clip(flat, first, last), bins, range=(first, last))[0]
        return counts
    scratch = _Scratch(min(BLOCK, flat.size))
    for start in range(0, flat.size, BLOCK):
        block = flat[start : start + BLOCK]
        clipped = scratch.values[: block.size]
        np.clip(block, first, last, out=clipped)
        counts += np.bincount(_bin_index(clipped, edges, scratch), minlength=bins)
    return counts


class _Scratch:
    """Reusable per-block buffers of the fast binning."""

    def __init__(self, size: int) -> None:
        self.values = np.empty(size, np.float32)
        self.coord = np.empty(size, np.float32)
        self.whole = np.empty(size, np.float32)
        self.index = np.empty(size, np.int32)
        self.near = np.empty(size, bool)
        self.far = np.empty(size, bool)


def _bin_index(x: np.ndarray, edges: np.ndarray, scratch: _Scratch) -> np.ndarray:
    """numpy's uniform-bin index of each in-range float32 value of ``x`` (int32, a view of scratch)."""
    n, bins = x.size, edges.size - 1
    first = edges[0]
    denom = np.subtract(edges[-1], first, dtype=np.float32)
    coord, whole, index = scratch.coord[:n], scratch.whole[:n], scratch.index[:n]
    near, far = scratch.near[:n], scratch.far[:n]
    # The same float32 operations, in the same order, as np.histogram: ((x - first) / denom) * bins.
    np.subtract(x, first, out=coord)
    coord /= denom
    coord *= bins
    np.floor(coord, out=whole)
    index[...] = whole
    coord -= whole  # the fractional part, exactly
    np.less(coord, NEAR, out=near)
    np.greater(coord, np.float32(1) - NEAR, out=far)
    near |= far
    spots = np.flatnonzero(near)
    if spots.size:
        # numpy's own correction, on numpy's own starting index, for values close to a boundary.
        value = x[spots]
        fixed = index[spots].astype(np.intp)
        fixed[fixed == bins] -= 1
        fixed[value < edges[fixed]] -= 1
        fixed[(value >= edges[fixed + 1]) & (fixed != bins - 1)] += 1
        index[spots] = fixed
    return index


class HistogramObserver:
    """Accumulates fixed-edge histograms of raw values (``signed``), of |x| (``abs``) or ``both``."""

    method = "histogram"

    def __init__(
        self,
        ranges: Mapping[str, tuple[float, float]],
        kinds: Mapping[str, str],
        bins: int = 2048,
        abs_floors: Mapping[str, float] | None = None,
    ) -> None:
        if not isinstance(bins, int) or bins < 1:
            raise ConfigError(f"histogram bins must be a positive integer, got {bins!r}")
        self.bins = bins
        self._range: dict[str, tuple[float, float]] = {}
        self._signed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._abs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._seen: set[str] = set()
        for name, kind in kinds.items():
            if kind not in KINDS:
                raise ConfigError(f"histogram kind '{kind}' of tensor '{name}' is unknown; use one of {KINDS}")
            if name not in ranges:
                raise CalibrationError(f"tensor '{name}' has no pass-1 range; collect its min/max first")
            low, high = (float(v) for v in ranges[name])
            threshold = np.float32(max(abs(low), abs(high)))
            if not np.isfinite(threshold):
                raise NumericsError(f"calibration: tensor '{name}' range [{low}, {high}] is not finite in float32")
            self._range[name] = (low, high)
            if kind in ("signed", "both"):
                self._signed[name] = (np.zeros(bins, np.int64), histogram_edges(-threshold, threshold, bins))
            if kind in ("abs", "both"):
                floor = (abs_floors or {}).get(name, 0.0)  # ORT's symmetric percentile starts at min |x|
                self._abs[name] = (np.zeros(bins, np.int64), histogram_edges(floor, threshold, bins))

    def update(self, name: str, values: np.ndarray, where: str = "") -> None:
        """Add one batch of a tensor to its histograms; NaN or Inf is an error naming the tensor.

        Values outside the pass-1 range (possible only if pass 2 saw other data) are clipped into the edge
        bins rather than dropped, so every value is counted.
        """
        if name not in self._range:
            return
        values = np.asarray(values, dtype=np.float32)
        if values.size == 0:
            return
        if not np.isfinite(values).all():
            raise NumericsError(f"calibration: tensor '{name}' has NaN or Inf {where}; fix the model or the input data")
        if name in self._signed:
            counts, edges = self._signed[name]
            counts += bin_counts(values, edges)
        if name in self._abs:
            counts, edges = self._abs[name]
            counts += bin_counts(np.abs(values), edges)
        self._seen.add(name)

    def histograms(self, kind: str = "signed") -> dict[str, Histogram]:
        """The ``signed`` or ``abs`` histogram of every tensor that has one (copies)."""
        if kind not in ("signed", "abs"):
            raise ConfigError(f"histogram kind '{kind}' is unknown; use 'signed' or 'abs'")
        store = self._signed if kind == "signed" else self._abs
        missing = sorted(set(store) - self._seen)
        if missing:
            shown = ", ".join(f"'{m}'" for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise CalibrationError(f"histogram pass saw no data for {len(missing)} tensor(s): {shown}")
        return {
            name: Histogram(counts.copy(), edges.copy(), *self._range[name]) for name, (counts, edges) in store.items()
        }

    def signed_histograms(self) -> dict[str, Histogram]:
        """Histograms of raw values over [-t, t], t = max(|min|, |max|) (ORT's binning)."""
        return self.histograms("signed")

    def abs_histograms(self) -> dict[str, Histogram]:
        """Histograms of |x| over [0, t] (TensorRT's binning)."""
        return self.histograms("abs")

    def nbytes(self) -> int:
        """Bytes held by the counts and edges; fixed at construction."""
        return sum(c.nbytes + e.nbytes for c, e in [*self._signed.values(), *self._abs.values()])
