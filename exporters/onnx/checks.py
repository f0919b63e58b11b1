"""ONNX simplification (onnxsim, else onnxslim), the checker, and torch-vs-ORT parity."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from dopt_common.errors import ModelError, NumericsError, one_line
from dopt_common.ort import create_session
from exporters.onnx.io import save_onnx

log = logging.getLogger(__name__)


def check_onnx(path: str | Path) -> onnx.ModelProto:
    """Run ``onnx.checker`` on a file and return the loaded model; failures name the file and the fix."""
    path = Path(path)
    if path.is_dir():
        raise ModelError(f"ONNX file '{path}' is a folder; fix: give the .onnx file inside it as model.onnx")
    if not path.is_file():
        raise ModelError(f"ONNX file '{path}' does not exist; fix the model.onnx path")
    _refuse_non_onnx(path)
    try:
        onnx.checker.check_model(str(path))
        return onnx.load(str(path))
    except (onnx.checker.ValidationError, onnx.onnx_cpp2py_export.shape_inference.InferenceError) as exc:
        first = one_line(exc)
        raise ModelError(f"ONNX file '{path}' fails onnx.checker: {first}; fix the model or re-export it") from exc
    except Exception as exc:  # a corrupt protobuf raises DecodeError and friends
        raise ModelError(f"'{path}' is not a readable ONNX model ({type(exc).__name__}: {exc})") from exc


def read_onnx_graph(path: str | Path) -> onnx.ModelProto:
    """The model at ``path`` without its external data; a file that is not ONNX is a ModelError naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"ONNX file '{path}' does not exist or is not a file; fix: give the path of the .onnx file")
    return _refuse_non_onnx(path)


def _refuse_non_onnx(path: Path) -> onnx.ModelProto:
    """A file that parses as an empty ModelProto (text, an image, zero bytes) is not a model: say so, instead of
    the checker's "ir_version not set properly"."""
    size = path.stat().st_size
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError: not protobuf at all, or cut short
        with open(path, "rb") as handle:
            head = handle.read(64)
        text = head.isascii() and all(32 <= b < 127 or b in (9, 10, 13) for b in head)
        guess = "it looks like text" if text else "truncated, or another format"
        raise ModelError(
            f"'{path}' ({size} bytes) is not a readable ONNX model ({guess}; {type(exc).__name__}); fix: point "
            "model.onnx at the real .onnx file, or export the model again"
        ) from None
    if model.ir_version == 0 and not model.graph.node and not model.opset_import:
        raise ModelError(
            f"'{path}' ({size} bytes) is not an ONNX model: it has no ir_version, opset or graph (a text file, or "
            "another format with an .onnx name?); fix: export the model with torch.onnx.export or point at the "
            "real .onnx file"
        )
    return model


def simplify_onnx(src: str | Path, dst: str | Path, external_data_mb: int = 1024) -> str:
    """Simplify ``src`` into ``dst`` with onnxsim, falling back to onnxslim; returns the tool used."""
    model = onnx.load(str(src))
    simplified, tool = None, "none"
    try:
        import onnxsim

        candidate, ok = onnxsim.simplify(model)
        if ok:
            simplified, tool = candidate, f"onnxsim {getattr(onnxsim, '__version__', '?')}"
    except Exception as exc:  # onnxsim's C++ errors are not typed
        log.warning("onnxsim could not simplify %s (%s); trying onnxslim", src, one_line(exc))
    if simplified is None:
        try:
            import onnxslim

            simplified, tool = onnxslim.slim(model), f"onnxslim {getattr(onnxslim, '__version__', '?')}"
        except Exception as exc:
            log.warning("onnxslim failed too (%s); keeping the unsimplified model", one_line(exc))
            simplified, tool = model, "none"
    save_onnx(simplified, dst, external_data_mb=external_data_mb)
    return tool


@dataclass(frozen=True)
class Parity:
    """Largest torch-vs-ORT differences over the parity samples."""

    max_abs: float
    max_rel: float
    tolerance: float
    samples: int

    @property
    def ok(self) -> bool:
        """True when the worst error is within tolerance."""
        return self.max_abs <= self.tolerance


def check_parity(
    run_reference: Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]],
    onnx_path: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    atol: float,
    rtol: float,
    threads: int | None = None,
) -> Parity:
    """Compare ``run_reference`` (torch) with ORT FP32 on fixed feeds; raise when beyond atol + rtol·|ref|."""
    session = create_session(onnx_path, threads=threads)
    max_abs, max_rel, scale, samples = 0.0, 0.0, 0.0, 0
    for feed in feeds:
        expected = [np.asarray(e, dtype=np.float64) for e in run_reference(feed)]
        actual = [np.asarray(a, dtype=np.float64) for a in session.run(None, feed)]
        if len(expected) != len(actual):
            raise ModelError(f"parity: torch returns {len(expected)} outputs, the ONNX model {len(actual)}")
        for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
            if e.shape != a.shape:
                raise ModelError(f"parity: output {index} has shape {a.shape} in ONNX, {e.shape} in torch")
            if not np.all(np.isfinite(a)):
                raise NumericsError(f"parity: ONNX Runtime output {index} has NaN or Inf")
            diff = float(np.max(np.abs(e - a))) if e.size else 0.0
            peak = float(np.max(np.abs(e))) if e.size else 0.0
            max_abs, scale = max(max_abs, diff), max(scale, peak)
            max_rel = max(max_rel, diff / peak if peak > 0 else 0.0)
        samples += int(next(iter(feed.values())).shape[0])
    result = Parity(max_abs, max_rel, atol + rtol * scale, samples)
    if not result.ok:
        raise ModelError(
            f"parity: ONNX Runtime differs from torch by max-abs {result.max_abs:.3g} > tolerance "
            f"{result.tolerance:.3g}; fix: check unsupported ops, or raise export.parity_atol if expected"
        )
    log.info("parity: max-abs %.3g (tolerance %.3g) on %d samples", max_abs, result.tolerance, samples)
    return result
