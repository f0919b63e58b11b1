"""``scales import`` / ``scales export``: scales.json to and from other tools' formats.

- ``trt-cache``: TensorRT's legacy calibration cache (activation scales only, symmetric int8);
- ``aimet``: AIMET encodings 1.0.0 (every tensor, with their axes in a ``deploy_opt`` extension);
- ``ort-overrides``: ONNX Runtime TensorQuantOverrides JSON (activations and weights; ORT derives biases).
An imported file records where it came from in ``provenance.imported`` (file, sha256, format, TensorRT version).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from calibrators.scales.format import ScaleFile, TensorScale, load_scale_file, validate_scale_data
from deploy_opt import __version__
from dopt_common.errors import ConfigError
from dopt_common.files import sha256_file, write_text
from exporters.aimet import encodings_data, parse_aimet_encodings
from exporters.ort.overrides import overrides_data, parse_ort_overrides
from exporters.tensorrt.cache import cache_text, parse_trt_cache

log = logging.getLogger(__name__)
ExportFormat = Literal["trt-cache", "aimet", "ort-overrides"]
FORMATS = ("scales", "trt-cache", "aimet", "ort-overrides")
DEFAULT_NAMES = {"trt-cache": "calibration.cache", "aimet": "encodings.json", "ort-overrides": "overrides.json"}


def detect_format(path: str | Path) -> str:
    """The format of ``path`` by its content: scales, trt-cache, aimet or ort-overrides."""
    text = _read_text(path)
    if text.lstrip().startswith("TRT-"):
        return "trt-cache"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"'{path}' is neither a TensorRT calibration cache (first line 'TRT-…') nor JSON ({exc}); "
            f"fix: pass one of {', '.join(FORMATS)}"
        ) from exc
    return _json_format(data, path)


def _json_format(data: object, path: str | Path) -> str:
    if isinstance(data, dict) and str(data.get("format", "")).startswith("deploy_opt.scales"):
        return "scales"
    if isinstance(data, dict) and {"activation_encodings", "param_encodings"} & set(data):
        return "aimet"
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return "ort-overrides"
    raise ConfigError(
        f"'{path}' is JSON but not scales.json ('format'), AIMET encodings ('activation_encodings') or ORT "
        "TensorQuantOverrides ({tensor: [override, ...]}); fix: pass --format"
    )


def import_scales(path: str | Path, fmt: str | None = None) -> ScaleFile:
    """Read ``path`` (format detected from its content unless ``fmt``) as a scale file."""
    source = Path(path)
    fmt = fmt or detect_format(source)
    if fmt == "scales":
        return load_scale_file(source)
    if fmt not in DEFAULT_NAMES:
        raise ConfigError(f"scale format '{fmt}' is unknown; use one of {', '.join(FORMATS)}")
    imported: dict[str, str] = {"file": str(source), "sha256": sha256_file(source), "format": fmt}
    text = _read_text(source)
    if fmt == "trt-cache":
        cache = parse_trt_cache(text, str(source))
        tensors: Mapping[str, TensorScale] = cache.scales
        imported |= {"trt_version": cache.version, "trt_algorithm": cache.algorithm}
    else:
        data = _parse_json(text, source)
        if fmt == "aimet":
            tensors = parse_aimet_encodings(data, str(source))
            imported["aimet_version"] = str(data.get("version", "unknown"))
        else:
            tensors = parse_ort_overrides(data, str(source))
    if not tensors:
        raise ConfigError(f"'{source}' ({fmt}) holds no quantized tensor")
    activations = [t for t in tensors.values() if t.role == "activation"]
    scheme = "symmetric" if all(t.symmetric for t in activations) else "asymmetric"
    scales = ScaleFile(scheme, dict(tensors), {"imported": imported, "deploy_opt_version": __version__})
    validate_scale_data(scales.to_json(), str(source))
    log.info("imported %d tensors from %s (%s)", len(tensors), source, fmt)
    return scales


def export_scales(
    scales_path: str | Path,
    fmt: ExportFormat,
    out: str | Path | None = None,
    trt_version: str = "10.0.1",
) -> Path:
    """Write scales.json as ``fmt`` to ``out``, by default beside it (see ``DEFAULT_NAMES``)."""
    source = Path(scales_path)
    target = Path(out) if out is not None else source.parent / DEFAULT_NAMES.get(fmt, "scales.out")
    if _same_file(target, source):
        raise ConfigError(f"export of '{source}' would overwrite it; fix: pass another output path")
    return write_text(target, exported_text(source, fmt, trt_version))


def exported_text(scales_path: str | Path, fmt: ExportFormat, trt_version: str = "10.0.1") -> str:
    """scales.json as ``fmt``, the text ``export_scales`` writes (``--out -`` prints it)."""
    if fmt not in DEFAULT_NAMES:
        raise ConfigError(f"export format '{fmt}' is unknown; use one of {', '.join(DEFAULT_NAMES)}")
    scales = load_scale_file(scales_path)
    if fmt == "trt-cache":
        return cache_text(scales, trt_version)
    data = encodings_data(scales) if fmt == "aimet" else overrides_data(scales)
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (a link or another spelling of the same path included)."""
    try:
        return a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read scale file '{path}': {exc}") from exc


def _parse_json(text: str, source: Path) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"'{source}' is not valid JSON: {exc}") from exc
