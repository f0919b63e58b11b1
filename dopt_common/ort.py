"""ONNX Runtime sessions created one way everywhere, so timings and results are comparable."""

from __future__ import annotations

import os
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import ModelError


def create_session(
    model: str | os.PathLike[str] | bytes,
    *,
    threads: int | None = None,
    optimize: bool = True,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
) -> Any:
    """An ORT InferenceSession with fixed thread counts; graph optimisations off for calibration."""
    ort = require("onnxruntime", purpose="running ONNX models")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else os.fspath(model), options, providers=list(providers)
        )
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        name = "<in-memory model>" if isinstance(model, bytes) else os.fspath(model)
        first = str(exc).strip().splitlines()[0][:300]
        raise ModelError(f"ONNX Runtime cannot load '{name}': {first}") from exc
