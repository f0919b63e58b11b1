"""A fake of cuda-python's ``cuda.bindings.runtime``, built from the ``cuda_runtime`` part of the API table.

Every call returns ``(err,)`` or ``(err, value)`` as the table declares (``api_surface.SurfaceModule`` checks each
argument and result); ``cudaError_t`` is a plain Enum (so ``int(err)`` would fail, as on old cuda-python); streams
and events are opaque handles whose ``int()`` is the raw handle; device memory is host bytearrays.
"""

from __future__ import annotations

import ctypes
import itertools

from api_surface import REGISTRY, SurfaceModule, enums

CUDA = enums("cuda_runtime")
cudaError_t, cudaMemcpyKind = CUDA["cudaError_t"], CUDA["cudaMemcpyKind"]
OK = cudaError_t.cudaSuccess


class Handle:
    """An opaque CUDA handle whose int() is the raw value."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class cudaStream_t(Handle):  # noqa: N801  (cuda-python's names)
    pass


class cudaEvent_t(Handle):  # noqa: N801
    pass


REGISTRY |= {"cudaStream_t": cudaStream_t, "cudaEvent_t": cudaEvent_t}
FUNCTIONS = (
    "cudaGetDeviceCount",
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpyAsync",
    "cudaStreamCreate",
    "cudaStreamSynchronize",
    "cudaStreamDestroy",
    "cudaEventCreate",
    "cudaEventRecord",
    "cudaEventElapsedTime",
    "cudaEventDestroy",
)


class FakeCudart:
    """The runtime's state (memory, a timeline of calls); ``module()`` is what code imports."""

    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}
        self.timeline: list[tuple] = []
        self.streams: list[cudaStream_t] = []
        self.events: list[cudaEvent_t] = []
        self.destroyed: list[Handle] = []
        self.elapsed = itertools.cycle([3.0, 1.0, 2.0])
        self.fail_malloc = False
        self._next = itertools.count(0x7000_0000, 0x10_0000)

    def module(self) -> SurfaceModule:
        """``cuda.bindings.runtime`` over this state, checked against the table."""
        values = {name: getattr(self, name) for name in FUNCTIONS}
        return SurfaceModule("cuda.bindings.runtime", "cuda_runtime", {**values, **CUDA})

    def cudaGetDeviceCount(self) -> tuple:
        return (OK, 1)

    def cudaMalloc(self, size: int) -> tuple:
        if self.fail_malloc:
            return (cudaError_t.cudaErrorMemoryAllocation, 0)
        ptr = next(self._next)
        self.memory[ptr] = bytearray(size)
        self.timeline.append(("malloc", ptr, size))
        return (OK, ptr)

    def cudaFree(self, ptr: int) -> tuple:
        del self.memory[ptr]
        self.timeline.append(("free", ptr))
        return (OK,)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind, stream: cudaStream_t) -> tuple:
        assert stream in self.streams
        if kind is cudaMemcpyKind.cudaMemcpyHostToDevice:
            assert count <= len(self.memory[dst]), "copy past the device buffer"
            self.memory[dst][:count] = ctypes.string_at(src, count)
        else:
            assert count <= len(self.memory[src]), "copy past the device buffer"
            ctypes.memmove(dst, bytes(self.memory[src][:count]), count)
        self.timeline.append(("copy", kind.name, int(stream)))
        return (OK,)

    def cudaStreamCreate(self) -> tuple:
        self.streams.append(cudaStream_t(0x5000 + len(self.streams)))
        return (OK, self.streams[-1])

    def cudaStreamSynchronize(self, stream: cudaStream_t) -> tuple:
        self.timeline.append(("sync", int(stream)))
        return (OK,)

    def cudaStreamDestroy(self, stream: cudaStream_t) -> tuple:
        self.destroyed.append(stream)
        return (OK,)

    def cudaEventCreate(self) -> tuple:
        self.events.append(cudaEvent_t(0x9000 + len(self.events)))
        return (OK, self.events[-1])

    def cudaEventRecord(self, event: cudaEvent_t, stream: cudaStream_t) -> tuple:
        self.timeline.append(("record", int(event), int(stream)))
        return (OK,)

    def cudaEventElapsedTime(self, start: cudaEvent_t, end: cudaEvent_t) -> tuple:
        return (OK, next(self.elapsed))

    def cudaEventDestroy(self, event: cudaEvent_t) -> tuple:
        self.destroyed.append(event)
        return (OK,)
