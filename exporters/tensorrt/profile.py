"""The engine's optimisation profile: min/opt/max of every input, from the shapes the build really saw.

A per-batch padded input (MiniLM's sequence axis pads to each batch's longest sentence) varies on more than the
batch axis, so a profile that fixes every non-batch dim to one sample's is refused by ``set_input_shape`` for
every other batch. Here every dim the ONNX model leaves symbolic spans the range seen across the calibration
and evaluation batches (min = smallest, max = largest, opt = the benchmark sample's or the most common), the
batch axis spans 1 .. the largest batch any stage runs, and a dim the model fixes stays fixed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from dopt_common.errors import ExportError

log = logging.getLogger(__name__)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeProfile:
    """min/opt/max shape of every input, for the engine's optimization profile."""

    shapes: Mapping[str, tuple[Shape, Shape, Shape]]

    @classmethod
    def from_shapes(
        cls,
        seen: Iterable[Mapping[str, Sequence[int]]],
        *,
        max_batch: int,
        opt_batch: int,
        declared: Mapping[str, Sequence[int | None]] | None = None,
        opt: Mapping[str, Sequence[int]] | None = None,
    ) -> ShapeProfile:
        """A profile covering every shape in ``seen`` (one ``{input: shape}`` per batch).

        ``declared``: each input's ONNX dims (None where symbolic); a fixed dim stays fixed. ``opt``: the shapes
        to tune for (the benchmark sample's); a dim it leaves out of range falls back to the most common seen.
        """
        by_input: dict[str, list[Shape]] = {}
        for batch in seen:
            for name, shape in batch.items():
                by_input.setdefault(name, []).append(tuple(int(d) for d in shape))
        if not by_input:
            raise ExportError("no input shapes to build a TensorRT profile from; fix: pass the calibration batches")
        declared = declared or {}
        shapes = {}
        for name, observed in by_input.items():
            dims = declared.get(name)
            wanted = tuple(opt[name]) if opt and name in opt else None
            shapes[name] = _input_range(name, observed, dims, max_batch, opt_batch, wanted)
        return cls(shapes)

    def describe(self, name: str) -> str:
        """'min (1, 8) opt (16, 32) max (32, 64)' for one input, for error messages."""
        if name not in self.shapes:
            return f"no profile for input '{name}'"
        low, mid, high = self.shapes[name]
        return f"min {low} opt {mid} max {high}"


def _input_range(
    name: str,
    observed: list[Shape],
    dims: Sequence[int | None] | None,
    max_batch: int,
    opt_batch: int,
    wanted: Shape | None,
) -> tuple[Shape, Shape, Shape]:
    ranks = {len(s) for s in observed}
    rank = ranks.pop()
    if ranks or (dims is not None and len(dims) != rank):
        raise ExportError(
            f"input '{name}' comes with ranks {sorted({len(s) for s in observed})} (ONNX declares "
            f"{None if dims is None else len(dims)}); fix the data function so every batch has the model's rank"
        )
    low, mid, high = [], [], []
    for axis in range(rank):
        values = [s[axis] for s in observed]
        fixed = dims[axis] if dims is not None else None
        if fixed is not None:
            if any(v != fixed for v in values):
                raise ExportError(
                    f"input '{name}' axis {axis} is fixed at {fixed} in the ONNX model but batches have "
                    f"{sorted(set(values))}; fix: export that axis as dynamic or pad the data to {fixed}"
                )
            span = (fixed, fixed, fixed)
        elif axis == 0:
            top = max(max_batch, *values)
            span = (1, max(1, min(opt_batch, top)), top)
        else:
            span = _seen_span(values, None if wanted is None else wanted[axis])
        for target, value in zip((low, mid, high), span, strict=True):
            target.append(value)
    return tuple(low), tuple(mid), tuple(high)


def _seen_span(values: list[int], wanted: int | None) -> tuple[int, int, int]:
    """(smallest, opt, largest) of one varying axis; opt is ``wanted`` when in range, else the most common."""
    low, high = min(values), max(values)
    if wanted is not None and low <= wanted <= high:
        return low, wanted, high
    counts = Counter(values)
    common = max(counts, key=lambda v: (counts[v], v))  # ties: the larger, so kernels are tuned for it
    return low, common, high


def declared_dims(onnx_path: str | Path) -> dict[str, tuple[int | None, ...]]:
    """Each graph input's dims as the ONNX model declares them: an int where fixed, None where symbolic."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    found = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue  # no declared shape at all: every dim is taken as seen
        dims = tensor.shape.dim
        found[value.name] = tuple(_fixed(d) for d in dims)
    return found


def _fixed(dim: onnx.TensorShapeProto.Dimension) -> int | None:
    return int(dim.dim_value) if dim.HasField("dim_value") and dim.dim_value > 0 else None


def input_shapes(batches: Iterable[Mapping[str, Any]]) -> list[dict[str, Shape]]:
    """``{input: shape}`` per batch of arrays: all a profile needs, without holding the arrays."""
    return [{name: tuple(int(d) for d in array.shape) for name, array in b.items()} for b in batches]
