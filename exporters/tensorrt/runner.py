"""Running a TensorRT engine on host arrays: buffers allocated once, its own CUDA stream, CUDA-event timing.

The CUDA calls follow cuda-python's ``cuda.bindings.runtime`` (``cuda.cudart`` before 12.6): every call returns
a tuple whose first item is a ``cudaError_t`` (``(err,)`` or ``(err, value)``), compared with
``cudaError_t.cudaSuccess`` as TensorRT's own ``samples/python/common_runtime.py`` does. Device buffers are
sized for each input's profile maximum (and the outputs that shape gives) when the runner is made, and grown
only if a call needs more. The execute alone is timed, between two events recorded on the runner's stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.deps import require
from dopt_common.errors import ExportError
from dopt_common.timer import fixed, median_ms, time_rounds, warm_up
from dopt_common.timer import runner as timed

log = logging.getLogger(__name__)


def cuda_runtime() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before cuda-python 12.6)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        cudart = require("cuda.cudart", purpose="running a TensorRT engine", extra="tensorrt")
    return cudart


def checked(cudart: Any, result: tuple, what: str) -> Any:
    """The value of a cuda-python call's ``(err, value)`` tuple (None for ``(err,)``); an error raises."""
    err, *rest = result
    if err != cudart.cudaError_t.cudaSuccess:
        raise ExportError(f"CUDA call {what} failed with {getattr(err, 'name', err)}; fix: check the GPU and driver")
    return rest[0] if rest else None


