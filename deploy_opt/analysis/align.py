"""``align verify``: read the scales back out of every artifact of a build and prove them equal to scales.json.

Each artifact is read by the reader of its own format, never by the code that wrote it from scales.json:
- ``model.int8.onnx``: the Q/DQ scale and zero-point initializers (``read_qdq_scales``); for a dynamic INT8
  model, its int8 weights' parameters and the activations it quantizes at run time (``read_dynamic_model``),
  which must be the ones scales.json lists under ``dynamic`` (they have no scale to compare);
- ``model.trt.onnx``, where a build targets ORT CPU and TensorRT: the same, less the biases it keeps float;
- ``calibration.cache``: the TensorRT cache lines (activation scales only; the format has no weights);
- ``encodings.json``: the AIMET encodings;
- ``overrides.json``: ORT TensorQuantOverrides;
- the TensorRT engine's scales, where an engine and tensorrt exist (what TensorRT's parser reads from the
  Q/DQ model the engine is built from).
Equal means the same float32 bits, zero points, dtype and axis. A tensor is listed when it is missing from an
artifact, drifted, asymmetric where the format needs symmetric, or present in the artifact but not the file.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrators.scales.format import ScaleFile, TensorScale, float32_hex, load_scale_file
from dopt_common.errors import ConfigError
from dopt_common.names import named_counts
from exporters.ort.dynamic_read import compare_dynamic, read_dynamic_model
from exporters.ort.qdq import compare_scales, read_qdq_scales

log = logging.getLogger(__name__)

ALIGN_FORMAT = "deploy_opt.analysis.align/1"
ENGINE_NAMES = ("model.engine", "model.plan")


@dataclass(frozen=True)
class ArtifactCheck:
    """The verdict for one artifact."""

    artifact: str
    status: str  # pass | fail | skipped
    checked: int = 0
    drifted: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    asymmetric: tuple[str, ...] = ()
    note: str = ""
    dynamic: tuple[str, ...] = ()  # activations both sides quantize at run time (no scale to compare)

    def to_json(self) -> dict[str, Any]:
        """Plain data for align.json."""
        return {
            "artifact": self.artifact,
            "status": self.status,
            "checked": self.checked,
            "drifted": list(self.drifted),
            "missing": list(self.missing),
            "extra": list(self.extra),
            "asymmetric": list(self.asymmetric),
            "note": self.note,
            "dynamic": list(self.dynamic),
        }

    def line(self) -> str:
        """One human line: verdict, counts and the first offending tensors."""
        if self.status == "skipped":
            return f"{self.artifact}: skipped ({self.note})"
        parts = [f"{self.artifact}: {self.status.upper()}, {self.checked} tensors equal bit for bit"]
        parts += named_counts(
            (
                ("drifted", self.drifted),
                ("missing from artifact", self.missing),
                ("not in scales.json", self.extra),
                ("asymmetric", self.asymmetric),
                ("dynamic (quantized at run time, as scales.json says)", self.dynamic),
            ),
            first=5,
        )
        return "; ".join(parts)


@dataclass(frozen=True)
class AlignReport:
    """Every artifact's verdict."""

    build_dir: Path
    checks: tuple[ArtifactCheck, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when no artifact failed (skipped ones are not failures)."""
        return all(c.status != "fail" for c in self.checks)

    @property
    def verdict(self) -> str:
        """'pass: ...' or 'FAIL: ...' in one line for summaries."""
        checked = [c.artifact for c in self.checks if c.status != "skipped"]
        failed = [c.artifact for c in self.checks if c.status == "fail"]
        if failed:
            return f"FAIL: {', '.join(failed)} disagree with scales.json"
        return f"pass: {', '.join(checked)} carry scales.json bit for bit"

    def to_json(self) -> dict[str, Any]:
        """The align.json document."""
        return {
            "format": ALIGN_FORMAT,
            "verdict": self.verdict,
            "ok": self.ok,
            "artifacts": [c.to_json() for c in self.checks],
        }


def verify_alignment(build_dir: str | Path) -> AlignReport:
    """Check every artifact in ``build_dir`` against its ``scales.json``."""
    folder = Path(build_dir)
    if folder.is_file():
        folder = folder.parent
    scales_path = folder / "scales.json"
    if not scales_path.is_file():
        raise ConfigError(f"'{folder}' has no scales.json; pass a build folder (reports/<name>/)")
    scales = load_scale_file(scales_path)
    readers: list[tuple[str, Callable[[Path], Mapping[str, TensorScale]], Callable[[ScaleFile], dict]]] = [
        ("model.trt.onnx", read_qdq_scales, _overrides_expected),  # TensorRT's form: the biases are float
        ("calibration.cache", _read_cache, _cache_expected),
        ("encodings.json", _read_aimet, lambda s: dict(s.tensors)),
        ("overrides.json", _read_overrides, _overrides_expected),
    ]
    checks = [_check_ort_model(folder / "model.int8.onnx", scales)]
    for name, read, expected in readers:
        path = folder / name
        if not path.is_file():
            checks.append(ArtifactCheck(name, "skipped", note="not in this build"))
            continue
        checks.append(_check(name, read(path), expected(scales), scales))
    checks.append(_check_engine(folder, scales))
    report = AlignReport(folder, tuple(checks))
    for check in report.checks:
        log.debug("align: %s", check.line())
    return report


def _check(name: str, found: Mapping[str, TensorScale], expected: dict, scales: ScaleFile) -> ArtifactCheck:
    diff = compare_scales(expected, found)
    asymmetric = ()
    if name == "calibration.cache":
        asymmetric = tuple(sorted(n for n, t in scales.tensors.items() if t.role == "activation" and not t.symmetric))
    failed = bool(diff.drifted or diff.missing_in_artifact or diff.missing_in_file or asymmetric)
    return ArtifactCheck(
        name,
        "fail" if failed else "pass",
        len(set(expected) & set(found)) - len(diff.drifted),
        diff.drifted,
        diff.missing_in_artifact,
        diff.missing_in_file,
        asymmetric,
    )


def _check_ort_model(path: Path, scales: ScaleFile) -> ArtifactCheck:
    """model.int8.onnx: Q/DQ scales or dynamic INT8 weights bit for bit, and the activations it quantizes at run
    time by name (scales.json's ``dynamic``)."""
    import onnx

    if not path.is_file():
        return ArtifactCheck(path.name, "skipped", note="not in this build")
    model = onnx.load(str(path))
    readback = read_dynamic_model(path, model)
    found = {**read_qdq_scales(path, model), **readback.weights}
    check = _check(path.name, found, dict(scales.tensors), scales)
    if not readback.dynamic and not scales.dynamic:
        return check
    diff = compare_dynamic(scales, readback)
    disagree = diff.dynamic_changed + diff.dynamic_missing + diff.dynamic_extra
    return dataclasses.replace(
        check,
        status="fail" if disagree else check.status,
        drifted=check.drifted + diff.dynamic_changed,
        missing=check.missing + diff.dynamic_missing,
        extra=check.extra + diff.dynamic_extra,
        dynamic=tuple(sorted(set(scales.dynamic) & set(readback.dynamic) - set(diff.dynamic_changed))),
    )


def _check_engine(folder: Path, scales: ScaleFile) -> ArtifactCheck:
    engine = next((folder / n for n in ENGINE_NAMES if (folder / n).is_file()), None)
    if engine is None:
        return ArtifactCheck("tensorrt engine", "skipped", note="no engine in this build")
    from exporters.tensorrt.engine import engine_scales, tensorrt_status

    status = tensorrt_status()
    if not status.startswith("available"):
        return ArtifactCheck(engine.name, "skipped", note=f"tensorrt {status}")
    source = next(p for p in (folder / "model.trt.onnx", folder / "model.int8.onnx") if p.is_file())
    found = engine_scales(source)
    expected = {n: t.scale_bits for n, t in scales.tensors.items() if t.role != "bias"}  # TensorRT keeps biases float
    got = {n: tuple(float32_hex(v) for v in values) for n, values in found.items()}
    drifted = tuple(sorted(n for n in set(expected) & set(got) if expected[n] != got[n]))
    missing = tuple(sorted(set(expected) - set(got)))
    extra = tuple(sorted(set(got) - set(expected)))
    return ArtifactCheck(
        engine.name,
        "fail" if drifted or missing or extra else "pass",
        len(set(expected) & set(got)) - len(drifted),
        drifted,
        missing,
        extra,
        note=f"scales TensorRT's ONNX parser reads from {source.name}, the engine's source",
    )


def _read_cache(path: Path) -> Mapping[str, TensorScale]:
    from exporters.tensorrt.cache import read_trt_cache

    return read_trt_cache(path).scales


def _cache_expected(scales: ScaleFile) -> dict[str, TensorScale]:
    """The cache carries per-tensor activation scales only; asymmetric ones are reported, not expected."""
    return {n: t for n, t in scales.tensors.items() if t.role == "activation" and t.symmetric}


def _read_aimet(path: Path) -> Mapping[str, TensorScale]:
    from exporters.aimet import read_aimet_encodings

    return read_aimet_encodings(path)


def _read_overrides(path: Path) -> Mapping[str, TensorScale]:
    from exporters.ort.overrides import read_ort_overrides

    return read_ort_overrides(path)


def _overrides_expected(scales: ScaleFile) -> dict[str, TensorScale]:
    """Activations and weights: ORT derives bias scales itself, and TensorRT's form keeps biases float."""
    return {n: t for n, t in scales.tensors.items() if t.role != "bias"}
