"""Fakes of TensorRT and cuda-python for CPU tests, faithful to the real APIs where the code touches them.

- ``parse_like_onnx_tensorrt``: onnx-tensorrt 10.x's naming in miniature. An initializer becomes a constant LAYER
  named after it (uniqued ``<name>_<n>`` on a clash), its output tensor keeps TensorRT's default name, a node's
  layer is named after the node and its output tensor after the ONNX output (ModelImporter.cpp ``parseGraph``,
  importerUtils.cpp ``convertToTensor``, onnxOpImporters.cpp ``QuantDequantLinearHelper``,
  ImporterContext.cpp ``registerLayer``, weightUtils.cpp ``generateUniqueName``).
- ``FakeCudart``: ``cuda.bindings.runtime``; every call returns ``(err,)`` or ``(err, value)``, ``cudaError_t`` is
  a plain Enum (so ``int(err)`` would fail, as on old cuda-python), device memory is host bytearrays.
- ``fake_tensorrt``: ``Runtime`` / ``ICudaEngine`` / ``IExecutionContext`` of TensorRT 10, whose
  ``set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3`` return bool; ``refuse`` makes one fail.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class LayerType(enum.Enum):
    CONSTANT = 1
    QUANTIZE = 2
    DEQUANTIZE = 3
    MATRIX_MULTIPLY = 4


class Tensor:
    def __init__(self, name: str, shape: tuple[int, ...] = ()) -> None:
        self.name, self.shape = name, shape


class Weights:
    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def numpy(self) -> np.ndarray:
        return self._array


class ILayer:
    """``get_layer`` hands back this base class: no ``weights`` until cast, as in TensorRT's Python API."""

    def __init__(self, index: int, kind: LayerType, inputs: list[Tensor], output: Tensor, array: Any = None):
        self.type, self._inputs, self._output, self._array, self.name = kind, inputs, output, array, ""

    def get_input(self, i: int) -> Tensor:
        return self._inputs[i]

    def get_output(self, i: int) -> Tensor:
        return self._output


class IConstantLayer(ILayer):
    @property
    def weights(self) -> Weights:
        return Weights(self._array)


class Network:
    def __init__(self) -> None:
        self.layers: list[ILayer] = []
        self.inputs: list[Tensor] = []

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, i: int) -> ILayer:
        layer = self.layers[i]
        layer.__class__ = ILayer  # every call returns the base type, like the real binding
        return layer

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> Tensor:
        return self.inputs[i]

    def add(self, kind: LayerType, inputs: list[Tensor], output_name: str | None, array: Any = None) -> ILayer:
        index = len(self.layers)
        name = output_name or f"(Unnamed Layer* {index}) [{kind.name.title()}]_output"  # TensorRT's default
        layer = ILayer(index, kind, inputs, Tensor(name), array)
        self.layers.append(layer)
        return layer


