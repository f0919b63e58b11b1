"""``scales.json``: the single source of truth for every quantization parameter of a build.

Each scale is stored as its float32 value and its exact big-endian IEEE bits in hex, so no converter can
round it. Readers take the bits and refuse a file whose decimal and hex disagree.

Activations quantized at run time (dynamic-range INT8) have no scale to store: they are listed apart, under
``dynamic``, so every entry of ``tensors`` keeps its scale and a file without ``dynamic`` reads as before.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calibrators.scales.schema import QDTYPES, validate_scale_data
from dopt_common.errors import ConfigError, NumericsError, ScaleMismatchError
from dopt_common.files import read_json, write_json

FORMAT = "deploy_opt.scales/1"
Role = Literal["activation", "weight", "bias"]


def float32_hex(value: float) -> str:
    """The big-endian IEEE float32 bits of ``value`` as 8 hex digits."""
    return struct.pack(">f", np.float32(value)).hex()


def hex_float32(text: str) -> np.float32:
    """The float32 whose big-endian bits are ``text``."""
    return np.float32(struct.unpack(">f", bytes.fromhex(text))[0])


@dataclass(frozen=True)
class TensorScale:
    """Quantization parameters of one tensor: per-tensor (axis None, one value) or per-channel."""

    name: str
    role: Role
    dtype: str
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None
    amax: float | None = None
    range: tuple[float, float] | None = None
    method: str = "minmax"
    derived_from: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Every number finite: an Inf or NaN scale would reach every backend's file (and TensorRT's cache)."""
        values = [*self.scale, *((self.amax,) if self.amax is not None else ()), *(self.range or ())]
        bad = next((v for v in values if not math.isfinite(float(v))), None)
        if bad is not None:
            raise NumericsError(
                f"scale entry '{self.name}' holds {float(bad)} (scale, amax or range); every value must be finite; "
                "fix: recalibrate, or correct that entry of the scale file"
            )

    @property
    def symmetric(self) -> bool:
        """True when every zero point is 0 on a signed type."""
        return self.dtype != "uint8" and all(z == 0 for z in self.zero_point)

    @property
    def scale_bits(self) -> tuple[str, ...]:
        """The exact bits of each scale."""
        return tuple(float32_hex(s) for s in self.scale)

    def to_json(self) -> dict[str, Any]:
        """Plain data for scales.json."""
        data: dict[str, Any] = {
            "role": self.role,
            "dtype": self.dtype,
            "symmetric": self.symmetric,
            "axis": self.axis,
            "scale": [float(s) for s in self.scale],
            "scale_hex": list(self.scale_bits),
            "zero_point": list(self.zero_point),
            "method": self.method,
        }
        if self.amax is not None:
            data["amax"] = self.amax
        if self.range is not None:
            data["range"] = list(self.range)
        if self.derived_from:
            data["derived_from"] = list(self.derived_from)
        return data

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> TensorScale:
        """Parse one entry, taking scales from their hex bits."""
        try:
            bits = data["scale_hex"]
            scales = tuple(float(hex_float32(b)) for b in bits)
            decimals = data.get("scale", scales)
            if len(decimals) != len(scales) or any(np.float32(d) != s for d, s in zip(decimals, scales, strict=True)):
                raise ScaleMismatchError(
                    f"scales.json tensor '{name}': 'scale' and 'scale_hex' disagree; fix: keep the two in step (the "
                    "hex bits are the value readers take), or write the file again"
                )
            entry = cls(
                name=name,
                role=data["role"],
                dtype=data["dtype"],
                scale=scales,
                zero_point=tuple(int(z) for z in data["zero_point"]),
                axis=data.get("axis"),
                amax=data.get("amax"),
                range=tuple(data["range"]) if data.get("range") is not None else None,
                method=data.get("method", "unknown"),
                derived_from=tuple(data.get("derived_from", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"scales.json tensor '{name}': malformed entry ({exc})") from exc
        if entry.dtype not in QDTYPES or entry.role not in ("activation", "weight", "bias"):
            raise ConfigError(f"scales.json tensor '{name}': unknown dtype '{entry.dtype}' or role '{entry.role}'")
        return entry


@dataclass(frozen=True)
class DynamicTensor:
    """An activation quantized at run time: its scale and zero point come from each input, so none is stored."""

    name: str
    dtype: str = "uint8"  # ORT's DynamicQuantizeLinear and DynamicQuantizeLSTM take uint8 only
    method: str = "DynamicQuantizeLinear"

    def to_json(self) -> dict[str, Any]:
        """Plain data for scales.json."""
        return {"dtype": self.dtype, "method": self.method}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> DynamicTensor:
        """Parse one ``dynamic`` entry (the schema has checked its fields)."""
        return cls(name=name, dtype=data["dtype"], method=data["method"])


@dataclass(frozen=True)
class ScaleFile:
    """Every quantized tensor of a model with its parameters, the activation scheme and provenance."""

    activations: str
    tensors: Mapping[str, TensorScale]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()
    dynamic: Mapping[str, DynamicTensor] = field(default_factory=dict)

    def restricted_to(self, names: Iterable[str]) -> ScaleFile:
        """The same file holding only ``names`` (the tensors an artifact really quantized)."""
        keep = set(names)
        return replace(
            self,
            tensors={k: v for k, v in self.tensors.items() if k in keep},
            dynamic={k: v for k, v in self.dynamic.items() if k in keep},
        )

    def to_json(self) -> dict[str, Any]:
        """Plain data for scales.json (``dynamic`` only when some activation is quantized at run time)."""
        data = {
            "format": FORMAT,
            "activations": self.activations,
            "provenance": dict(self.provenance),
            "excluded": list(self.excluded),
            "tensors": {name: self.tensors[name].to_json() for name in sorted(self.tensors)},
        }
        if self.dynamic:
            data["dynamic"] = {name: self.dynamic[name].to_json() for name in sorted(self.dynamic)}
        return data


def save_scale_file(scales: ScaleFile, path: str | Path) -> Path:
    """Write scales.json atomically."""
    return write_json(path, scales.to_json())


def load_scale_file(path: str | Path) -> ScaleFile:
    """Read scales.json, refusing another format version and any entry the schema or its consistency rules reject."""
    data = read_json(path, "scale file")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ConfigError(f"scale file '{path}' has format {found!r}; this deploy_opt reads '{FORMAT}'")
    validate_scale_data(data, str(path))
    tensors = {name: TensorScale.from_json(name, entry) for name, entry in data.get("tensors", {}).items()}
    return ScaleFile(
        activations=data.get("activations", "symmetric"),
        tensors=tensors,
        provenance=data.get("provenance", {}),
        excluded=tuple(data.get("excluded", ())),
        dynamic={name: DynamicTensor.from_json(name, entry) for name, entry in data.get("dynamic", {}).items()},
    )
