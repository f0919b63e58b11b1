"""Fakes of TensorRT for CPU tests, built from the API-surface table ``tests/data/tensorrt_api.json``.

Every fake class is an ``api_surface.Surface`` naming the table class it stands for: a member the table lacks
raises, and arguments and results are checked against the declared types. So ``IConstantLayer.weights`` is a
``numpy.ndarray``, as ``utils::weights_to_numpy`` makes it in the real bindings (pyGraph.cpp), and code that calls
``.numpy()`` on it fails here as it does on a GPU.

- ``parse_like_onnx_tensorrt``: onnx-tensorrt 10.x's naming in miniature. An initializer becomes a constant LAYER
  named after it (uniqued ``<name>_<n>`` on a clash), its output tensor keeps TensorRT's default name, a node's
  layer is named after the node and its output tensor after the ONNX output (ModelImporter.cpp ``parseGraph``,
  importerUtils.cpp ``convertToTensor``, onnxOpImporters.cpp ``QuantDequantLinearHelper``,
  ImporterContext.cpp ``registerLayer``, weightUtils.cpp ``generateUniqueName``).
- ``fake_tensorrt``: the module of one TensorRT version (the table's newest unless told): ``Builder`` /
  ``OnnxParser`` / ``IBuilderConfig`` (an engine build runs end to end, its plan is ``b"fake plan"``), and
  ``Runtime`` / ``ICudaEngine`` / ``IExecutionContext``, whose ``set_input_shape`` / ``set_tensor_address`` /
  ``execute_async_v3`` return bool; ``refuse`` makes one fail.
- ``FakeCudart`` (``fake_cuda.py``): ``cuda.bindings.runtime``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from api_surface import Surface, SurfaceModule, enums, imitated
from fake_cuda import FakeCudart
from onnx import numpy_helper
from trt_qdq_model import as_float32, ort_style_qdq_model

__all__ = ["FakeCudart", "as_float32", "fake_tensorrt", "ort_style_qdq_model", "parse_like_onnx_tensorrt", "reference"]
TRT = enums("tensorrt")
LayerType, DataType, TensorIOMode = TRT["LayerType"], TRT["DataType"], TRT["TensorIOMode"]
Severity = TRT["Logger.Severity"]
PLAN = b"fake plan"


class ITensor(Surface):
    api = "ITensor"

    def __init__(self, name: str, shape: tuple[int, ...] = ()) -> None:
        self._name, self._shape = name, shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape


Tensor = ITensor


class ILayer(Surface):
    """``get_layer`` hands back this base class: no ``weights`` until cast, as in TensorRT's Python API."""

    api = "ILayer"

    def __init__(self, kind: Any, inputs: list[ITensor], output: ITensor, array: np.ndarray | None = None) -> None:
        self._type, self._inputs, self._output, self._array, self._name = kind, inputs, output, array, ""

    @property
    def name(self) -> str:
        return self._name

    @property
    def type(self) -> Any:
        return self._type

    def get_input(self, i: int) -> ITensor:
        return self._inputs[i]

    def get_output(self, i: int) -> ITensor:
        return self._output


class IConstantLayer(ILayer):
    api = "IConstantLayer"

    @property
    def weights(self) -> np.ndarray:
        return self._array  # pyGraph.cpp: utils::weights_to_numpy, a view of the layer's FP32 weights


class INetworkDefinition(Surface):
    api = "INetworkDefinition"

    def __init__(self) -> None:
        self._layers: list[ILayer] = []
        self._inputs: list[ITensor] = []

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def get_layer(self, i: int) -> ILayer:
        layer = self._layers[i]
        layer.__class__ = ILayer  # every call returns the base type, like the real binding
        return layer

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    def get_input(self, i: int) -> ITensor:
        return self._inputs[i]

    def _add(self, kind: Any, inputs: list[ITensor], output_name: str | None, array: Any = None) -> ILayer:
        index = len(self._layers)
        name = output_name or f"(Unnamed Layer* {index}) [{kind.name.title()}]_output"  # TensorRT's default
        layer = ILayer(kind, inputs, ITensor(name), array)
        self._layers.append(layer)
        return layer


Network = INetworkDefinition