def parse_like_onnx_tensorrt(path: Path, taken: tuple[str, ...] = ()) -> Network:
    """onnx-tensorrt 10.x naming, in miniature (ModelImporter.cpp parseGraph, importerUtils.cpp convertToTensor,
    onnxOpImporters.cpp QuantDequantLinearHelper, ImporterContext.cpp registerLayer, weightUtils.cpp
    generateUniqueName). ``taken``: layer names already used by earlier layers."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    network, names, counter = Network(), set(taken), itertools.count()
    constants: dict[str, ILayer] = {}  # mConstantLayers, keyed by the unique layer name

    def unique(base: str) -> str:
        candidate = base
        while candidate in names:
            candidate = f"{base}_{next(counter)}"
        names.add(candidate)
        return candidate

    tensors = {}
    for value in model.graph.input:
        tensors[value.name] = Tensor(value.name)
        network.inputs.append(tensors[value.name])

    def to_tensor(name: str) -> Tensor:
        if name in tensors:
            return tensors[name]
        if name in constants:  # ctx->getConstantLayer(weights.getName())
            return constants[name].get_output(0)
        layer = network.add(LayerType.CONSTANT, [], None, inits[name])
        layer.name = unique(name)  # registerLayer names the LAYER; the output tensor keeps TensorRT's name
        constants[layer.name] = layer
        return layer.get_output(0)

    kinds = {"QuantizeLinear": LayerType.QUANTIZE, "DequantizeLinear": LayerType.DEQUANTIZE}
    for node in model.graph.node:
        inputs = [to_tensor(n) for n in node.input[:2]]
        if node.op_type in kinds and len(node.input) > 2:  # createZeroShifts: a new float temp constant
            zero = network.add(LayerType.CONSTANT, [], None, np.zeros_like(inits[node.input[2]], np.float32))
            zero.name = unique("tmp_weight")
            inputs.append(zero.get_output(0))
        layer = network.add(kinds.get(node.op_type, LayerType.MATRIX_MULTIPLY), inputs, node.output[0])
        layer.name = unique(node.name)
        tensors[node.output[0]] = layer.get_output(0)
    return network


def fake_trt_network_module() -> types.SimpleNamespace:
    return types.SimpleNamespace(LayerType=LayerType, IConstantLayer=IConstantLayer)


def ort_style_qdq_model(path: Path) -> Path:
    """x → Q/DQ → MatMul(DQ(int8 W, per channel)) → Q/DQ → y, named as ORT's QDQQuantizer names things."""
    rng = np.random.default_rng(3)
    w_q = rng.integers(-127, 128, (4, 3), dtype=np.int8)
    inits = {
        "x_scale": np.float32(0.02), "x_zero_point": np.int8(0),
        "W_quantized": w_q, "W_scale": np.array([0.011, 0.013, 0.017], np.float32),
        "W_zero_point": np.zeros(3, np.int8),
        "mm_scale": np.float32(0.05), "mm_zero_point": np.int8(0),
    }  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_QuantizeLinear_Output"],
                         name="x_QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["x_QuantizeLinear_Output", "x_scale", "x_zero_point"],
                         ["x_DequantizeLinear_Output"], name="x_DequantizeLinear"),
        helper.make_node("DequantizeLinear", ["W_quantized", "W_scale", "W_zero_point"],
                         ["W_DequantizeLinear_Output"], name="W_DequantizeLinear", axis=1),
        helper.make_node("MatMul", ["x_DequantizeLinear_Output", "W_DequantizeLinear_Output"],
                         ["mm_QuantizeLinear_Input"], name="mm"),
        helper.make_node("QuantizeLinear", ["mm_QuantizeLinear_Input", "mm_scale", "mm_zero_point"],
                         ["mm_QuantizeLinear_Output"], name="mm_QuantizeLinear"),
        helper.make_node("DequantizeLinear", ["mm_QuantizeLinear_Output", "mm_scale", "mm_zero_point"],
                         ["y"], name="mm_DequantizeLinear"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def as_float32(values: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, np.float32))


class cudaError_t(enum.Enum):  # cuda-python's name; a plain Enum, so int(err) would be a bug
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2


class cudaMemcpyKind(enum.Enum):
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2


