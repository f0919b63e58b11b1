"""The legacy TensorRT INT8 path (TensorRT <= 10): implicit quantization through ``IInt8EntropyCalibrator2``.

TensorRT 10.1 deprecated implicit calibration and TensorRT 11 removed it; the Q/DQ engine
(``exporters/tensorrt/engine.py``) is the path that lasts. This adapter exists for users pinned to TensorRT <= 10.
It feeds deploy_opt's stratified calibration batches, but when the cache written from ``scales.json`` is present
TensorRT reads it and calibrates nothing, so the engine's ranges are the scale file's (the cache holds the
scale; TensorRT's range is 127·scale).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.deps import require
from dopt_common.errors import ExportError
from dopt_common.files import atomic_path
from exporters.tensorrt.engine import ShapeProfile, _checked, _cudart, parse_onnx

log = logging.getLogger(__name__)


def make_entropy_calibrator(batches: Sequence[dict[str, np.ndarray]], cache_path: str | Path) -> Any:
    """An ``IInt8EntropyCalibrator2`` over host batches that reads and writes ``cache_path``."""
    trt = require("tensorrt", purpose="the legacy TensorRT INT8 calibrator", extra="tensorrt")
    cudart = _cudart()
    cache = Path(cache_path)

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            super().__init__()
            self.batches = iter(batches)
            self.size = int(next(iter(batches[0].values())).shape[0]) if batches else 1
            self.pointers: list[int] = []

        def get_batch_size(self) -> int:
            return self.size

        def get_batch(self, names: list[str]) -> list[int] | None:
            for ptr in self.pointers:
                cudart.cudaFree(ptr)
            self.pointers = []
            feeds = next(self.batches, None)
            if feeds is None:
                return None
            for name in names:
                array = np.ascontiguousarray(feeds[name])
                ptr = _checked(cudart.cudaMalloc(max(array.nbytes, 1)))
                _checked(cudart.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, 1))
                self.pointers.append(ptr)
            return [int(p) for p in self.pointers]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache.is_file() else None

        def write_calibration_cache(self, data: bytes) -> None:
            with atomic_path(cache) as tmp:
                Path(tmp).write_bytes(bytes(data))

    return EntropyCalibrator()


def build_legacy_engine(
    fp32_path: str | Path,
    engine_path: str | Path,
    cache_path: str | Path,
    batches: Sequence[dict[str, np.ndarray]],
    profile: ShapeProfile,
    *,
    workspace_mb: int = 4096,
) -> dict[str, tuple[float, float]]:
    """An implicitly quantized engine from the FP32 model and the cache; returns each tensor's dynamic range."""
    trt = require("tensorrt", purpose="the legacy TensorRT INT8 calibrator", extra="tensorrt")
    if int(str(trt.__version__).split(".")[0]) >= 11:
        raise ExportError(
            f"tensorrt {trt.__version__} has no implicit INT8 calibration (removed in TensorRT 11); "
            "build the engine from model.int8.onnx (the Q/DQ path) instead"
        )
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network, _parser = parse_onnx(trt, builder, Path(fp32_path), strongly_typed=False)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_flag(trt.BuilderFlag.FP16)
    opt = builder.create_optimization_profile()
    for name, (low, mid, high) in profile.shapes.items():
        opt.set_shape(name, low, mid, high)
    config.add_optimization_profile(opt)
    config.set_calibration_profile(opt)
    config.int8_calibrator = make_entropy_calibrator(batches, cache_path)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT failed to build a calibrated engine from '{fp32_path}'")
    with atomic_path(engine_path) as tmp:
        Path(tmp).write_bytes(bytes(serialized))
    ranges = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            tensor = layer.get_output(j)
            if tensor.dynamic_range is not None:
                ranges[tensor.name] = tuple(float(v) for v in tensor.dynamic_range)
    log.info("legacy TensorRT engine %s: %d tensors with ranges", engine_path, len(ranges))
    return ranges
