"""The TensorRT artifact: an engine built from the Q/DQ ONNX model (explicit quantization, TensorRT 10/11).

``tensorrt`` is imported inside the functions, so this module imports everywhere; ``tensorrt_status`` says
whether a build can happen here. Explicit Q/DQ is the only INT8 path this project builds: TensorRT 10.1
deprecated implicit calibration and TensorRT 11 removed it. The optimisation profile is in ``profile.py`` and
the runner (preallocated buffers, its own stream, CUDA-event timing) in ``runner.py``.

Scales: TensorRT builds from the Q/DQ model's scale initializers. ``network_scales`` reads them back out of the
network TensorRT's own ONNX parser produced (the quantize layers' scale constants), which is what the engine is
compiled from; an explicit-quantization engine exposes no per-tensor ranges of its own.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dopt_common.deps import require
from dopt_common.errors import ExportError
from dopt_common.files import atomic_path
from exporters.ort.qdq import INITIALIZER_SUFFIX, OUTPUT_SUFFIX
from exporters.tensorrt.profile import ShapeProfile

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
class EngineBuild:
    """What ``build_engine`` produced."""

    path: Path
    tensorrt_version: str
    strongly_typed: bool
    fp16: bool
    build_s: float
    scales: dict[str, tuple[float, ...]]
    precision: str = ""  # what the unquantized layers run in, and why

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "engine": self.path.name,
            "tensorrt": self.tensorrt_version,
            "strongly_typed": self.strongly_typed,
            "fp16_fallback": self.fp16,
            "precision": self.precision,
            "build_s": round(self.build_s, 2),
            "quantized_tensors": len(self.scales),
        }


def _trt() -> Any:
    return require("tensorrt", purpose="building a TensorRT engine", extra="tensorrt")


def major_version(version: object) -> int:
    """TensorRT's major version from its version string ("11.4.0.106" -> 11; 0 when it does not start with one)."""
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _major(trt: Any) -> int:
    return major_version(trt.__version__)


def create_builder(trt: Any, severity: Any) -> Any:
    """``trt.Builder``; a builder TensorRT cannot create (None, or a TypeError / RuntimeError from the binding, as
    without a usable GPU) is one ExportError."""
    try:
        builder = trt.Builder(trt.Logger(severity))
    except (TypeError, RuntimeError) as exc:
        raise ExportError(f"TensorRT could not create a builder ({type(exc).__name__}: {exc}); {_NO_GPU}") from exc
    if builder is None:
        raise ExportError(f"TensorRT could not create a builder; {_NO_GPU}")
    return builder


_NO_GPU = "fix: run on a machine with an NVIDIA GPU and driver that this TensorRT supports"


def parse_onnx(trt: Any, builder: Any, onnx_path: Path, strongly_typed: bool) -> tuple[Any, Any]:
    """A network from TensorRT's ONNX parser; parser errors become one ExportError listing them.

    TensorRT 11 networks are always strongly typed: its STRONGLY_TYPED flag is deprecated and ignored, so it is
    set on TensorRT 10 alone."""
    flags = 0
    if strongly_typed and _major(trt) < 11 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    try:
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    except (TypeError, RuntimeError) as exc:
        raise ExportError(f"TensorRT could not create a network and ONNX parser ({type(exc).__name__}: {exc})") from exc
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT's ONNX parser refused '{onnx_path}': {errors} (see compat.md for the node)")
    return network, parser


def network_scales(trt: Any, network: Any, initializers: Collection[str] = ()) -> dict[str, tuple[float, ...]]:
    """Per quantized tensor, the scale(s) TensorRT's network carries, keyed as ``read_qdq_scales`` keys them.

    Activations: the quantize layer's input tensor, keyed by its name. Weights (stored already quantized, so
    only a dequantize layer): keyed by the initializer's name without ORT's ``_quantized`` suffix. The parser
    turns an initializer into a constant layer named after the initializer, and leaves that layer's output
    tensor TensorRT's default name ("(Unnamed Layer* 7) [Constant]_output"), so a weight is found by its
    constant LAYER's name. ``initializers``: the ONNX model's initializer names, to undo the "_<n>" suffix the
    parser adds when a layer of that name already exists.
    """
    constants = _constant_layers(trt, network, set(initializers))
    found: dict[str, tuple[float, ...]] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type not in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE):
            continue
        data, scale = constants.get(layer.get_input(0).name), constants.get(layer.get_input(1).name)
        if scale is None or (layer.type == trt.LayerType.DEQUANTIZE and data is None):
            continue  # a scale computed at run time, or an activation's dequantize half (its Q was read)
        if layer.type == trt.LayerType.QUANTIZE:
            name = (data[0] if data else layer.get_input(0).name).removesuffix(OUTPUT_SUFFIX)
        else:
            name = data[0].removesuffix(INITIALIZER_SUFFIX)
        found[name] = _constant_values(trt, scale[1])
    return found


def _constant_values(trt: Any, layer: Any) -> tuple[float, ...]:
    """The scale constant's values. ``IConstantLayer.weights`` is already a NumPy array (pyGraph.cpp wraps the
    getter in ``utils::weights_to_numpy``, TensorRT >= 7.2); only a type NumPy lacks (BF16, FP8) comes back as
    ``trt.Weights``, which cannot be read as numbers here."""
    layer.__class__ = trt.IConstantLayer  # get_layer returns ILayer; the cast (Polygraphy's idiom) exposes .weights
    weights = layer.weights
    if not isinstance(weights, np.ndarray):
        raise ExportError(
            f"scale constant '{layer.name}' holds {getattr(weights, 'dtype', type(weights).__name__)} weights, "
            "which NumPy cannot read; fix: store Q/DQ scales as float32 or float16"
        )
    return tuple(float(v) for v in weights.astype(np.float32).reshape(-1))


