"""What ``build`` prints of a build record, and what ``gate`` takes from the build's config.

``outcome`` is a view of a ``BuildRecord`` (build_record.py reads build.json; nothing here parses it): a field
the CLI needs and the record lacks is one ReportError naming it, not a ``KeyError`` or a silent ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploy_opt.report.build_record import BuildRecord
from deploy_opt.report.record import size_line
from deploy_opt.report.record_sections import BatchRow
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
    def from_json(cls, data: Mapping[str, Any]) -> BuildOutcome:
        """A build.json document read as a BuildRecord, then viewed; a missing field is a ReportError naming it."""
        return outcome(BuildRecord.from_json(data))


def outcome(record: BuildRecord) -> BuildOutcome:
    """What the CLI prints of a build record; a field it needs and the record lacks is a ReportError naming it."""
    metrics = record.metrics
    if metrics is None:
        raise ReportError("build.json has no 'metrics' section; fix: pass a build.json written by deploy_opt build")
    batches = record.benchmark.batches if record.benchmark else {}
    return BuildOutcome(
        format=record.format,
        name=str(record.name or "build"),
        metric=str(_field(metrics.name, "metrics", "name")),
        fp32_score=float(_field(metrics.scores.get("ort_fp32"), "metrics", "ort_fp32")),
        shipped_score=float(_field(metrics.scores.get("ort_int8"), "metrics", "ort_int8")),
        drop=float(_field(metrics.drop, "metrics", "drop")),
        drop_ci95=(metrics.uncertainty.low, metrics.uncertainty.high) if metrics.uncertainty else None,
        samples=int(_field(metrics.samples, "metrics", "samples")),
        split=metrics.split or None,
        quantized_nodes=record.quantization.quantized_nodes if record.quantization else None,
        auto_verdict=(record.auto or {}).get("verdict"),
        qat_line=_qat_line(record.qat) if record.qat else None,
        size=size_line(record.artifacts or {}),
        batches=tuple(_timing(size, row) for size, row in batches.items()),
        timings_s=tuple((str(k), float(v)) for k, v in record.timings_s.items()),
        gate=configured_gate(record.config),
    )


def gate_settings(data: Mapping[str, Any]) -> GateSettings:
    """The gate section of a build.json's (or quantize_report.json's) config; defaults for a hand-written report."""
    config = data.get("config")
    return configured_gate(config if isinstance(config, Mapping) else {})


def configured_gate(config: Mapping[str, Any]) -> GateSettings:
    """The thresholds of a recorded build config's ``gate`` section (defaults where it has none)."""
    gate = config.get("gate") or {}
    return GateSettings(
        max_drop=gate.get("max_drop"),
        min_speedup=gate.get("min_speedup"),
        speedup_batch=gate.get("speedup_batch"),
        allow_fp32=bool(gate.get("allow_fp32", False)),
        max_ppl_increase=gate.get("max_ppl_increase"),
    )


def _field(value: Any, where: str, name: str) -> Any:
    if value is None:
        raise ReportError(f"build.json's '{where}' has no '{name}'; fix: pass a build.json written by deploy_opt build")
    return value


def _timing(size: str, row: BatchRow) -> BatchTiming:
    where = f"benchmark.batches.{size}"
    fp32, shipped = (_field(row.timings.get(key), where, key) for key in ("ort_fp32", "ort_int8"))
    ci = row.intervals.get("speedup")
    return BatchTiming(
        str(size),
        float(_field(fp32.median_ms, f"{where}.ort_fp32", "median_ms")),
        float(_field(shipped.median_ms, f"{where}.ort_int8", "median_ms")),
        float(_field(row.speedups.get("speedup"), where, "speedup")),
        (float(ci[0]), float(ci[1])) if ci else None,
    )


def _qat_line(qat: Mapping[str, Any]) -> str:
    return f"{qat['shipped']} ships; {qat['why']}" if qat.get("ran") else f"not run: {qat.get('why', '')}"