def parse_like_onnx_tensorrt(path: Path, taken: tuple[str, ...] = ()) -> Network:
    """onnx-tensorrt 10.x naming, in miniature (ModelImporter.cpp parseGraph, importerUtils.cpp convertToTensor,
    onnxOpImporters.cpp QuantDequantLinearHelper, ImporterContext.cpp registerLayer, weightUtils.cpp
    generateUniqueName). ``taken``: layer names already used by earlier layers."""
    return _parse_into(INetworkDefinition(), path, taken)


def _parse_into(network: INetworkDefinition, path: Path, taken: tuple[str, ...] = ()) -> INetworkDefinition:
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    names, counter = set(taken), itertools.count()
    constants: dict[str, ILayer] = {}  # mConstantLayers, keyed by the unique layer name

    def unique(base: str) -> str:
        candidate = base
        while candidate in names:
            candidate = f"{base}_{next(counter)}"
        names.add(candidate)
        return candidate

    tensors = {}
    for value in model.graph.input:
        tensors[value.name] = ITensor(value.name, _dims(value))
        network._inputs.append(tensors[value.name])

    def to_tensor(name: str) -> Tensor:
        if name in tensors:
            return tensors[name]
        if name in constants:  # ctx->getConstantLayer(weights.getName())
            return constants[name].get_output(0)
        layer = network._add(LayerType.CONSTANT, [], None, inits[name])
        layer._name = unique(name)  # registerLayer names the LAYER; the output tensor keeps TensorRT's name
        constants[layer.name] = layer
        return layer.get_output(0)

    kinds = {"QuantizeLinear": LayerType.QUANTIZE, "DequantizeLinear": LayerType.DEQUANTIZE}
    for node in model.graph.node:
        inputs = [to_tensor(n) for n in node.input[:2]]
        if node.op_type in kinds and len(node.input) > 2:  # createZeroShifts: a new float temp constant
            zero = network._add(LayerType.CONSTANT, [], None, np.zeros_like(inits[node.input[2]], np.float32))
            zero._name = unique("tmp_weight")
            inputs.append(zero.get_output(0))
        layer = network._add(kinds.get(node.op_type, LayerType.MATRIX_MULTIPLY), inputs, node.output[0])
        layer._name = unique(node.name)
        tensors[node.output[0]] = layer.get_output(0)
    return network


def _dims(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)


PROFILE = ((1, 1), (8, 16), (8, 16))  # min, opt, max of (batch, seq)
INPUTS = ("input_ids", "attention_mask")


def reference(ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """What the fake engine computes: a pooled embedding and a per-token output."""
    pooled = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)
    return [np.concatenate([pooled, pooled * 2], axis=1), (ids * mask * 0.5).astype(np.float32)]


class ParserError(Surface):
    api = "ParserError"

    def __init__(self, text: str) -> None:
        self._text = text

    def __str__(self) -> str:
        return self._text


class OnnxParser(Surface):
    """Parses into the network as onnx-tensorrt names things (``parse_like_onnx_tensorrt``)."""

    api = "OnnxParser"

    def __init__(self, network: INetworkDefinition, logger: Any) -> None:
        self._network, self._errors = network, []

    def parse_from_file(self, path: str) -> bool:
        if not Path(path).is_file():
            self._errors.append(ParserError(f"ModelImporter.cpp: failed to open {path}"))
            return False
        _parse_into(self._network, Path(path))
        return True

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, i: int) -> ParserError:
        return self._errors[i]


class IOptimizationProfile(Surface):
    api = "IOptimizationProfile"

    def __init__(self) -> None:
        self._shapes: dict[str, tuple] = {}

    def set_shape(self, name: str, low: tuple, opt: tuple, high: tuple) -> None:
        self._shapes[name] = (tuple(low), tuple(opt), tuple(high))


class IBuilderConfig(Surface):
    api = "IBuilderConfig"

    def __init__(self) -> None:
        self._flags, self._pools, self._profiles = set(), {}, []
        self._verbosity = None

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self._pools[pool] = size

    def set_flag(self, flag: Any) -> None:
        self._flags.add(flag)

    @property
    def profiling_verbosity(self) -> Any:
        return self._verbosity

    @profiling_verbosity.setter
    def profiling_verbosity(self, value: Any) -> None:
        self._verbosity = value

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1


class IHostMemory(Surface):
    api = "IHostMemory"

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __bytes__(self) -> bytes:  # the real one exports the buffer protocol
        return self._data


