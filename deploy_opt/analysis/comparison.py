"""compare.json as typed records: what the cross-backend comparison found, and the request that runs it.

``Comparison.to_json`` writes compare.json (format ``FORMAT``) and ``Comparison.from_json`` reads it back; the
build summary, the build page and the tests read fields, not dict paths, and a file of another format is one
ReportError naming both formats.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.errors import ReportError

FORMAT = "deploy_opt.analysis.compare/1"
SAMPLES_FILE = "compare_samples.npz"
Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class ComparedModels:
    """What to compare: the FP32 and Q/DQ models, and the backends beside ORT's that run them.

    ``extra_runners`` map a backend name to a function ``feed -> outputs``; a name containing ``fp32`` gets the
    FP32 tolerances, any other name the INT8 ones. ``judge_top1``: the outputs are class scores, so top-1
    agreement is reported and judged (an embedding's argmax means nothing).
    """

    fp32_path: Path
    int8_path: Path
    torch_model: Any = None
    extra_runners: Mapping[str, Runner] = field(default_factory=dict)
    threads: int | None = None
    judge_top1: bool = False


@dataclass(frozen=True)
class BackendVerdict:
    """One backend: whether it ran, its outputs' metrics against the reference, and pass, fail or not judged."""

    status: str  # "ran", "not available: ...", "failed: ..."
    precision: str  # "fp32" or "int8": which tolerances apply
    passed: bool | None  # None: not available, so not judged
    reference: bool = False
    outputs: Mapping[str, Mapping[str, Any]] | None = None  # output name -> max_abs, cosine, sqnr_db, ...
    failures: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """compare.json's entry for this backend."""
        data: dict[str, Any] = {"status": self.status, "precision": self.precision}
        if self.reference:
            data["reference"] = True
        if self.outputs is not None:
            data["outputs"] = {name: dict(m) for name, m in self.outputs.items()}
        data["pass"] = self.passed
        if self.failures is not None:
            data["failures"] = list(self.failures)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackendVerdict:
        """Read one backend's entry."""
        failures = data.get("failures")
        return cls(
            status=str(_field(data, "status")),
            precision=str(data.get("precision", "int8")),
            passed=data.get("pass"),
            reference=bool(data.get("reference", False)),
            outputs=data.get("outputs"),
            failures=None if failures is None else tuple(failures),
        )


@dataclass(frozen=True)
class ComparisonSamples:
    """compare_samples.npz: its file, digest, row count and each input's shape and dtype."""

    file: str
    sha256: str
    count: int
    inputs: Mapping[str, Mapping[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """compare.json's ``samples`` section."""
        return {"file": self.file, "sha256": self.sha256, "count": self.count, "inputs": dict(self.inputs)}


@dataclass(frozen=True)
class Comparison:
    """Every backend's verdict, the per-layer table, the first diverging layer and the overall verdict."""

    seed: int | None
    reference: str
    outputs: tuple[str, ...]
    backends: Mapping[str, BackendVerdict]
    layer_status: str
    layer_criterion: str
    first_divergence: Mapping[str, Any] | None
    layers: tuple[Mapping[str, Any], ...]
    tolerances: Mapping[str, Any]
    failures: tuple[str, ...]
    timings_s: float
    samples: ComparisonSamples | None = None
    format: str = FORMAT

    @property
    def verdict(self) -> str:
        """ "pass" when no backend and no layer failed, else "fail"."""
        return "fail" if self.failures else "pass"

    def summary(self) -> dict[str, Any]:
        """The verdict, first divergence and each backend's status, for build.json (compare.json has the rest)."""
        return {
            "file": "compare.json",
            "verdict": self.verdict,
            "first_divergence": None if self.first_divergence is None else dict(self.first_divergence),
            "backends": {name: b.status for name, b in self.backends.items()},
        }

    def to_json(self) -> dict[str, Any]:
        """compare.json as written."""
        head: dict[str, Any] = {"format": self.format}
        if self.samples is not None:
            head["samples"] = self.samples.to_json()
        return head | {
            "seed": self.seed,
            "reference": self.reference,
            "outputs": list(self.outputs),
            "backends": {name: b.to_json() for name, b in self.backends.items()},
            "layer_status": self.layer_status,
            "layer_criterion": self.layer_criterion,
            "first_divergence": None if self.first_divergence is None else dict(self.first_divergence),
            "layers": [dict(row) for row in self.layers],
            "tolerances": dict(self.tolerances),
            "verdict": self.verdict,
            "failures": list(self.failures),
            "timings_s": self.timings_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Comparison:
        """Read compare.json's fields; another format or a missing field is a ReportError naming it."""
        found = data.get("format")
        if found != FORMAT:
            raise ReportError(f"compare.json has format {found!r}; this deploy_opt reads {FORMAT!r}")
        samples = data.get("samples")
        return cls(
            seed=data.get("seed"),
            reference=str(_field(data, "reference")),
            outputs=tuple(data.get("outputs") or ()),
            backends={name: BackendVerdict.from_json(b) for name, b in _field(data, "backends").items()},
            layer_status=str(data.get("layer_status", "")),
            layer_criterion=str(data.get("layer_criterion", "")),
            first_divergence=data.get("first_divergence"),
            layers=tuple(data.get("layers") or ()),
            tolerances=data.get("tolerances") or {},
            failures=tuple(data.get("failures") or ()),
            timings_s=float(data.get("timings_s", 0.0)),
            samples=None if samples is None else ComparisonSamples(**samples),
        )


def read_comparison(path: str | Path) -> Comparison:
    """Read a compare.json file."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}; rebuild to write it again") from exc
    return Comparison.from_json(data)


def _field(data: Mapping[str, Any], key: str) -> Any:
    if key not in data:
        raise ReportError(f"compare.json has no '{key}'; rebuild to write it again")
    return data[key]
