"""Class labels for the class metrics (top1, top5): whole, non-negative numbers below the model's class count.

A label that is not a class id (text, NaN, 2.5, -5, an id past the model's outputs) can never match a prediction,
so it would score 0 % on both the FP32 and the INT8 model and the gate would pass on nothing. It is refused,
before any model runs where the class count is known from the ONNX file, else at the first scored batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dopt_common.errors import InputError

CLASS_METRICS = frozenset({"top1", "top5"})


def check_class_labels(label: np.ndarray, where: str, classes: int | None = None) -> None:
    """Raise InputError unless every entry of a 1-D ``label`` is a class id in ``[0, classes)`` (any id ≥ 0 when
    ``classes`` is None); other shapes (one-hot, soft labels) are the metric's to judge."""
    if label.ndim != 1 or label.size == 0:
        return
    fix = "fix: give each sample's class index as an integer (0 … classes-1)"
    if label.dtype.kind not in "iuf" and label.dtype.kind != "b":
        shown = ", ".join(repr(v) for v in label[:3].tolist())
        raise InputError(f"{where}: labels are {label.dtype} ({shown}), not class indices; {fix}")
    values = label.astype(np.float64) if label.dtype.kind == "f" else label
    bad = _first_bad(values, classes)
    if bad is not None:
        index, reason = bad
        value = label[index].item()
        raise InputError(f"{where}: label {value!r} (sample {index}) is {reason}; {fix}")


def _first_bad(values: np.ndarray, classes: int | None) -> tuple[int, str] | None:
    checks: list[tuple[Any, str]] = []
    if values.dtype.kind == "f":
        checks.append((~np.isfinite(values), "not a number"))
        checks.append((np.isfinite(values) & (values != np.round(values)), "not a whole number"))
    checks.append((values < 0, "negative"))
    if classes is not None:
        checks.append((values >= classes, f"not below the model's {classes} classes (outputs)"))
    for mask, reason in checks:
        hits = np.flatnonzero(mask)
        if hits.size:
            return int(hits[0]), reason
    return None


def output_classes(model: Any) -> int | None:
    """The class count of an ONNX model's first output (its non-batch dims multiplied), None when not static."""
    outputs = model.graph.output
    if not outputs:
        return None
    dims = outputs[0].type.tensor_type.shape.dim[1:]
    if not dims or any(d.dim_value <= 0 for d in dims):
        return None
    return int(np.prod([d.dim_value for d in dims]))
