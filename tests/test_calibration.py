"""Min/max calibration: streaming ranges, and equality with ONNX Runtime's own MinMax calibrator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_onnx
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

from calibrators.activations.collect import collect, select_tensors
from calibrators.activations.minmax import MinMaxObserver
from dopt_common.errors import CalibrationError


def test_streaming_ranges_equal_whole_data_ranges() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(i, 1 + i, (7, 5)).astype(np.float32) for i in range(6)]
    observer = MinMaxObserver()
    for chunk in chunks:
        observer.update("t", chunk)
    whole = np.concatenate(chunks)
    assert observer.ranges() == {"t": (float(whole.min()), float(whole.max()))}


def test_no_data_is_an_error() -> None:
    with pytest.raises(CalibrationError, match="no data"):
        MinMaxObserver().ranges()


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def test_minmax_ranges_equal_onnxruntime_minmax(tiny_model: Path, tmp_path: Path) -> None:
    feeds = [inputs for inputs, _ in tiny_onnx.calibration()]
    names = select_tensors(onnx.load(str(tiny_model)), ["MatMul", "Add", "Relu"])
    observer = MinMaxObserver()
    samples = collect(tiny_model, feeds, names, observer)
    assert samples == 128

    calibrator = create_calibrator(
        tiny_model,
        ["MatMul", "Add", "Relu"],
        augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=CalibrationMethod.MinMax,
    )
    calibrator.collect_data(_Reader(feeds))
    reference = calibrator.compute_data()
    ours = observer.ranges()
    compared = 0
    for name, (low, high) in ours.items():
        if name in reference.data:
            ref_low, ref_high = reference.data[name].range_value
            np.testing.assert_allclose(
                [low, high], [float(np.ravel(ref_low)[0]), float(np.ravel(ref_high)[0])], rtol=1e-6, atol=0
            )
            compared += 1
    assert compared >= 5, f"only {compared} tensors in common with ORT's calibrator"


def test_dynamic_shapes_stream(tiny_model: Path) -> None:
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (n, tiny_onnx.FEATURES)).astype(np.float32)} for n in (1, 5, 17)]
    observer = MinMaxObserver()
    assert collect(tiny_model, feeds, ["h2", "logits"], observer) == 23
    x = np.concatenate([f["x"] for f in feeds])
    expected = tiny_onnx.reference(x)
    low, high = observer.ranges()["logits"]
    np.testing.assert_allclose([low, high], [expected.min(), expected.max()], rtol=1e-5)
