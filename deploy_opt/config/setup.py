"""What each group of stages reads of a build config, as one frozen value, so that no stage takes the whole
``BuildConfig``: the pipeline (``pipeline/build.py``) makes them with ``of(config)`` and hands each stage its own.

- ``QuantSetup``: calibration and quantization; what the auto search varies per candidate
  (``autotune.candidates.configured``).
- ``SearchSettings``: the precision stages (the auto search, sensitivity and fallback, QAT).
- ``BackendSettings``: the backend artifacts (TensorRT engine and its profile, caches, compat reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy_opt.config.build import (
    AutoConfig,
    BenchmarkConfig,
    BuildConfig,
    CalibrationConfig,
    CompareConfig,
    DeployConfig,
    ExportConfig,
    GateConfig,
    QuantizationConfig,
    RuntimeConfig,
    SensitivityConfig,
)


@dataclass(frozen=True)
class QuantSetup:
    """The sections calibration and quantization read: what is quantized and how (``quantization``), how ranges are
    chosen (``calibration``, with ``auto.budget_s`` bounding ``method: auto``'s pass and ``metric`` its error), the
    targets (int32 biases, 7-bit weights), the export's external-data threshold and the stages' threads."""

    quantization: QuantizationConfig
    calibration: CalibrationConfig
    deploy: DeployConfig
    export: ExportConfig
    runtime: RuntimeConfig  # resolved: threads is never null here
    auto: AutoConfig
    metric: str  # data.metric

    @classmethod
    def of(cls, config: BuildConfig) -> QuantSetup:
        """``config``'s sections, with ``runtime.threads`` resolved (``BuildConfig.stage_runtime``)."""
        return cls(
            quantization=config.quantization,
            calibration=config.calibration,
            deploy=config.deploy,
            export=config.export,
            runtime=config.stage_runtime,
            auto=config.auto,
            metric=config.data.metric,
        )


@dataclass(frozen=True)
class SearchSettings:
    """What the precision stages read: the quantize setup the auto search's candidates vary, the gate they must
    meet, how sensitivity (and the fallback's proxy) runs, the benchmark whose batch the search times at, and the
    build's seed (sensitivity's subset, QAT)."""

    setup: QuantSetup
    gate: GateConfig
    sensitivity: SensitivityConfig
    benchmark: BenchmarkConfig
    seed: int

    @classmethod
    def of(cls, config: BuildConfig) -> SearchSettings:
        """``config``'s sections (``setup``: ``QuantSetup.of(config)``)."""
        return cls(QuantSetup.of(config), config.gate, config.sensitivity, config.benchmark, config.seed)


@dataclass(frozen=True)
class BackendSettings:
    """What the backends stage reads: the targets, the export's external-data threshold, the batches the benchmark
    and the comparison run and the gate's (the TensorRT profile spans them), and the benchmark's batch sizes (the
    engine's timing)."""

    deploy: DeployConfig
    export: ExportConfig
    benchmark: BenchmarkConfig
    compare: CompareConfig
    gate: GateConfig

    @classmethod
    def of(cls, config: BuildConfig) -> BackendSettings:
        """``config``'s sections."""
        return cls(config.deploy, config.export, config.benchmark, config.compare, config.gate)
