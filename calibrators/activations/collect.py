"""Activation collection: run the FP32 ONNX model in ONNX Runtime with the chosen tensors exposed.

Streams batch by batch, so memory holds one batch of activations at a time. Inputs may change shape from
batch to batch (dynamic batch and sequence axes).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from dopt_common.errors import NumericsError
from dopt_common.ort import create_session

log = logging.getLogger(__name__)
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


class Observer(Protocol):
    """What collection feeds: one call per tensor per batch."""

    def update(self, name: str, values: np.ndarray, where: str = "") -> None: ...


def select_tensors(model: onnx.ModelProto, op_types: Iterable[str]) -> list[str]:
    """Float activations entering or leaving a node of ``op_types`` (never initializers), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    elem = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    initializers = {i.name for i in graph.initializer}
    wanted = set(op_types)
    names: list[str] = []
    for node in graph.node:
        if node.op_type not in wanted:
            continue
        for name in [*node.input, *node.output]:
            if name and name not in initializers and name not in names and elem.get(name, 1) in FLOAT_TYPES:
                names.append(name)
    return names


def expose_tensors(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs include ``names``."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    return exposed


def _first_bad_row(value: np.ndarray) -> int:
    """The first index along the batch axis holding a NaN or Inf."""
    rows = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    return int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])


def _observe(observer: Observer, names: list[str], values: list[np.ndarray], index: int, first: int) -> None:
    """Feed one batch's tensors to the observer; a NaN or Inf names the tensor and the sample."""
    for name, value in zip(names, values, strict=True):
        if value.dtype.kind != "f":
            continue
        try:
            observer.update(name, value, where=f"in calibration batch {index}")
        except NumericsError as exc:
            raise NumericsError(
                f"calibration: tensor '{name}' is NaN or Inf for sample {first + _first_bad_row(value)} "
                f"(batch {index}); fix the model or that input"
            ) from exc


def collect(
    onnx_path: str | Path,
    batches: Iterable[dict[str, np.ndarray]],
    names: list[str],
    observer: Observer,
    threads: int | None = None,
) -> int:
    """Run every batch and feed each exposed tensor to ``observer``; returns the number of samples seen."""
    model = onnx.load(str(onnx_path))
    exposed = expose_tensors(model, names)
    with tempfile.TemporaryDirectory(prefix="deploy_opt.collect.") as tmp:
        path = Path(tmp) / "exposed.onnx"
        # External data keeps large models under protobuf's 2 GB limit; it costs nothing for small ones.
        onnx.save_model(exposed, str(path), save_as_external_data=True, location="exposed.onnx.data")
        # Optimisations off: fusions would remove the very tensors we need to see.
        session = create_session(path, threads=threads, optimize=False, spin=False)  # CPU time is budgeted
    available = {o.name for o in session.get_outputs()}
    outputs = [name for name in names if name in available]  # graph order: the first bad tensor is reported
    samples = 0
    if not outputs:  # nothing to observe (no quantizable tensor); ORT would run every output for an empty list
        return sum(int(next(iter(feed.values())).shape[0]) for feed in batches)
    # While ORT runs batch k+1 (it releases the GIL), one worker thread folds batch k into the statistics,
    # so the second core is not idle. At most two batches of activations are alive at once.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="calibration") as pool:
        pending: Future[None] | None = None
        for index, feed in enumerate(batches):
            values = session.run(outputs, feed)
            if pending is not None:
                pending.result()
            pending = pool.submit(_observe, observer, outputs, values, index, samples)
            samples += int(next(iter(feed.values())).shape[0])
            del values
        if pending is not None:
            pending.result()
    log.info("calibration: %d samples, %d tensors observed", samples, len(outputs))
    return samples
