"""Sample data and observers shared by the range-method tests: seeded distributions and the two-pass histograms."""

from __future__ import annotations

import numpy as np

from calibrators.activations.histogram import Histogram, HistogramObserver
from calibrators.activations.minmax import MinMaxObserver


def observe(x: np.ndarray, kind: str = "both", pieces: int = 7, bins: int = 2048) -> HistogramObserver:
    """The two passes over ``x`` split into uneven batches: min/max, then fixed-range histograms."""
    rng = np.random.default_rng(x.size)
    cuts = np.sort(rng.choice(np.arange(1, x.size), pieces - 1, replace=False))
    batches = np.split(x, cuts)
    minmax = MinMaxObserver()
    for batch in batches:
        minmax.update("t", batch)
    observer = HistogramObserver(minmax.ranges(), {"t": kind}, bins=bins)
    for batch in batches:
        observer.update("t", batch)
    return observer


def abs_hist(x: np.ndarray) -> Histogram:
    return observe(x, "abs").abs_histograms()["t"]


RNG = np.random.default_rng(20240531)
N_ORT = 200_000
DISTRIBUTIONS = {
    "gaussian": RNG.standard_normal(N_ORT).astype(np.float32),
    "uniform": RNG.uniform(-2.0, 3.0, N_ORT).astype(np.float32),
    "relu": np.maximum(RNG.standard_normal(N_ORT), 0).astype(np.float32),  # half the values exactly 0
    "heavy_tailed": RNG.standard_t(1.5, N_ORT).astype(np.float32),
}
