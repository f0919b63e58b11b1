"""Range methods against their references: fixed-range histograms == np.histogram, percentile == ONNX Runtime,
entropy == TensorRT, mse == brute force."""

from __future__ import annotations

import contextlib
import functools
import io

import numpy as np
import pytest
from onnxruntime.quantization.calibrate import HistogramCollector
from range_samples import DISTRIBUTIONS, abs_hist, observe

import calibrators.activations.histogram as histogram_module
from calibrators.activations.histogram import Histogram, HistogramObserver, bin_counts, histogram_edges
from calibrators.activations.ranges import entropy_amax, mse_amax, percentile_range

# ---------------------------------------------------------------------------------------------- helpers


def synthetic_counts(counts: np.ndarray, top: float = 1.0) -> Histogram:
    """An |x| histogram with the given counts over [0, top]."""
    counts = np.asarray(counts, dtype=np.int64)
    return Histogram(counts, histogram_edges(0.0, top, counts.size), -top, top)


def ort_collector(x: np.ndarray, method: str, percentile: float = 99.99) -> HistogramCollector:
    """ORT's own histogram collector fed all of ``x`` in one call (as HistogramCalibrater does)."""
    collector = HistogramCollector(
        method=method, symmetric=False, num_bins=2048, num_quantized_bins=128, percentile=percentile, scenario="same"
    )
    with contextlib.redirect_stdout(io.StringIO()):
        collector.collect({"t": x})
    return collector


def ort_result(collector: HistogramCollector) -> tuple[float, float]:
    with contextlib.redirect_stdout(io.StringIO()):
        result = collector.compute_collection_result()["t"]
    return float(result[0]), float(result[1])


def slow_entropy_amax(calib_hist: np.ndarray, calib_bin_edges: np.ndarray, nbins: int = 128, start: int = 128) -> float:
    """NVIDIA pytorch-quantization ``_compute_amax_entropy`` transcribed, with scipy-free KL.

    The per-bin Python loops that fill ``new_density_counts``, the ``Counter`` of nonzero bins per group and
    ``new_density`` are written as their ``np.bincount`` / indexing equivalents (same values, in seconds
    instead of minutes); everything else follows the original line by line.
    """
    bins = np.array(calib_hist, dtype=np.int64)  # the original's bins = calib_hist[:] is a view; copy
    bins[0] = bins[1]
    total_data = np.sum(bins)
    divergences = []
    for i in range(start, len(bins) + 1):
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        kept = digitized_space != -1
        # for idx, digitized in enumerate(digitized_space): new_density_counts[digitized] += bins[idx]
        new_density_counts = np.bincount(digitized_space[kept], weights=bins[:i][kept], minlength=nbins)
        # counter = Counter(digitized_space); new_density_counts[key] /= val
        counter = np.bincount(digitized_space[kept], minlength=nbins)
        new_density_counts[counter > 0] /= counter[counter > 0]
        new_density = np.zeros(i, dtype=np.float64)
        new_density[kept] = new_density_counts[digitized_space[kept]]
        total_counts_new = np.sum(new_density) + np.sum(bins[i:])
        reference_density = np.array(bins[: len(digitized_space)], dtype=np.float64)
        reference_density[-1] += np.sum(bins[i:])
        assert round(total_counts_new) == total_data and round(np.sum(reference_density)) == total_data
        # scipy.stats.entropy(p, q): both normalised, sum p log(p / q), inf where q = 0 < p.
        p = reference_density / reference_density.sum()
        q = new_density / new_density.sum() if new_density.sum() > 0 else new_density
        if np.any((p > 0) & (q == 0)):
            divergences.append(np.inf)
        else:
            m = p > 0
            divergences.append(float(np.sum(p[m] * np.log(p[m] / q[m]))))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return float(calib_bin_edges[last_argmin + start])


def brute_mse_errors(hist: Histogram, levels: int = 127) -> np.ndarray:
    """The mse objective evaluated literally for every upper edge (one row per candidate)."""
    edges = hist.edges.astype(np.float64)
    centers = (edges[:-1] + edges[1:]) / 2
    scale = edges[1:, None] / levels
    dequant = np.clip(np.rint(centers / scale), -levels, levels) * scale
    return ((centers - dequant) ** 2) @ hist.counts.astype(np.float64)


