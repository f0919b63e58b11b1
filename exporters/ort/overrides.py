"""ONNX Runtime ``TensorQuantOverrides``: as a JSON file, and as the objects ORT's quantizer takes.

The shape is ORT's own (``onnxruntime.quantization.tensor_quant_overrides``): ``{tensor: [override, ...]}``, one
override per tensor, or one per channel for a per-channel tensor, each ``{"quant_type", "scale", "zero_point"}``
plus ``"axis"`` on per-channel ones. In the JSON file ``quant_type`` is the ``QuantType`` name ("QInt8",
"QUInt8"), ``scale`` a float (the float32 value, dumped exactly) and ``zero_point`` an int; ``ort_quant_overrides``
turns that into ``QuantType`` members and numpy scalars for ``QDQQuantizer``'s ``extra_options``. Biases are not
written: ORT derives a bias scale from its input and weight scales itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from calibrators.scales.format import ScaleFile, TensorScale
from dopt_common.deps import require
from dopt_common.errors import ConfigError, ScaleMismatchError
from dopt_common.files import read_json, write_json

log = logging.getLogger(__name__)
QUANT_TYPES = {"int8": "QInt8", "uint8": "QUInt8"}
_DTYPES = {v: k for k, v in QUANT_TYPES.items()}


def overrides_data(scales: ScaleFile) -> dict[str, list[dict[str, Any]]]:
    """Plain-JSON TensorQuantOverrides pinning every activation and weight parameter of ``scales``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, t in scales.tensors.items():
        if t.role == "bias":
            continue
        if t.dtype not in QUANT_TYPES:
            raise ScaleMismatchError(f"tensor '{name}' ({t.role}) is {t.dtype}; ORT overrides hold int8 or uint8 only")
        qtype = QUANT_TYPES[t.dtype]
        if t.axis is None:
            out[name] = [{"quant_type": qtype, "scale": float(t.scale[0]), "zero_point": int(t.zero_point[0])}]
        else:
            out[name] = [
                {"quant_type": qtype, "axis": t.axis, "scale": float(s), "zero_point": int(z)}
                for s, z in zip(t.scale, t.zero_point, strict=True)
            ]
    return out


def ort_quant_overrides(data: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """``overrides_data`` output as ORT's quantizer wants it: ``QuantType`` members and numpy float32 / int scalars."""
    quant_type = require("onnxruntime.quantization", purpose="writing the ORT Q/DQ model").QuantType
    converted: dict[str, list[dict[str, Any]]] = {}
    for name, entries in data.items():
        converted[name] = []
        for entry in entries:
            zp_dtype = np.int8 if entry["quant_type"] == "QInt8" else np.uint8
            item = dict(entry)
            item["quant_type"] = quant_type.from_string(entry["quant_type"])
            item["scale"] = np.array(entry["scale"], dtype=np.float32)
            item["zero_point"] = np.array(entry["zero_point"], dtype=zp_dtype)
            converted[name].append(item)
    return converted


def write_ort_overrides(scales: ScaleFile, path: str | Path) -> Path:
    """Write the TensorQuantOverrides JSON of ``scales`` (activations and weights) atomically."""
    return write_json(path, overrides_data(scales))


def read_ort_overrides(path: str | Path) -> dict[str, TensorScale]:
    """Read a TensorQuantOverrides JSON file: a per-channel tensor (with 'axis') is a weight, the rest activations."""
    data = read_json(path, "ORT overrides")
    return parse_ort_overrides(data, str(path))


def parse_ort_overrides(data: Any, source: str = "overrides.json") -> dict[str, TensorScale]:
    """Entries of a TensorQuantOverrides document (see ``read_ort_overrides``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: TensorQuantOverrides must be an object {{tensor: [override, ...]}}")
    return {name: _entry(name, entries, source) for name, entries in data.items()}


def _entry(name: str, entries: Any, source: str) -> TensorScale:
    where = f"{source} tensor '{name}'"
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{where}: expected a non-empty list of override objects")
    axis = entries[0].get("axis")
    if axis is None and len(entries) > 1:
        raise ConfigError(f"{where}: {len(entries)} overrides without 'axis' (ORT needs 'axis' for per-channel)")
    scales, zeros, dtypes = [], [], set()
    for index, entry in enumerate(entries):
        missing = [k for k in ("quant_type", "scale", "zero_point") if k not in entry]
        if missing:
            raise ConfigError(
                f"{where}: override [{index}] lacks '{missing[0]}'; only overrides that pin quant_type, scale and "
                "zero_point can be imported"
            )
        if entry.get("axis", axis) != axis:
            raise ConfigError(f"{where}: override [{index}] has axis {entry['axis']}, the first has {axis}")
        if entry["quant_type"] not in _DTYPES:
            raise ConfigError(f"{where}: quant_type '{entry['quant_type']}' is not supported; use QInt8 or QUInt8")
        scale, zero = entry["scale"], entry["zero_point"]
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise ConfigError(f"{where}: override [{index}] 'scale' {scale!r} is not a positive number")
        if not isinstance(zero, int) or isinstance(zero, bool):
            raise ConfigError(f"{where}: override [{index}] 'zero_point' {zero!r} is not an integer")
        dtypes.add(_DTYPES[entry["quant_type"]])
        scales.append(float(np.float32(scale)))
        zeros.append(zero)
    if len(dtypes) > 1:
        raise ConfigError(f"{where}: channels mix quant types {sorted(dtypes)}")
    role = "weight" if axis is not None else "activation"
    return TensorScale(name, role, dtypes.pop(), tuple(scales), tuple(zeros), axis, method="ort-overrides")
