"""Saving ONNX models atomically, with external data past a size threshold."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from dopt_common.files import atomic_path


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset version (None when it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def save_onnx(proto: onnx.ModelProto, path: str | Path, external_data_mb: int = 1024) -> Path:
    """Write ``proto`` atomically; models larger than ``external_data_mb`` keep weights in ``<name>.data``."""
    path = Path(path)
    external = proto.ByteSize() > external_data_mb * (1 << 20)
    data_name = f"{path.name}.data"
    stale = path.parent / data_name
    with atomic_path(path) as tmp:
        if external:
            onnx.save_model(proto, str(tmp), save_as_external_data=True, location=data_name, size_threshold=1024)
        else:
            onnx.save_model(proto, str(tmp))
            if stale.exists():
                os.remove(stale)
    return path