class Handle:
    """cudaStream_t / cudaEvent_t: an opaque object whose int() is the raw handle."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class FakeCudart:
    """cuda.bindings.runtime: every call returns (err,) or (err, value); device memory is host bytearrays."""

    cudaError_t, cudaMemcpyKind = cudaError_t, cudaMemcpyKind

    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}
        self.timeline: list[tuple] = []
        self.streams: list[Handle] = []
        self.events: list[Handle] = []
        self.destroyed: list[Handle] = []
        self.elapsed = itertools.cycle([3.0, 1.0, 2.0])
        self.fail_malloc = False
        self._next = itertools.count(0x7000_0000, 0x10_0000)

    def cudaMalloc(self, size: int) -> tuple:
        if self.fail_malloc:
            return (cudaError_t.cudaErrorMemoryAllocation, 0)
        ptr = next(self._next)
        self.memory[ptr] = bytearray(size)
        self.timeline.append(("malloc", ptr, size))
        return (cudaError_t.cudaSuccess, ptr)

    def cudaFree(self, ptr: int) -> tuple:
        del self.memory[ptr]
        self.timeline.append(("free", ptr))
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: cudaMemcpyKind, stream: Handle) -> tuple:
        assert isinstance(kind, cudaMemcpyKind) and stream in self.streams
        if kind is cudaMemcpyKind.cudaMemcpyHostToDevice:
            assert count <= len(self.memory[dst]), "copy past the device buffer"
            self.memory[dst][:count] = ctypes.string_at(src, count)
        else:
            assert count <= len(self.memory[src]), "copy past the device buffer"
            ctypes.memmove(dst, bytes(self.memory[src][:count]), count)
        self.timeline.append(("copy", kind.name, int(stream)))
        return (cudaError_t.cudaSuccess,)

    def cudaStreamCreate(self) -> tuple:
        self.streams.append(Handle(0x5000 + len(self.streams)))
        return (cudaError_t.cudaSuccess, self.streams[-1])

    def cudaStreamSynchronize(self, stream: Handle) -> tuple:
        self.timeline.append(("sync", int(stream)))
        return (cudaError_t.cudaSuccess,)

    def cudaStreamDestroy(self, stream: Handle) -> tuple:
        self.destroyed.append(stream)
        return (cudaError_t.cudaSuccess,)

    def cudaEventCreate(self) -> tuple:
        self.events.append(Handle(0x9000 + len(self.events)))
        return (cudaError_t.cudaSuccess, self.events[-1])

    def cudaEventRecord(self, event: Handle, stream: Handle) -> tuple:
        self.timeline.append(("record", int(event), int(stream)))
        return (cudaError_t.cudaSuccess,)

    def cudaEventElapsedTime(self, start: Handle, end: Handle) -> tuple:
        return (cudaError_t.cudaSuccess, next(self.elapsed))

    def cudaEventDestroy(self, event: Handle) -> tuple:
        self.destroyed.append(event)
        return (cudaError_t.cudaSuccess,)


class DataType(enum.Enum):
    INT64 = 1
    FLOAT = 2


class TensorIOMode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


PROFILE = ((1, 1), (8, 16), (8, 16))  # min, opt, max of (batch, seq)
INPUTS = ("input_ids", "attention_mask")


def reference(ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """What the fake engine computes: a pooled embedding and a per-token output."""
    pooled = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)
    return [np.concatenate([pooled, pooled * 2], axis=1), (ids * mask * 0.5).astype(np.float32)]


class FakeContext:
    """IExecutionContext: set_input_shape / set_tensor_address / execute_async_v3 return bool, as in TRT 10."""

    def __init__(self, cudart: FakeCudart, refuse: str | None) -> None:
        self.cudart, self.refuse = cudart, refuse
        self.shapes = {n: (-1, -1) for n in INPUTS}
        self.addresses: dict[str, int] = {}
        self.executed_on: list[Any] = []

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        low, _, high = PROFILE
        shape = tuple(shape)
        if self.refuse == "set_input_shape" or not all(a <= d <= b for a, d, b in zip(low, shape, high, strict=True)):
            return False
        self.shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        batch, seq = self.shapes["input_ids"]
        return {"embedding": (batch, 2), "per_token": (batch, seq)}.get(name) or self.shapes[name]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return self.refuse != "set_tensor_address"

    def execute_async_v3(self, stream_handle: int) -> bool:
        self.executed_on.append(stream_handle)
        self.cudart.timeline.append(("execute", stream_handle))
        if self.refuse == "execute_async_v3" or not isinstance(stream_handle, int):
            return False
        shape = self.shapes["input_ids"]
        count = int(np.prod(shape))
        memory = self.cudart.memory
        ids, mask = (np.frombuffer(memory[self.addresses[n]], np.int64, count).reshape(shape) for n in INPUTS)
        for name, out in zip(("embedding", "per_token"), reference(ids, mask), strict=True):
            buffer = self.cudart.memory[self.addresses[name]]
            assert out.nbytes <= len(buffer), "output buffer too small"
            buffer[: out.nbytes] = out.tobytes()
        return True


class FakeEngine:
    def __init__(self, cudart: FakeCudart, refuse: str | None) -> None:
        self.context = FakeContext(cudart, refuse)
        self.names = [*INPUTS, "embedding", "per_token"]

    num_io_tensors = 4

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if name in INPUTS else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType.INT64 if name in INPUTS else DataType.FLOAT

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 2) if name == "embedding" else (-1, -1)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        assert name in INPUTS and profile_index == 0
        return [*PROFILE]

    def create_execution_context(self) -> FakeContext:
        return self.context


def fake_tensorrt(cudart: FakeCudart, refuse: str | None = None) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.16.0"
    trt.Logger = type("Logger", (), {"WARNING": 2, "ERROR": 1, "__init__": lambda self, level=2: None})
    trt.TensorIOMode, trt.DataType = TensorIOMode, DataType
    trt.nptype = lambda t: {DataType.INT64: np.int64, DataType.FLOAT: np.float32}[t]
    trt.engines = []

    class Runtime:
        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> FakeEngine | None:
            if data != b"fake plan":
                return None
            trt.engines.append(FakeEngine(cudart, refuse))
            return trt.engines[-1]

    trt.Runtime = Runtime
    return trt