def _constant_layers(trt: Any, network: Any, initializers: set[str]) -> dict[str, tuple[str, Any]]:
    """Output tensor name → (the initializer the constant layer was made from, the layer).

    onnx-tensorrt names the layer, not its output: ``convertToTensor`` (importerUtils.cpp) and
    ``QuantDequantLinearHelper``'s ``addConstantLayer`` (onnxOpImporters.cpp) call
    ``network->addConstant(weights.shape, weights)`` then ``ctx->registerLayer(layer, weights.getName(), ...)``,
    and ``ImporterContext::registerLayer`` (ImporterContext.cpp) sets the layer's name only, uniqued by
    ``generateUniqueName`` (weightUtils.cpp) as ``<name>_<counter>`` on a clash. The weights' name is the
    initializer's (``registerTensor`` in ``parseGraph``, ModelImporter.cpp).
    """
    found = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.CONSTANT:
            found[layer.get_output(0).name] = (_initializer_name(layer.name, initializers), layer)
    return found


_UNIQUE_SUFFIX = re.compile(r"^(?P<base>.+)_\d+$")


def _initializer_name(layer_name: str, initializers: set[str]) -> str:
    if not initializers or layer_name in initializers:
        return layer_name
    match = _UNIQUE_SUFFIX.match(layer_name)
    return match["base"] if match and match["base"] in initializers else layer_name


def initializer_names(onnx_path: str | Path) -> set[str]:
    """The initializer names of an ONNX model (external data is not loaded)."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    return {i.name for i in model.graph.initializer}


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
    unquantized layers needs the weakly typed builder with the FP16 flag. TensorRT 11 removed BuilderFlag.FP16 and
    INT8 and is always strongly typed: the unquantized layers run in the ONNX model's own types, and ``precision``
    says so.
    """
    trt = _trt()
    major = _major(trt)
    strongly_typed = major >= 11 or not fp16_fallback
    builder = create_builder(trt, trt.Logger.WARNING)
    network, _parser = parse_onnx(trt, builder, Path(qdq_path), strongly_typed)
    scales = network_scales(trt, network, initializer_names(qdq_path))
    fp16 = fp16_fallback and not strongly_typed
    config = _builder_config(trt, builder, fp16, workspace_mb)
    add_profile(builder, network, config, profile)
    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT failed to build an engine from '{qdq_path}' (its log above names the layer)")
    with atomic_path(engine_path) as tmp:
        Path(tmp).write_bytes(bytes(serialized))
    seconds = time.perf_counter() - started
    log.info("TensorRT %s engine: %s in %.1f s", trt.__version__, engine_path, seconds)
    precision = _precision(major, fp16_fallback, fp16)
    return EngineBuild(Path(engine_path), str(trt.__version__), strongly_typed, fp16, seconds, scales, precision)


def _builder_config(trt: Any, builder: Any, fp16: bool, workspace_mb: int) -> Any:
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if fp16:  # TensorRT 10 only: 11.x has no BuilderFlag.FP16 or INT8
        config.set_flag(trt.BuilderFlag.FP16)
        if hasattr(trt.BuilderFlag, "INT8"):
            config.set_flag(trt.BuilderFlag.INT8)  # weakly typed: Q/DQ layers still need INT8 enabled
    if hasattr(trt, "ProfilingVerbosity"):
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    return config


def _precision(major: int, wanted_fp16: bool, fp16: bool) -> str:
    if fp16:
        return "int8 from the Q/DQ nodes; other layers fp16 or fp32 (weakly typed, BuilderFlag.FP16)"
    if wanted_fp16 and major >= 11:
        return (
            "int8 from the Q/DQ nodes; other layers in the ONNX model's own float types: fp16 fallback not "
            f"applied, TensorRT {major} removed BuilderFlag.FP16 and builds every network strongly typed"
        )
    return "int8 from the Q/DQ nodes; other layers in the ONNX model's own types (strongly typed)"


def engine_scales(qdq_path: str | Path) -> dict[str, tuple[float, ...]]:
    """The scales TensorRT's parser reads from a Q/DQ model (what an engine built from it carries)."""
    trt = _trt()
    builder = create_builder(trt, trt.Logger.ERROR)
    network, _parser = parse_onnx(trt, builder, Path(qdq_path), strongly_typed=True)
    return network_scales(trt, network, initializer_names(qdq_path))


def add_profile(builder: Any, network: Any, config: Any, profile: ShapeProfile) -> None:
    """Add ``profile`` to the builder config; an input it misses or a range TensorRT refuses is an ExportError."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    missing = [t.name for t in inputs if t.name not in profile.shapes and any(d < 0 for d in tuple(t.shape))]
    if missing:
        raise ExportError(f"the TensorRT profile has no shapes for dynamic inputs {missing}; fix: pass their batches")
    opt = builder.create_optimization_profile()
    names = {t.name for t in inputs}
    for name, (low, mid, high) in profile.shapes.items():
        if name in names:
            opt.set_shape(name, low, mid, high)
    if config.add_optimization_profile(opt) < 0:
        ranges = "; ".join(f"{n}: {profile.describe(n)}" for n in profile.shapes)
        raise ExportError(f"TensorRT refused the optimization profile ({ranges}); fix: min <= opt <= max per input")
    log.info("TensorRT profile: %s", "; ".join(f"{n}: {profile.describe(n)}" for n in profile.shapes))
