"""build.json read back as typed fields: what ``build`` prints and what ``gate`` takes from the build's config.

``BuildOutcome.from_json`` is the one place that knows where these fields sit in build.json (format
``BUILD_FORMAT``); the CLI reads attributes, so a moved or missing field is one ReportError naming it, not a
``KeyError`` or a silent ``None`` from a chain of ``.get`` calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy_opt.report.record import BUILD_FORMAT, size_line
from dopt_common.errors import ReportError


@dataclass(frozen=True)
class BatchTiming:
    """One benchmarked batch size: FP32 and shipped medians, their ratio and its 95% interval."""

    size: str
    fp32_ms: float
    shipped_ms: float
    speedup: float
    speedup_ci95: tuple[float, float] | None


@dataclass(frozen=True)
class GateSettings:
    """The build config's gate: the thresholds ``gate`` applies when no flag overrides them."""

    max_drop: float | None = None
    min_speedup: float | None = None
    speedup_batch: int | None = None
    allow_fp32: bool = False
    max_ppl_increase: str | float | None = None  # quantize-llm's gate (quantize_report.json)


@dataclass(frozen=True)
class BuildOutcome:
    """What a build shipped and how it scored, timed and was configured to be judged."""

    format: str
    name: str
    metric: str
    fp32_score: float
    shipped_score: float
    drop: float
    drop_ci95: tuple[float, float] | None
    samples: int
    split: str | None
    quantized_nodes: int | None  # None: a record from before the count was written
    auto_verdict: str | None
    qat_line: str | None
    size: str  # FP32 and shipped file sizes, as a line
    batches: tuple[BatchTiming, ...]
    timings_s: tuple[tuple[str, float], ...]
    gate: GateSettings

    @property
    def fp32_ships(self) -> bool:
        """Whether model.int8.onnx quantizes no node, so the FP32 model is what ships."""
        return self.quantized_nodes == 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildOutcome:
        """Read a build.json's fields; a missing one is a ReportError naming it."""
        found = data.get("format", BUILD_FORMAT)
        if found != BUILD_FORMAT:
            raise ReportError(f"build.json has format {found!r}; this deploy_opt reads {BUILD_FORMAT!r}")
        metrics = _section(data, "metrics")
        qat = data.get("qat")
        batches = (data.get("benchmark") or {}).get("batches") or {}
        return cls(
            format=found,
            name=str(data.get("name", "build")),
            metric=str(_field(metrics, "metrics", "name")),
            fp32_score=float(_field(metrics, "metrics", "ort_fp32")),
            shipped_score=float(_field(metrics, "metrics", "ort_int8")),
            drop=float(_field(metrics, "metrics", "drop")),
            drop_ci95=_pair(metrics.get("drop_ci95")),
            samples=int(_field(metrics, "metrics", "samples")),
            split=metrics.get("split") or None,
            quantized_nodes=(data.get("quantization") or {}).get("quantized_nodes"),
            auto_verdict=(data.get("auto") or {}).get("verdict"),
            qat_line=_qat_line(qat) if qat else None,
            size=size_line(data.get("artifacts") or {}),
            batches=tuple(_timing(size, row) for size, row in batches.items()),
            timings_s=tuple((str(k), float(v)) for k, v in (data.get("timings_s") or {}).items()),
            gate=gate_settings(data),
        )


def gate_settings(data: dict[str, Any]) -> GateSettings:
    """The gate section of a build.json's (or quantize_report.json's) config; defaults for a hand-written report."""
    gate = (data.get("config") or {}).get("gate") or {}
    return GateSettings(
        max_drop=gate.get("max_drop"),
        min_speedup=gate.get("min_speedup"),
        speedup_batch=gate.get("speedup_batch"),
        allow_fp32=bool(gate.get("allow_fp32", False)),
        max_ppl_increase=gate.get("max_ppl_increase"),
    )


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    section = data.get(name)
    if not isinstance(section, dict):
        raise ReportError(f"build.json has no '{name}' section; fix: pass a build.json written by deploy_opt build")
    return section


def _field(section: dict[str, Any], where: str, name: str) -> Any:
    if section.get(name) is None:
        raise ReportError(f"build.json's '{where}' has no '{name}'; fix: pass a build.json written by deploy_opt build")
    return section[name]


def _pair(value: Any) -> tuple[float, float] | None:
    return (float(value[0]), float(value[1])) if value else None


def _timing(size: str, row: dict[str, Any]) -> BatchTiming:
    where = f"benchmark.batches.{size}"
    fp32, shipped = (_field(row, where, key) for key in ("ort_fp32", "ort_int8"))
    return BatchTiming(
        str(size),
        float(_field(fp32, f"{where}.ort_fp32", "median_ms")),
        float(_field(shipped, f"{where}.ort_int8", "median_ms")),
        float(_field(row, where, "speedup")),
        _pair(row.get("speedup_ci95")),
    )


def _qat_line(qat: dict[str, Any]) -> str:
    return f"{qat['shipped']} ships; {qat['why']}" if qat.get("ran") else f"not run: {qat.get('why', '')}"