class EngineRunner:
    """A TensorRT engine bound to preallocated device buffers and a stream; call it with ``{input: array}``.

    ``last_execute_ms`` is the CUDA-event time of the last ``execute_async_v3``. Use it as a context manager or
    call ``close()``: the buffers, events and stream are freed there.
    """

    def __init__(self, engine_path: str | Path) -> None:
        trt = require("tensorrt", purpose="running a TensorRT engine", extra="tensorrt")
        self._cudart, self.path = cuda_runtime(), Path(engine_path)
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))  # must outlive the engine
        self._engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self._engine is None:
            raise ExportError(f"TensorRT could not load engine '{self.path}'; fix: rebuild it with this TensorRT")
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise ExportError(f"TensorRT could not create an execution context for '{self.path}' (GPU memory?)")
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        output_mode = trt.TensorIOMode.OUTPUT
        self.inputs = [n for n in names if self._engine.get_tensor_mode(n) != output_mode]
        self.outputs = [n for n in names if self._engine.get_tensor_mode(n) == output_mode]
        self._dtypes = {n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in names}
        self._buffers: dict[str, tuple[int, int]] = {}  # name → (device pointer, bytes)
        self._stream = self._start = self._end = None
        self.last_execute_ms: float | None = None
        self.allocations = 0
        try:
            self._stream = checked(self._cudart, self._cudart.cudaStreamCreate(), "cudaStreamCreate")
            self._start = checked(self._cudart, self._cudart.cudaEventCreate(), "cudaEventCreate")
            self._end = checked(self._cudart, self._cudart.cudaEventCreate(), "cudaEventCreate")
            self._preallocate()
        except BaseException:
            self.close()
            raise

    def profile_range(self, name: str) -> str:
        """'min (1, 8) opt (8, 16) max (32, 64)' of an input in the engine's profile 0, for messages."""
        fixed = tuple(self._engine.get_tensor_shape(name))
        if all(d >= 0 for d in fixed):
            return f"fixed {fixed}"
        low, mid, high = (tuple(s) for s in self._engine.get_tensor_profile_shape(name, 0))
        return f"min {low} opt {mid} max {high}"

    def _preallocate(self) -> None:
        """Buffers for every input at its profile maximum, and for the outputs that shape gives."""
        for name in self.inputs:
            shape = tuple(self._engine.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                shape = tuple(self._engine.get_tensor_profile_shape(name, 0)[2])
                self._set_shape(name, shape)
            self._reserve(name, int(np.prod(shape)) * self._dtypes[name].itemsize)
        for name in self.outputs:
            self._reserve(name, self._output_nbytes(name))

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._context.set_input_shape(name, shape):
            raise ExportError(
                f"TensorRT refused input '{name}' of shape {shape}: the engine's profile is {self.profile_range(name)}"
                "; fix: rebuild with calibration data that covers this shape, or pad/split the batch into the range"
            )

    def _reserve(self, name: str, nbytes: int) -> None:
        """Make ``name``'s device buffer at least ``nbytes`` (free and malloc only when it must grow)."""
        held = self._buffers.get(name)
        if held is not None and held[1] >= nbytes:
            return
        if held is not None:
            checked(self._cudart, self._cudart.cudaFree(held[0]), f"cudaFree({name})")
            del self._buffers[name]
        ptr = checked(self._cudart, self._cudart.cudaMalloc(max(nbytes, 1)), f"cudaMalloc({name}, {nbytes})")
        self._buffers[name] = (int(ptr), max(nbytes, 1))
        self.allocations += 1
        if not self._context.set_tensor_address(name, int(ptr)):
            raise ExportError(f"TensorRT refused the device address of tensor '{name}' ({nbytes} bytes)")

    def _output_nbytes(self, name: str) -> int:
        shape = tuple(self._context.get_tensor_shape(name))
        if any(d < 0 for d in shape):
            raise ExportError(
                f"output '{name}' has a data-dependent shape {shape}; this runner needs shapes known from the inputs"
            )
        return int(np.prod(shape)) * self._dtypes[name].itemsize

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once: host inputs in, host outputs (in the engine's output order) back."""
        if self._stream is None:
            raise ExportError(f"the runner of '{self.path}' is closed; fix: make a new one with engine_runner()")
        unknown = sorted(set(feeds) - set(self.inputs))
        missing = [n for n in self.inputs if n not in feeds]
        if unknown or missing:
            raise ExportError(f"engine '{self.path.name}' takes inputs {self.inputs}; got {sorted(feeds)}")
        arrays = {n: np.ascontiguousarray(feeds[n], dtype=self._dtypes[n]) for n in self.inputs}
        for name, array in arrays.items():
            if tuple(self._context.get_tensor_shape(name)) != array.shape:
                self._set_shape(name, array.shape)
            self._reserve(name, array.nbytes)
        host = {n: np.empty(tuple(self._context.get_tensor_shape(n)), self._dtypes[n]) for n in self.outputs}
        for name in host:
            self._reserve(name, self._output_nbytes(name))
        self._enqueue(arrays, host)
        return [host[n] for n in self.outputs]

    def in_order(self, names: Sequence[str]) -> Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]:
        """A runner whose outputs come in ``names``' order (an ONNX graph's outputs), matched by name: the
        engine's own order is TensorRT's, which nothing promises to be the graph's."""
        if sorted(names) != sorted(self.outputs):
            raise ExportError(
                f"engine '{self.path.name}' has outputs {self.outputs}, the ONNX model {list(names)}; fix: rebuild the "
                "engine from this build's model"
            )

        def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            produced = dict(zip(self.outputs, self(feeds), strict=True))
            return [produced[name] for name in names]

        return run

    def _enqueue(self, arrays: dict[str, np.ndarray], host: dict[str, np.ndarray]) -> None:
        cudart, stream = self._cudart, self._stream
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, array in arrays.items():
            copy = cudart.cudaMemcpyAsync(self._buffers[name][0], array.ctypes.data, array.nbytes, to_device, stream)
            checked(cudart, copy, f"cudaMemcpyAsync({name}, host to device)")
        checked(cudart, cudart.cudaEventRecord(self._start, stream), "cudaEventRecord(start)")
        if not self._context.execute_async_v3(int(stream)):
            cudart.cudaStreamSynchronize(stream)  # the queued copies finish before anything is freed
            shapes = "; ".join(f"'{n}' {a.shape} (profile {self.profile_range(n)})" for n, a in arrays.items())
            raise ExportError(f"TensorRT engine '{self.path.name}' failed to execute on inputs {shapes}")
        checked(cudart, cudart.cudaEventRecord(self._end, stream), "cudaEventRecord(end)")
        for name, array in host.items():
            copy = cudart.cudaMemcpyAsync(array.ctypes.data, self._buffers[name][0], array.nbytes, to_host, stream)
            checked(cudart, copy, f"cudaMemcpyAsync({name}, device to host)")
        checked(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        self.last_execute_ms = float(checked(cudart, cudart.cudaEventElapsedTime(self._start, self._end), "timing"))

    def close(self) -> None:
        """Free the device buffers, the events and the stream; calling it again does nothing."""
        cudart = self._cudart
        for ptr, _ in self._buffers.values():
            checked(cudart, cudart.cudaFree(ptr), "cudaFree")
        self._buffers.clear()
        for event in (self._start, self._end):
            if event is not None:
                checked(cudart, cudart.cudaEventDestroy(event), "cudaEventDestroy")
        if self._stream is not None:
            checked(cudart, cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
        self._stream = self._start = self._end = None

    def __enter__(self) -> EngineRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_runner(engine_path: str | Path) -> EngineRunner:
    """A runner of the engine at ``engine_path`` on host arrays (close it, or use it in a ``with`` block)."""
    return EngineRunner(engine_path)


def time_runner(runner: EngineRunner, feeds: Mapping[str, np.ndarray], repeats: int = 50, warmup: int = 5) -> float:
    """Median CUDA-event milliseconds of the engine's execute alone (no copies, no allocation), after warm-up."""

    def execute() -> float:
        runner(feeds)
        return runner.last_execute_ms

    runs = {"engine": execute}
    warm_up(runs, warmup)
    return median_ms(time_rounds(runs, fixed(repeats))["engine"])


def wall_median_ms(run: Callable[[Any], Any], feeds: Any, repeats: int = 50, warmup: int = 5) -> float:
    """Median wall-clock milliseconds of ``run(feeds)`` after warm-up (host copies included)."""
    runs = {"run": timed(run, feeds)}
    warm_up(runs, warmup)
    return median_ms(time_rounds(runs, fixed(repeats))["run"])
