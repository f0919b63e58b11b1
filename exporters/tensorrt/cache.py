"""The legacy TensorRT (<= 10) INT8 calibration cache, written from and read into scale-file entries.

The format is text: a header ``TRT-<version>-<algorithm>`` (``TRT-8601-EntropyCalibration2``), then one line per
activation tensor, ``<name>: <hex>``, where ``<hex>`` is the big-endian IEEE float32 bits of the tensor's scale
(its dynamic range is ±127 × scale), written unpadded: a scale below 2^-96 has 7 digits (``48c5dd1``) and a
tensor whose range is zero is ``<name>: 0`` (public TensorRT 8.x caches; ``tests/data/trt_caches``).
``<version>`` is TensorRT's ``NV_TENSORRT_VERSION`` integer: major*1000 + minor*100 + patch before TensorRT 10
(8.6.1 -> 8601), major*10000 + minor*100 + patch from 10 on (10.3.0 -> 100300). TensorRT ignores a cache whose
header names another version or algorithm.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from calibrators.scales.format import ScaleFile, TensorScale, float32_hex, hex_float32
from dopt_common.errors import ConfigError, ScaleMismatchError
from dopt_common.files import write_text

log = logging.getLogger(__name__)
ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")
_HEADER = re.compile(r"^TRT-([^-\s]+)-(\w+)$")
_HEX = re.compile(r"^[0-9a-fA-F]{1,8}$")
ZERO_RANGE_SCALE = 1.0  # what a zero-range tensor imports as: ORT's (and calibrators.qparams') scale of an empty range


@dataclass(frozen=True)
class TrtCache:
    """A parsed calibration cache: TensorRT version ("8.6.1"), algorithm and one int8 scale per tensor."""

    version: str
    algorithm: str
    scales: Mapping[str, TensorScale]


def trt_version_number(version: str) -> int:
    """TensorRT's integer encoding of ``version`` ("8.6.1" -> 8601, "10.0.1" -> 100001); a build number is ignored."""
    parts = version.strip().split(".")
    if not 2 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"TensorRT version '{version}' is not MAJOR.MINOR[.PATCH]; fix: pass e.g. '10.0.1'")
    major, minor, patch = (int(p) for p in (parts + ["0"])[:3])
    if major >= 10 and minor < 100 and patch < 100:
        return major * 10000 + minor * 100 + patch
    if major < 10 and minor < 10 and patch < 100:
        return major * 1000 + minor * 100 + patch
    raise ConfigError(f"TensorRT version '{version}' cannot be encoded in a calibration cache header")


def trt_version_string(number: int) -> str:
    """The inverse of ``trt_version_number``: 8601 -> "8.6.1", 100300 -> "10.3.0"."""
    if number >= 100000:
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return f"{number // 1000}.{number // 100 % 10}.{number % 100}"


