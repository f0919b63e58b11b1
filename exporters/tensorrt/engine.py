"""The TensorRT artifact: an engine built from the Q/DQ ONNX model (explicit quantization, TensorRT 10/11).

``tensorrt`` is imported inside the functions, so this module imports everywhere; ``tensorrt_status`` says
whether a build can happen here. Explicit Q/DQ is the only INT8 path TensorRT 11 has (10.1 deprecated implicit
calibration). The legacy path for TensorRT <= 10 lives in ``exporters/tensorrt/legacy.py``.

Scales: TensorRT builds from the Q/DQ model's scale initializers. ``network_scales`` reads them back out of the
network TensorRT's own ONNX parser produced (the quantize layers' scale constants), which is what the engine is
compiled from; an explicit-quantization engine exposes no per-tensor ranges of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.deps import require
from dopt_common.errors import ExportError
from dopt_common.files import atomic_path
from exporters.ort.qdq import INITIALIZER_SUFFIX, OUTPUT_SUFFIX

log = logging.getLogger(__name__)


def tensorrt_status() -> str:
    """'available: tensorrt <version>, <gpu>' or 'not available: <why>'; never raises."""
    try:
        import tensorrt as trt  # noqa: F401  (a probe: a missing package is the expected case)
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"not available: tensorrt does not import ({type(exc).__name__}: {exc})"
    try:
        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
        if builder is None:
            return "not available: no usable NVIDIA GPU (TensorRT could not create a builder)"
    except Exception as exc:
        return f"not available: {type(exc).__name__}: {exc}"
    return f"available: tensorrt {trt.__version__}"


@dataclass(frozen=True)
class ShapeProfile:
    """min/opt/max shape of every input, for the engine's optimization profile."""

    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    @classmethod
    def from_sample(cls, sample: Mapping[str, np.ndarray], max_batch: int) -> ShapeProfile:
        """Batch from 1 to ``max_batch`` (opt: the sample's), every other dim fixed at the sample's."""
        shapes = {}
        for name, array in sample.items():
            rest = tuple(int(d) for d in array.shape[1:])
            opt = max(1, min(int(array.shape[0]), max_batch))
            shapes[name] = ((1, *rest), (opt, *rest), (max_batch, *rest))
        return cls(shapes)


@dataclass(frozen=True)
class EngineBuild:
    """What ``build_engine`` produced."""

    path: Path
    tensorrt_version: str
    strongly_typed: bool
    fp16: bool
    build_s: float
    scales: dict[str, tuple[float, ...]]

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "engine": self.path.name,
            "tensorrt": self.tensorrt_version,
            "strongly_typed": self.strongly_typed,
            "fp16_fallback": self.fp16,
            "build_s": round(self.build_s, 2),
            "quantized_tensors": len(self.scales),
        }


def _trt() -> Any:
    return require("tensorrt", purpose="building a TensorRT engine", extra="tensorrt")


def _major(trt: Any) -> int:
    return int(str(trt.__version__).split(".")[0])


def parse_onnx(trt: Any, builder: Any, onnx_path: Path, strongly_typed: bool) -> tuple[Any, Any]:
    """A network from TensorRT's ONNX parser; parser errors become one ExportError listing them."""
    flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT's ONNX parser refused '{onnx_path}': {errors} (see compat.md for the node)")
    return network, parser


def network_scales(trt: Any, network: Any) -> dict[str, tuple[float, ...]]:
    """Per quantized tensor, the scale(s) TensorRT's network carries, keyed as ``read_qdq_scales`` keys them.

    Activations: the quantize layer's input tensor and the constant feeding its scale. Weights (stored already
    quantized, so only a dequantize layer): the constant's name without ORT's ``_quantized`` suffix.
    """
    constants = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer  # get_layer returns ILayer; the cast exposes .weights
            constants[layer.get_output(0).name] = layer
    found: dict[str, tuple[float, ...]] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type not in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE):
            continue
        source, scale = layer.get_input(0).name, constants.get(layer.get_input(1).name)
        if scale is None or (layer.type == trt.LayerType.DEQUANTIZE and source not in constants):
            continue  # an activation's dequantize half: its quantize layer was read
        name = source.removesuffix(INITIALIZER_SUFFIX) if source in constants else source.removesuffix(OUTPUT_SUFFIX)
        values = np.asarray(scale.weights.numpy(), dtype=np.float32).reshape(-1)
        found[name] = tuple(float(v) for v in values)
    return found