class Builder(Surface):
    api = "Builder"

    def __init__(self, logger: Any) -> None:
        self._built: list[tuple[INetworkDefinition, IBuilderConfig, int]] = []
        self._flags = 0

    def create_network(self, flags: int) -> INetworkDefinition:
        self._flags = flags
        return INetworkDefinition()

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        self._built.append((network, config, self._flags))
        return IHostMemory(PLAN)


class IExecutionContext(Surface):
    """set_input_shape / set_tensor_address / execute_async_v3 return bool, as in TRT 10."""

    api = "IExecutionContext"

    def __init__(self, cudart: FakeCudart, refuse: str | None) -> None:
        self._cudart, self._refuse = cudart, refuse
        self._shapes = {n: (-1, -1) for n in INPUTS}
        self._addresses: dict[str, int] = {}
        self._executed_on: list[Any] = []

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        low, _, high = PROFILE
        shape = tuple(shape)
        if self._refuse == "set_input_shape" or not all(a <= d <= b for a, d, b in zip(low, shape, high, strict=True)):
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        batch, seq = self._shapes["input_ids"]
        return {"embedding": (batch, 2), "per_token": (batch, seq)}.get(name) or self._shapes[name]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self._addresses[name] = ptr
        return self._refuse != "set_tensor_address"

    def execute_async_v3(self, stream_handle: int) -> bool:
        self._executed_on.append(stream_handle)
        self._cudart.timeline.append(("execute", stream_handle))
        if self._refuse == "execute_async_v3":
            return False
        shape = self._shapes["input_ids"]
        count = int(np.prod(shape))
        memory = self._cudart.memory
        ids, mask = (np.frombuffer(memory[self._addresses[n]], np.int64, count).reshape(shape) for n in INPUTS)
        for name, out in zip(("embedding", "per_token"), reference(ids, mask), strict=True):
            buffer = memory[self._addresses[name]]
            assert out.nbytes <= len(buffer), "output buffer too small"
            buffer[: out.nbytes] = out.tobytes()
        return True


class ICudaEngine(Surface):
    api = "ICudaEngine"
    num_io_tensors = 4

    def __init__(self, cudart: FakeCudart, refuse: str | None) -> None:
        self._context = IExecutionContext(cudart, refuse)
        self._names = [*INPUTS, "embedding", "per_token"]

    def get_tensor_name(self, i: int) -> str:
        return self._names[i]

    def get_tensor_mode(self, name: str) -> Any:
        return TensorIOMode.INPUT if name in INPUTS else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> Any:
        return DataType.INT64 if name in INPUTS else DataType.FLOAT

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 2) if name == "embedding" else (-1, -1)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        assert name in INPUTS and profile_index == 0
        return [*PROFILE]

    def create_execution_context(self) -> IExecutionContext:
        return self._context


class Logger:
    ERROR, WARNING = Severity.ERROR, Severity.WARNING

    def __init__(self, level: Any = Severity.WARNING) -> None:
        self.level = level


def fake_tensorrt(cudart: FakeCudart | None = None, refuse: str | None = None, version: str | None = None) -> Any:
    """The ``tensorrt`` module of ``version`` (default: the newest the table holds): its names and enum members are
    the table's for that version (``BuilderFlag.INT8`` raises under 11.x); ``trt._engines``: the engines it
    deserialized."""
    imitates = imitated("tensorrt", version)
    engines: list[ICudaEngine] = []

    class Runtime(Surface):
        api = "Runtime"

        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
            if data != PLAN:
                return None
            engines.append(ICudaEngine(cudart or FakeCudart(), refuse))
            return engines[-1]

    numpy_types = {
        DataType.INT64: np.int64,
        DataType.FLOAT: np.float32,
        DataType.HALF: np.float16,
        DataType.INT8: np.int8,
        DataType.INT32: np.int32,
        DataType.BOOL: np.bool_,
    }
    versioned = enums("tensorrt", imitates)
    enum_names = {name: versioned[name] for name in versioned if "." not in name}
    return SurfaceModule(
        "tensorrt",
        "tensorrt",
        {
            "__version__": version or imitates,
            "nptype": numpy_types.__getitem__,
            "Logger": Logger,
            "Builder": Builder,
            "Runtime": Runtime,
            "OnnxParser": OnnxParser,
            "IConstantLayer": IConstantLayer,
            **enum_names,
            "_engines": engines,
        },
        imitates,
    )


def fake_trt_network_module() -> Any:
    """The fake ``tensorrt`` module, for the scale readback alone."""
    return fake_tensorrt()