def cache_text(scales: ScaleFile, trt_version: str = "10.0.1", algorithm: str = "EntropyCalibration2") -> str:
    """The cache for every activation of ``scales``, in scales.json order; refuses what TensorRT cannot hold."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"calibration cache algorithm '{algorithm}' is unknown; use one of {', '.join(ALGORITHMS)}")
    lines = [f"TRT-{trt_version_number(trt_version)}-{algorithm}"]
    refused = []
    for name, t in scales.tensors.items():
        if t.role != "activation":
            continue  # TensorRT's legacy path computes weight (and bias) scales itself; the cache has no place for them
        if not (t.dtype == "int8" and t.symmetric and len(t.scale) == 1 and t.axis is None):
            refused.append(t)
            continue
        if "\n" in name or "\r" in name:
            raise ConfigError(f"tensor name {name!r} contains a line break, which a calibration cache cannot hold")
        lines.append(f"{name}: {'0' if t.amax == 0.0 else float32_hex(t.scale[0])}")  # 0: as TensorRT writes it
    if refused:
        first = refused[0]
        names = ", ".join(f"'{t.name}'" for t in refused[:3]) + (" …" if len(refused) > 3 else "")
        raise ScaleMismatchError(
            f"tensor '{first.name}' is {first.dtype} with zero point {list(first.zero_point)[:4]}"
            f"{' per-channel' if len(first.scale) > 1 else ''}: a TensorRT calibration cache holds only symmetric "
            f"int8 per-tensor activation scales ({len(refused)} refused: {names}); fix: build with symmetric "
            "activations (profile setting quantization.activations: symmetric)"
        )
    return "\n".join(lines) + "\n"


def write_trt_cache(scales: ScaleFile, path: str | Path, trt_version: str = "10.0.1") -> Path:
    """Write the calibration cache of ``scales`` atomically (activation scales only).

    Only symmetric int8 per-tensor activations can go in; an asymmetric one raises ``ScaleMismatchError``.
    Weights and biases are not written: in TensorRT's legacy (implicit) INT8 path TensorRT computes weight scales
    itself from the weights, per output channel, and the cache format has no entry for them.
    """
    text = cache_text(scales, trt_version)
    log.info("calibration cache: %d activation scales, header %s", text.count("\n") - 1, text.split("\n", 1)[0])
    return write_text(path, text)


def read_trt_cache(path: str | Path) -> TrtCache:
    """Parse a TensorRT calibration cache; a malformed line raises ``ConfigError`` naming its number and text."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read TensorRT calibration cache '{path}': {exc}") from exc
    return parse_trt_cache(text, str(path))


def parse_trt_cache(text: str, source: str = "calibration cache") -> TrtCache:
    """Parse cache text (see ``read_trt_cache``)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise ConfigError(f"{source} is empty; a TensorRT calibration cache starts with 'TRT-<version>-<algorithm>'")
    header = _HEADER.match(lines[start].strip())
    if header is None:
        raise ConfigError(
            f"{source} line {start + 1}: {lines[start].strip()!r} is not a TensorRT calibration cache header "
            "('TRT-<version>-<algorithm>', e.g. 'TRT-8601-EntropyCalibration2')"
        )
    token, algorithm = header.groups()
    if algorithm not in ALGORITHMS:
        raise ConfigError(
            f"{source} line {start + 1}: calibration algorithm '{algorithm}' is unknown; "
            f"TensorRT writes {', '.join(ALGORITHMS)}"
        )
    version = trt_version_string(int(token)) if token.isdigit() else token
    scales: dict[str, TensorScale] = {}
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        if not line.strip():
            continue
        name, sep, value = line.rstrip().rpartition(": ")  # names may contain ':' (TensorFlow's 'conv/Relu:0')
        entry = _entry(name, value, sep, source, number, line)
        if name in scales and scales[name].scale_bits != entry.scale_bits:
            raise ConfigError(f"{source} line {number}: tensor '{name}' appears twice with different scales")
        scales[name] = entry
    return TrtCache(version, algorithm, scales)


def _entry(name: str, value: str, sep: str, source: str, number: int, line: str) -> TensorScale:
    where = f"{source} line {number}: {line.strip()!r}"
    if not sep or not name or not _HEX.match(value):
        raise ConfigError(f"{where} is not '<tensor name>: <1 to 8 hex digits>'")
    scale = float(hex_float32(value.lower().rjust(8, "0")))  # TensorRT writes the bits unpadded
    if int(value, 16) == 0:  # 'name: 0': TensorRT's line for a tensor whose range is zero
        zero = (0.0, 0.0)
        return TensorScale(name, "activation", "int8", (ZERO_RANGE_SCALE,), (0,), None, 0.0, zero, "trt-cache")
    if not math.isfinite(scale) or scale <= 0.0:
        raise ConfigError(f"{where} holds scale {scale}, which is not a positive finite number")
    amax = 127.0 * scale  # in float64: finite for every float32 scale
    return TensorScale(name, "activation", "int8", (scale,), (0,), None, amax=amax, method="trt-cache")
