"""Calibration guards: a clipping method gives way to min/max on graph inputs and where it clips a material share."""

from __future__ import annotations

import numpy as np
import pytest

from calibrators.activations.guards import clipped_fraction, guard_reason
from calibrators.activations.histogram import Histogram
from calibrators.activations.ranges import entropy_amax, range_for
from calibrators.activations.streaming import StreamingObserver


def _abs_histogram(values: np.ndarray) -> Histogram:
    observer = StreamingObserver({"x"}, 2048)
    observer.update("x", values.astype(np.float32), where="test")
    return observer.abs_histograms()["x"]


def _entropy_range(hist: Histogram) -> tuple[float, float]:
    amax = float(entropy_amax(hist))
    return -amax, amax


def test_entropy_on_a_few_levels_input_is_refused() -> None:
    """17 grey levels, most of them bright: TensorRT's entropy clips a large share of the values."""
    rng = np.random.default_rng(0)
    levels = np.linspace(0, 16, 17)
    weights = np.r_[np.full(9, 0.02), np.full(8, 0.1)]
    pixels = rng.choice(levels, size=(512, 64), p=weights / weights.sum()).astype(np.float32)
    hist = _abs_histogram(pixels)
    chosen = _entropy_range(hist)
    fraction = clipped_fraction(hist, chosen)
    assert fraction > 0.5  # entropy's KL search collapses onto the first level: most pixels are clipped
    reason = guard_reason("entropy", False, hist, chosen)
    assert reason is not None and "min/max used" in reason and f"{fraction:.1%}" in reason


def test_entropy_on_a_continuous_activation_is_kept() -> None:
    values = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    hist = _abs_histogram(values)
    chosen = _entropy_range(hist)
    assert clipped_fraction(hist, chosen) < 0.01
    assert guard_reason("entropy", False, hist, chosen) is None


@pytest.mark.parametrize("method", ["entropy", "percentile", "mse"])
def test_graph_inputs_always_take_minmax(method: str) -> None:
    values = np.random.default_rng(2).standard_normal((64, 32)).astype(np.float32)
    hist = _abs_histogram(values)
    assert "graph input" in guard_reason(method, True, hist, (-1.0, 1.0))


def test_minmax_is_never_guarded() -> None:
    hist = _abs_histogram(np.arange(10, dtype=np.float32))
    assert guard_reason("minmax", True, hist, (0.0, 1.0)) is None
    assert range_for("minmax", -1.0, 2.0, hist, 99.99, False) == (-1.0, 2.0)


@pytest.mark.slow
def test_a_build_records_each_guard_decision(tmp_path) -> None:
    from conftest import build_tiny

    result = build_tiny(tmp_path, "calibration: {method: entropy}\nquantization: {op_types: [MatMul]}")
    tensors = result.build.quantization.tensors
    inputs = [name for name, entry in tensors.items() if "graph input" in entry.get("guard", "")]
    assert inputs and all(tensors[name]["method"] == "minmax" for name in inputs)
    assert any(entry["method"] == "entropy" for entry in tensors.values())  # the others keep their method


def test_auto_stratifies_by_class_labels_only() -> None:
    """A text line's characters (one row per sample) or a float target have no classes to balance: auto means none."""
    from types import SimpleNamespace

    import numpy as np

    from deploy_opt.stages.calibration_set import _key_function

    cal = SimpleNamespace(stratify="auto")
    assert _key_function(cal, ".", np.array([0, 1, 1]))[0] == "label"
    assert _key_function(cal, ".", np.array(["cat", "dog"]))[0] == "label"
    assert _key_function(cal, ".", np.array([[5, 9, -1], [7, -1, -1]]))[0] == "none"
    assert _key_function(cal, ".", np.array([0.5, 1.5]))[0] == "none"
    assert _key_function(cal, ".", None)[0] == "none"