def build_engine(
    qdq_path: str | Path,
    engine_path: str | Path,
    profile: ShapeProfile,
    *,
    fp16_fallback: bool = True,
    workspace_mb: int = 4096,
) -> EngineBuild:
    """Build a TensorRT engine from the Q/DQ model; the INT8 precision comes from its Q/DQ nodes alone.

    Strongly typed (the TensorRT 10/11 path) unless FP16 fallback is wanted on TensorRT 10, where FP16 for the
    unquantized layers needs the weakly typed builder with the FP16 flag. TensorRT 11 is always strongly typed:
    FP16 fallback there needs the float layers stored as FP16 in the ONNX model, so the engine stays FP32 there.
    """
    trt = _trt()
    major = _major(trt)
    strongly_typed = major >= 11 or not fp16_fallback
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if builder is None:
        raise ExportError("TensorRT could not create a builder: no usable NVIDIA GPU or driver on this machine")
    network, _parser = parse_onnx(trt, builder, Path(qdq_path), strongly_typed)
    scales = network_scales(trt, network)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    fp16 = fp16_fallback and not strongly_typed
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
        if hasattr(trt.BuilderFlag, "INT8"):
            config.set_flag(trt.BuilderFlag.INT8)  # weakly typed: Q/DQ layers still need INT8 enabled
    if hasattr(trt, "ProfilingVerbosity"):
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    opt = builder.create_optimization_profile()
    for name, (low, mid, high) in profile.shapes.items():
        opt.set_shape(name, low, mid, high)
    config.add_optimization_profile(opt)
    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT failed to build an engine from '{qdq_path}' (its log above names the layer)")
    with atomic_path(engine_path) as tmp:
        Path(tmp).write_bytes(bytes(serialized))
    seconds = time.perf_counter() - started
    log.info("TensorRT %s engine: %s in %.1f s", trt.__version__, engine_path, seconds)
    return EngineBuild(Path(engine_path), str(trt.__version__), strongly_typed, fp16, seconds, scales)


def engine_scales(qdq_path: str | Path) -> dict[str, tuple[float, ...]]:
    """The scales TensorRT's parser reads from a Q/DQ model (what an engine built from it carries)."""
    trt = _trt()
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    if builder is None:
        raise ExportError("TensorRT could not create a builder: no usable NVIDIA GPU or driver on this machine")
    network, _parser = parse_onnx(trt, builder, Path(qdq_path), strongly_typed=True)
    return network_scales(trt, network)


def engine_runner(engine_path: str | Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """A function running the engine on host arrays (through cuda-python), returning host outputs."""
    trt = _trt()
    cudart = _cudart()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
    if engine is None:
        raise ExportError(f"TensorRT could not load engine '{engine_path}' (built by another TensorRT version?)")
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        buffers = []
        try:
            for name, array in feeds.items():
                array = np.ascontiguousarray(array, dtype=trt.nptype(engine.get_tensor_dtype(name)))
                context.set_input_shape(name, array.shape)
                buffers.append(_device_copy(cudart, array, context, name))
            host = {}
            for name in outputs:
                shape = tuple(context.get_tensor_shape(name))
                host[name] = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
                buffers.append(_device_alloc(cudart, host[name].nbytes, context, name))
            if not context.execute_async_v3(0):
                raise ExportError(f"TensorRT engine '{engine_path}' failed to execute")
            cudart.cudaStreamSynchronize(0)
            for name, ptr in zip(outputs, buffers[len(feeds) :], strict=True):
                cudart.cudaMemcpy(host[name].ctypes.data, ptr, host[name].nbytes, 2)  # device to host
            return [host[n] for n in outputs]
        finally:
            for ptr in buffers:
                cudart.cudaFree(ptr)

    return run


def time_runner(run: Callable[[dict[str, np.ndarray]], Any], feeds: dict[str, np.ndarray], repeats: int = 50) -> float:
    """Median milliseconds of ``run(feeds)`` after five warm-up calls (host copies included)."""
    for _ in range(5):
        run(feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        cudart = require("cuda.cudart", purpose="running a TensorRT engine", extra="tensorrt")
    return cudart


def _checked(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise ExportError(f"CUDA call failed with error {err}")
    return rest[0] if rest else None


def _device_alloc(cudart: Any, nbytes: int, context: Any, name: str) -> int:
    ptr = _checked(cudart.cudaMalloc(max(nbytes, 1)))
    context.set_tensor_address(name, int(ptr))
    return ptr


def _device_copy(cudart: Any, array: np.ndarray, context: Any, name: str) -> int:
    ptr = _device_alloc(cudart, array.nbytes, context, name)
    _checked(cudart.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, 1))  # host to device
    return ptr
