"""The one-pass observer: exact min/max, exact bin merging on range growth, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from calibrators.activations.ranges import entropy_amax, mse_amax
from calibrators.activations.streaming import StreamingObserver
from dopt_common.errors import CalibrationError


def _batches(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Growing scales force several doublings; one batch is all zeros.
    return [rng.normal(0, s, (64, 33)).astype(np.float32) for s in (0.01, 0.5, 0.0, 2.0, 9.0, 1.0)]


def test_ranges_are_exact_and_histogram_counts_every_value() -> None:
    observer = StreamingObserver({"t"}, bins=256)
    batches = _batches()
    for batch in batches:
        observer.update("t", batch)
    data = np.concatenate([b.ravel() for b in batches])
    assert observer.ranges()["t"] == (float(data.min()), float(data.max()))
    hist = observer.abs_histograms()["t"]
    assert hist.counts.sum() == data.size
    assert hist.edges[0] == 0 and hist.edges[-1] >= np.abs(data).max() * (1 - 1e-6)
    assert 256 <= hist.counts.size <= 512  # never coarser than the requested bins over [0, amax]


def test_merging_equals_a_histogram_over_the_final_range() -> None:
    observer = StreamingObserver({"t"}, bins=128)
    batches = _batches(1)
    for batch in batches:
        observer.update("t", batch)
    hist = observer.abs_histograms()["t"]
    magnitude = np.abs(np.concatenate([b.ravel() for b in batches])).astype(np.float64)
    width = float(hist.edges[1] - hist.edges[0])
    expected = np.bincount(
        np.minimum((magnitude / width).astype(np.int64), hist.counts.size - 1), minlength=hist.counts.size
    )
    # Identical up to values within float32 rounding of a bin boundary.
    assert np.abs(hist.counts - expected).sum() <= 2 * 1e-4 * magnitude.size


def test_memory_does_not_grow_with_samples() -> None:
    observer = StreamingObserver({"a", "b"}, bins=512)
    rng = np.random.default_rng(2)
    observer.update("a", rng.normal(0, 1, 1000).astype(np.float32))
    observer.update("b", rng.normal(0, 1, 1000).astype(np.float32))
    size = observer.nbytes()
    for scale in np.geomspace(0.5, 50, 40):
        observer.update("a", rng.normal(0, scale, 5000).astype(np.float32))
        observer.update("b", rng.normal(0, scale, 5000).astype(np.float32))
    assert observer.nbytes() == size == 2 * 2 * 512 * 8


def test_thresholds_track_the_exact_histogram_on_gaussian_data() -> None:
    rng = np.random.default_rng(3)
    observer = StreamingObserver({"g"}, bins=2048)
    for scale in (0.5, 1.0, 1.0, 1.0):  # the first batch is narrower: the range doubles once
        observer.update("g", rng.normal(0, scale, 250_000).astype(np.float32))
    hist = observer.abs_histograms()["g"]
    assert 3.5 <= entropy_amax(hist) <= 5.5  # TensorRT-style entropy on N(0, 1)
    assert 3.6 <= mse_amax(hist) <= 4.2  # the MSE-optimal 8-bit clip of N(0, 1) is about 3.9 sigma


def test_untracked_tensors_get_ranges_only_and_bad_bins_are_refused() -> None:
    observer = StreamingObserver({"a"}, bins=64)
    observer.update("b", np.arange(5, dtype=np.float32))
    assert observer.ranges()["b"] == (0.0, 4.0) and "b" not in observer.abs_histograms()
    with pytest.raises(CalibrationError, match="even number"):
        StreamingObserver({"a"}, bins=63)


def test_a_large_batch_is_binned_on_a_strided_subset_and_its_range_stays_exact() -> None:
    from calibrators.activations.streaming import BINNED, sampling_stride

    assert sampling_stride(BINNED) == 1 and sampling_stride(BINNED + 1) == 2 and sampling_stride(8 * BINNED) == 11
    rng = np.random.default_rng(4)
    batch = rng.normal(0, 1, (3, 8, 160, 1000)).astype(np.float32)  # 3.7 times BINNED values
    batch[0, 0, 0, 1] = 25.0  # an outlier that the strided subset skips: the range still holds it
    observer = StreamingObserver({"t"}, bins=2048)
    observer.update("t", batch)
    stride = sampling_stride(batch.size)
    assert stride == 5 and observer.ranges()["t"] == (float(batch.min()), 25.0)
    hist = observer.abs_histograms()["t"]
    assert hist.counts.sum() == -(-batch.size // stride)  # every fifth value, from the first
    assert 3.6 <= mse_amax(hist) <= 4.2  # the subset's thresholds are the Gaussian's
