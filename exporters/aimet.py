"""AIMET encodings (format 1.0.0), written from and read into scale-file entries.

Format 1.0.0 (``aimet_common`` ``_to_1_0_0``): ``{"version": "1.0.0", "activation_encodings": [...],
"param_encodings": [...]}``, each entry ``{"name", "dtype": "INT", "enc_type": "PER_TENSOR" | "PER_CHANNEL",
"is_sym", "bw", "scale": [...], "offset": [...]}`` with ``real = (q + offset) * scale`` where AIMET's ``q`` is
always UNSIGNED (AIMET exports ``to_unsigned().offset``). Hence the mapping to ONNX zero points:

- int8 symmetric (zero point 0): ``is_sym`` true, ``bw`` 8, offset -128 (AIMET's own symmetric int8; offset -127,
  AIMET's "strict symmetric", is read as the same thing);
- uint8 asymmetric with zero point z: ``is_sym`` false, ``bw`` 8, offset -z;
- int32 bias (zero point 0): ``is_sym`` true, ``bw`` 32, offset -2**31. AIMET exports int32 bias encodings with
  the parameters, so they are written too.

A round trip reproduces dtype, zero point and the exact float32 scale (a float32 held in a Python float is dumped
by ``json`` in its shortest exact form). Format 1.0.0 has no channel axis; the writer keeps each per-channel axis in
an extra top-level ``"deploy_opt": {"axes": {...}}`` object, beside AIMET's own top-level extras
(``excluded_layers``, ``quantizer_args``), never inside an entry. A file from AIMET itself lacks it: its
per-channel entries are read with axis 0 (ONNX Conv / Gemm output channels), with a warning. The older dict format
(0.4 - 0.6.1: ``{name: [{"bitwidth", "is_symmetric": "True", "offset", "scale", ...}, ...]}``) is read too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibrators.scales.format import ScaleFile, TensorScale
from dopt_common.errors import ConfigError, ScaleMismatchError
from dopt_common.files import read_json, write_json

log = logging.getLogger(__name__)
VERSION = "1.0.0"
_BITS = {"int8": 8, "uint8": 8, "int32": 32}


def encoding_entry(t: TensorScale) -> dict[str, Any]:
    """The AIMET 1.0.0 entry of one tensor."""
    if t.dtype == "uint8":
        is_sym, offset = False, [-z for z in t.zero_point]
    elif t.symmetric:
        is_sym, offset = True, [-(2 ** (_BITS[t.dtype] - 1))] * len(t.zero_point)
    else:
        raise ScaleMismatchError(
            f"tensor '{t.name}' is {t.dtype} with zero points {list(t.zero_point)[:4]}: AIMET 1.0.0 stores a signed "
            "type only as symmetric; fix: use uint8 for asymmetric parameters (quantization.activations: asymmetric)"
        )
    return {
        "name": t.name,
        "dtype": "INT",
        "enc_type": "PER_CHANNEL" if t.axis is not None else "PER_TENSOR",
        "is_sym": is_sym,
        "bw": _BITS[t.dtype],
        "scale": [float(s) for s in t.scale],
        "offset": offset,
    }


def encodings_data(scales: ScaleFile) -> dict[str, Any]:
    """The AIMET 1.0.0 document of ``scales``: activations, then weights and int32 biases as parameters."""
    activations = [encoding_entry(t) for t in scales.tensors.values() if t.role == "activation"]
    params = [encoding_entry(t) for t in scales.tensors.values() if t.role != "activation"]
    axes = {name: t.axis for name, t in scales.tensors.items() if t.axis is not None}
    return {
        "version": VERSION,
        "activation_encodings": activations,
        "param_encodings": params,
        "excluded_layers": list(scales.excluded),
        "deploy_opt": {"axes": axes},
    }


def write_aimet_encodings(scales: ScaleFile, path: str | Path) -> Path:
    """Write ``scales`` as AIMET 1.0.0 encodings atomically."""
    return write_json(path, encodings_data(scales))


def read_aimet_encodings(path: str | Path) -> dict[str, TensorScale]:
    """Read AIMET encodings (1.0.0, or the older dict format) into scale-file entries."""
    data = read_json(path, "AIMET encodings")
    return parse_aimet_encodings(data, str(path))


def parse_aimet_encodings(data: Any, source: str = "encodings.json") -> dict[str, TensorScale]:
    """Entries of an AIMET encodings document (see ``read_aimet_encodings``)."""
    if not isinstance(data, dict) or not ({"activation_encodings", "param_encodings"} & set(data)):
        raise ConfigError(f"{source} is not AIMET encodings: no 'activation_encodings' or 'param_encodings'")
    extension = data.get("deploy_opt")
    axes = extension.get("axes", {}) if isinstance(extension, dict) else {}
    guessed: list[str] = []
    out: dict[str, TensorScale] = {}
    for key, is_param in (("activation_encodings", False), ("param_encodings", True)):
        section = data.get(key, [])
        if isinstance(section, dict):  # the older format: {name: [one encoding per channel]}
            items = [_from_legacy(name, encs, source) for name, encs in section.items()]
        elif isinstance(section, list):
            items = section
        else:
            raise ConfigError(f"{source}: '{key}' must be a list (1.0.0) or an object (older formats)")
        for item in items:
            entry = _entry(item, is_param, axes, source, guessed)
            if entry is not None:
                out[entry.name] = entry
    if guessed:
        log.warning(
            "%s: %d per-channel encodings carry no axis (AIMET 1.0.0 has none); read with axis 0, e.g. '%s'",
            source,
            len(guessed),
            guessed[0],
        )
    return out


def _from_legacy(name: str, encodings: Any, source: str) -> dict[str, Any]:
    if not isinstance(encodings, list) or not encodings or not all(isinstance(e, dict) for e in encodings):
        raise ConfigError(f"{source} tensor '{name}': expected a list of encodings, got {type(encodings).__name__}")
    first = encodings[0]
    try:
        return {
            "name": name,
            "dtype": str(first.get("dtype", "int")).upper(),
            "enc_type": "PER_CHANNEL" if len(encodings) > 1 else "PER_TENSOR",
            "is_sym": str(first.get("is_symmetric", "False")) == "True",
            "bw": first["bitwidth"],
            "scale": [e["scale"] for e in encodings],
            "offset": [e["offset"] for e in encodings],
        }
    except KeyError as exc:
        raise ConfigError(f"{source} tensor '{name}': encoding lacks field {exc}") from exc


def _entry(item: Any, is_param: bool, axes: Mapping[str, Any], source: str, guessed: list[str]) -> TensorScale | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ConfigError(f"{source}: every encoding needs a string 'name', got {item!r}")
    name = item["name"]
    where = f"{source} tensor '{name}'"
    if str(item.get("dtype", "INT")).upper() == "FLOAT":
        log.info("%s: float encoding, not an integer quantization; skipped", where)
        return None
    missing = [k for k in ("enc_type", "is_sym", "bw", "scale", "offset") if k not in item]
    if missing:
        raise ConfigError(f"{where}: field '{missing[0]}' is missing")
    enc_type, bw, scale, offset = item["enc_type"], item["bw"], item["scale"], item["offset"]
    if enc_type not in ("PER_TENSOR", "PER_CHANNEL"):
        raise ConfigError(f"{where}: enc_type '{enc_type}' is not supported; deploy_opt reads PER_TENSOR, PER_CHANNEL")
    if any(s != 0 for s in item.get("zero_point_shift", [])):
        raise ConfigError(f"{where}: a non-zero 'zero_point_shift' has no ONNX equivalent")
    if not isinstance(scale, list) or not isinstance(offset, list) or not scale or len(scale) != len(offset):
        raise ConfigError(f"{where}: 'scale' and 'offset' must be lists of the same non-zero length")
    if not all(isinstance(o, (int, float)) and float(o).is_integer() for o in offset):
        raise ConfigError(f"{where}: field 'offset' must hold whole numbers, got {offset[:4]}")
    dtype, zero = _dtype_and_zero(bw, item["is_sym"] is True, [int(o) for o in offset], where)
    axis = None
    if enc_type == "PER_CHANNEL":
        axis = item.get("axis", axes.get(name))
        if axis is None:
            guessed.append(name)
            axis = 0
    elif len(scale) != 1:
        raise ConfigError(f"{where}: PER_TENSOR encoding with {len(scale)} scales")
    role = "activation" if not is_param else "bias" if dtype == "int32" else "weight"
    return TensorScale(name, role, dtype, tuple(float(s) for s in scale), zero, axis, method="aimet")


def _dtype_and_zero(bw: Any, is_sym: bool, offset: list[int], where: str) -> tuple[str, tuple[int, ...]]:
    """Undo AIMET's unsigned offsets: see the module docstring."""
    if bw not in (8, 32):
        raise ConfigError(f"{where}: bit width {bw} is not supported; deploy_opt holds int8, uint8 and int32")
    half = 2 ** (bw - 1)
    if is_sym and all(o in (-half, -half + 1) for o in offset):
        return ("int8" if bw == 8 else "int32"), (0,) * len(offset)
    if bw == 8 and all(-255 <= o <= 0 for o in offset):
        return "uint8", tuple(-o for o in offset)
    raise ConfigError(f"{where}: offsets {offset[:4]} with is_sym {is_sym} and bw {bw} match no ONNX int8/uint8/int32")
