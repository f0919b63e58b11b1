"""build.json's sections about the models written: the FP32 export, the quantization and the other backends.

Their keys are open (what an import converted, which normaliser changed the graph, what a dynamic model leaves in
float, which TensorRT step failed and why), so each keeps every entry as its stage wrote it (``fields``, in order:
``to_json`` gives it back unchanged) beside the typed fields the reports and the gate read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deploy_opt.report.record_sections import mapping


@dataclass(frozen=True)
class Parity:
    """The FP32 ONNX model against its source (torch, or the user's ONNX file on ORT)."""

    max_abs: float
    max_rel: float | None
    tolerance: float
    samples: int | None
    reference: str | None = None  # set when the source is an ONNX file

    @classmethod
    def from_json(cls, data: object) -> Parity | None:
        if not isinstance(data, Mapping):
            return None
        get = data.get
        return cls(get("max_abs"), get("max_rel"), get("tolerance"), get("samples"), get("reference"))


class _OpenSection:
    """A section with open keys: ``to_json`` gives back ``fields``, every entry as its stage wrote it, in order."""

    fields: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


@dataclass(frozen=True)
class ExportInfo(_OpenSection):
    """How the FP32 model was made: its source, exporter, opset, node count and parity (build.json ``export``)."""

    source: str | None
    exporter: str | None
    opset: int | None
    nodes: int | None
    parity: Parity | None
    module_names: Mapping[str, str]
    fields: Mapping[str, Any] = field(repr=False)  # every entry as written (import and normaliser changes too)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportInfo:
        get = data.get
        names = get("module_names") or {}
        parity = Parity.from_json(get("parity"))
        return cls(get("source"), get("exporter"), get("opset"), get("nodes"), parity, names, data)


@dataclass(frozen=True)
class QuantizationInfo(_OpenSection):
    """What the shipped Q/DQ model quantizes and how (build.json ``quantization``)."""

    method: str | None
    weights: str | None
    samples: int | None
    activations: str | None
    scale_check: str | None
    quantized_nodes: int | None  # None: a record from before the count was written
    quantizable_nodes: int | None
    quantized_tensors: Mapping[str, int]  # by role: activation, weight, bias (dynamic: weight, dynamic)
    tensors: Mapping[str, Mapping[str, Any]]  # each calibrated tensor's range and how it was chosen
    fields: Mapping[str, Any] = field(repr=False)  # every entry as written

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QuantizationInfo:
        get = data.get
        return cls(
            method=get("method"),
            weights=get("weights"),
            samples=get("samples"),
            activations=get("activations"),
            scale_check=get("scale_check"),
            quantized_nodes=get("quantized_nodes"),
            quantizable_nodes=get("quantizable_nodes"),
            quantized_tensors=get("quantized_tensors") or {},
            tensors=get("tensors") or {},
            fields=data,
        )


@dataclass(frozen=True)
class TensorRTRecord(_OpenSection):
    """The TensorRT engine: built or why not, and its timing against ORT CUDA FP32 where both ran."""

    status: str | None
    speedups: Mapping[str, float]  # by batch size: the engine over ORT CUDA running the FP32 model
    ort_cuda: str | None  # why ORT CUDA was not timed, when it was not
    fields: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorRTRecord:
        timing = data.get("timing_ms")
        rows = timing if isinstance(timing, Mapping) else {}
        speedups = {
            str(k): v["speedup_vs_ort_cuda_fp32"]
            for k, v in rows.items()
            if isinstance(v, Mapping) and "speedup_vs_ort_cuda_fp32" in v
        }
        note = rows.get("ort_cuda")
        return cls(data.get("status"), speedups, note if isinstance(note, str) else None, data)


@dataclass(frozen=True)
class BackendArtifacts(_OpenSection):
    """The other backends' artifacts: AIMET encodings, the TensorRT cache, Q/DQ form and engine (what each wrote,
    or why not), by build.json's names."""

    aimet: str | None
    trt_cache: str | None
    tensorrt_qdq: Any  # the TensorRT form of the Q/DQ model, when written
    tensorrt: TensorRTRecord | None
    fields: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BackendArtifacts:
        trt = data.get("tensorrt")
        engine = TensorRTRecord.from_json(trt) if isinstance(trt, Mapping) else None
        return cls(data.get("aimet"), data.get("trt_cache"), data.get("tensorrt_qdq"), engine, data)


@dataclass(frozen=True)
class Backends:
    """build.json ``backends``: the artifacts, then the compat reports' counts by report."""

    artifacts: BackendArtifacts
    compat: Mapping[str, Mapping[str, Any]]  # by report (compat, compat.int8, compat.trt): summary, flagged count

    def to_json(self) -> dict[str, Any]:
        return {**self.artifacts.to_json(), "compat": self.compat}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Backends:
        rest = {k: v for k, v in data.items() if k != "compat"}
        return cls(BackendArtifacts.from_json(rest), mapping(data.get("compat"), "backends.compat"))