# ------------------------------------------------------------------------------ histogram == np.histogram


def _edge_cases(edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Values on, just below and just above every edge, beyond both ends, and random ones."""
    e = edges.astype(np.float32)
    span = float(e[-1] - e[0])
    return np.concatenate(
        [
            e,
            np.nextafter(e, np.float32(-np.inf)),
            np.nextafter(e, np.float32(np.inf)),
            np.array([e[0] - span, e[-1] + span], np.float32),
            rng.uniform(float(e[0]), float(e[-1]), 200_000).astype(np.float32),
        ]
    )


@pytest.mark.parametrize(
    ("first", "last", "bins", "fast"),
    [
        (-4.7312, 4.7312, 2048, True),
        (0.0, 4.7312, 2048, True),
        (-1e-3, 1e-3, 2048, True),
        (-3.3e5, 3.3e5, 2048, True),
        (-3.0, 2.5, 2048, True),
        (-0.37, 1.9, 100, True),
        (0.0, 7.0, 8192, True),
        (0.0, 0.0, 2048, True),  # numpy widens an empty range to [-0.5, 0.5]
        (0.0, 7.0, 8193, False),  # beyond the proven margin: numpy itself
        (-1e-35, 1e-35, 2048, False),  # tiny range
        (1000.0, 1000.5, 2048, False),  # narrow span far from 0
    ],
)
def test_binning_is_bit_identical_to_np_histogram(
    first: float, last: float, bins: int, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    original = histogram_module._bin_index
    monkeypatch.setattr(histogram_module, "_bin_index", lambda *args: calls.append(1) or original(*args))
    edges = histogram_edges(first, last, bins)
    x = _edge_cases(edges, np.random.default_rng(bins))
    expected, expected_edges = np.histogram(np.clip(x, edges[0], edges[-1]), bins, range=(edges[0], edges[-1]))
    assert edges.dtype == expected_edges.dtype == np.float32
    assert np.array_equal(edges, expected_edges)
    assert np.array_equal(edges, np.histogram(x, bins, range=(np.float32(first), np.float32(last)))[1])
    counts = bin_counts(x, edges)
    assert counts.dtype == np.int64
    assert np.array_equal(counts, expected)
    assert bool(calls) == fast


def test_observer_histogram_equals_one_shot_np_histogram() -> None:
    x = DISTRIBUTIONS["gaussian"]
    observer = observe(x)
    t = np.float32(np.abs(x).max())
    signed = observer.signed_histograms()["t"]
    absolute = observer.abs_histograms()["t"]
    counts, edges = np.histogram(x, 2048, range=(-t, t))
    assert np.array_equal(signed.counts, counts) and np.array_equal(signed.edges, edges)
    counts, edges = np.histogram(np.abs(x), 2048, range=(np.float32(0), t))
    assert np.array_equal(absolute.counts, counts) and np.array_equal(absolute.edges, edges)
    assert (signed.low, signed.high) == (float(x.min()), float(x.max()))


def test_values_outside_the_pass1_range_land_in_the_edge_bins() -> None:
    observer = HistogramObserver({"t": (-1.0, 2.0)}, {"t": "both"}, bins=16)
    observer.update("t", np.array([-5.0, -2.0, 0.0, 2.0, 9.0], np.float32))
    signed = observer.signed_histograms()["t"].counts
    absolute = observer.abs_histograms()["t"].counts
    assert signed.sum() == absolute.sum() == 5
    assert signed[0] == 2 and signed[-1] == 2  # -5 clipped to -2 (t = 2), 9 clipped to 2
    assert absolute[0] == 1 and absolute[-1] == 4


# -------------------------------------------------------------------------------- percentile == ORT


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_percentile_equals_onnxruntime(name: str) -> None:
    x = DISTRIBUTIONS[name]
    signed = observe(x, "signed").signed_histograms()["t"]
    collector = ort_collector(x, "percentile")
    ort_hist, ort_edges = collector.histogram_dict["t"][:2]
    assert np.array_equal(signed.counts, ort_hist) and np.array_equal(signed.edges, ort_edges)
    for percentile in (99.99, 99.9):
        collector.percentile = percentile
        expected = ort_result(collector)
        got = percentile_range(signed, percentile)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0, err_msg=f"{name} p={percentile}")


# ----------------------------------------------------------------------------- entropy == TensorRT


@functools.cache
def _entropy_cases() -> dict[str, Histogram]:
    rng = np.random.default_rng(11)
    zero_runs = rng.integers(0, 50, 2048)
    zero_runs[300:700] = 0
    zero_runs[1000:1500] = 0
    outliers = rng.standard_normal(300_000).astype(np.float32)
    outliers[:300] = rng.choice([-50.0, 50.0], 300)
    empty_last = rng.integers(1, 100, 1024)
    empty_last[-1] = 0  # outliers fall on an empty bin for the last candidate
    return {
        "random_counts": synthetic_counts(rng.integers(0, 1000, 2048)),
        "gaussian_abs": abs_hist(rng.standard_normal(300_000).astype(np.float32)),
        "zero_runs": synthetic_counts(zero_runs),
        "relu_spike_at_0": abs_hist(np.maximum(rng.standard_normal(300_000), 0).astype(np.float32)),
        "outliers": abs_hist(outliers),
        "sparse": synthetic_counts((rng.random(2048) < 0.05) * rng.integers(1, 100, 2048)),
        "flat": synthetic_counts(np.full(1024, 7)),
        "empty_last_bin": synthetic_counts(empty_last),
    }


@pytest.mark.parametrize("name", list(_entropy_cases()))
def test_entropy_fast_equals_literal_reference(name: str) -> None:
    hist = _entropy_cases()[name]
    counts_before = hist.counts.copy()
    assert entropy_amax(hist) == slow_entropy_amax(hist.counts, hist.edges)
    assert np.array_equal(hist.counts, counts_before)  # bins[0] = bins[1] must not leak into the caller's data


def test_entropy_other_group_counts_equal_literal_reference() -> None:
    hist = synthetic_counts(np.random.default_rng(3).integers(0, 30, 700))
    for nbins, start in ((64, 64), (32, 100), (128, 600)):
        assert entropy_amax(hist, nbins, start) == slow_entropy_amax(hist.counts, hist.edges, nbins, start)


def test_entropy_compared_with_onnxruntime_entropy() -> None:
    # Not the same algorithm, so no 1% agreement: ORT's entropy works on the SIGNED histogram with windows
    # centred on 0 (2 * 1024 bins, candidates from 64 to 1024 half-widths), truncates q to integers and smooths
    # p and q; TensorRT's works on |x| with 2048 bins, suppresses the zero bin (bins[0] = bins[1]) and keeps q in
    # float. On Gaussian data both land in the far tail (4-5 sigma), where the KL curve is flat and the sample
    # extremes move the optimum: measured differences over seeds and sizes are -4% to +13%, hence 20%.
    x = DISTRIBUTIONS["gaussian"]
    low, high = ort_result(ort_collector(x, "entropy"))
    ort_amax = max(abs(low), abs(high))
    ours = entropy_amax(observe(x, "abs").abs_histograms()["t"])
    relative = (ours - ort_amax) / ort_amax
    print(f"\nentropy on N(0,1), {x.size} values: TensorRT-style {ours:.4f}, ORT {ort_amax:.4f}, diff {relative:+.2%}")
    assert abs(relative) < 0.20


# ------------------------------------------------------------------------------------------------ mse


@pytest.mark.parametrize("name", ["random_counts", "gaussian_abs", "zero_runs", "relu_spike_at_0", "outliers"])
def test_mse_equals_brute_force(name: str) -> None:
    hist = _entropy_cases()[name]
    errors = brute_mse_errors(hist)
    amax = mse_amax(hist)
    picked = int(np.flatnonzero(hist.edges[1:] == np.float32(amax))[0])
    # The same optimum, or (rounding of a near tie) one whose literal error is the minimum to 1e-9.
    assert errors[picked] <= errors.min() * (1 + 1e-9)
