"""The precision stage: (SmoothQuant,) calibrate, quantize, then keep the fallback nodes in high precision.

With a fallback, the fully quantized model is the reference point: sensitivity analyzes it and auto fallback
searches from it; the model that ships is then quantized again with the chosen nodes excluded, reusing the ranges.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from deploy_opt.analysis.sensitivity.mixed_precision import (
    auto_fallback,
    run_sensitivity,
    static_fallback,
    with_excluded,
)
from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from deploy_opt.autotune.candidates import Candidate, configured
from deploy_opt.autotune.search import run_search
from deploy_opt.autotune.trials import AutoSearch
from deploy_opt.config.build import QuantizationConfig, SensitivityConfig
from deploy_opt.config.setup import QuantSetup, SearchSettings
from deploy_opt.data.sources import Batch
from deploy_opt.pipeline.context import StageContext
from deploy_opt.report.calibration_plot import histogram_figure
from deploy_opt.stages.calibrate import ActivationRanges
from deploy_opt.stages.calibration_set import CalibrationSet
from deploy_opt.stages.dynamic import quantize_dynamic
from deploy_opt.stages.quantize import QuantizedModel, quantize
from deploy_opt.stages.smoothing import smooth_model
from dopt_common.files import save_png


@dataclass(frozen=True)
class FallbackChoice:
    """The nodes kept in high precision: named by the config (static), found by the search (auto), and both."""

    static: tuple[str, ...]
    nodes: tuple[str, ...]
    search: dict[str, Any] | None = None  # the auto search's steps, as recorded in build.json

    def to_json(self) -> dict[str, Any]:
        """The build.json ``fallback`` section."""
        record: dict[str, Any] = {"static": list(self.static), "nodes": list(self.nodes)}
        if self.search is not None:
            record["auto"] = self.search
        return record


@dataclass(frozen=True)
class Precision:
    """The graph that was quantized, the shipped Q/DQ model, its fully quantized twin and the fallback."""

    source: Path  # the FP32 model, or its SmoothQuant-ed twin
    full: QuantizedModel  # every node quantized (the shipped model when there is no fallback)
    shipped: QuantizedModel
    fallback: FallbackChoice
    sensitivity: SensitivityRecord | None
    auto: AutoSearch | None = None  # the auto search's record (quantization.mode: auto)
    setup: QuantSetup | None = None  # the settings ``full`` was written with (QAT writes its model with them)
    smoothing: dict[str, Any] | None = None
    qat: dict[str, Any] | None = None  # the QAT record (build.json ``qat``), when it ran or was considered
    alternatives: tuple[tuple[str, Path], ...] = ()  # other Q/DQ models evaluated and benchmarked beside it

    @property
    def mixed(self) -> bool:
        """Whether the shipped model differs from the fully quantized one."""
        return self.shipped is not self.full


def needs_held_evaluation(quant: QuantizationConfig, sens: SensitivityConfig) -> bool:
    """Sensitivity, auto fallback and the auto search revisit the evaluation set, so it must be held in memory."""
    return sens.enabled or quant.fallback == "auto" or quant.mode == "auto" or bool(quant.qat.enabled)


def auto_precision(
    settings: SearchSettings, name: str, fp32_path: Path, calibration: CalibrationSet, ctx: StageContext
) -> Precision:
    """``quantization.mode: auto``: search, then write the chosen model (or the FP32 one) as model.int8.onnx;
    ``name``: the build's, which the sensitivity record carries."""
    held, metric, stage, setup = list(ctx.evaluation), ctx.metric, ctx.stage, settings.setup
    static = static_fallback(setup.quantization, setup.deploy, fp32_path)
    work = stage / ".auto"
    try:
        outcome = run_search(settings, fp32_path, calibration, held, metric, static, work)
        base, chosen = outcome.base, outcome.search.chosen
        if base is None or chosen is None:  # FP32 ships: every quantizable node excluded
            every = tuple(
                n.name
                for n in onnx.load(str(fp32_path), load_external_data=False).graph.node
                if n.op_type in setup.quantization.op_types
            )
            chosen_setup = configured(setup, Candidate("inputs", setup.quantization.activations, None, every))
            ranges = ActivationRanges.empty(len(calibration.selection.indices))
            source, smoothing, recovery = fp32_path, None, None
        else:
            chosen_setup, ranges = configured(setup, chosen), base.model.ranges
            source, smoothing, recovery = base.source, base.smoothing, base.recovery
        mixed = base is not None and chosen is not None and chosen.excluded != base.candidate.excluded
        if chosen is not None and chosen.dynamic:  # ORT's dynamic INT8 (autotune: _dynamic_trial)
            samples = len(calibration.selection.indices)
            shipped = quantize_dynamic(setup, source, stage, chosen.excluded, samples)
        else:
            shipped = quantize(
                chosen_setup, source, calibration, stage, ranges=ranges, smoothing=smoothing, recovery=recovery
            )
        full, full_setup = shipped, chosen_setup
        if mixed:
            full_setup = configured(setup, base.candidate)
            full = quantize(
                full_setup,
                source,
                calibration,
                stage / ".full",
                ranges=base.model.ranges,
                smoothing=smoothing,
                recovery=recovery,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = _sensitivity(settings, name, (source, full.path), ctx, held) if settings.sensitivity.enabled else None
    fallback = FallbackChoice(static, chosen.excluded if chosen is not None else ())
    return _precision(stage, (source, full, shipped), fallback, record, full_setup, smoothing, outcome.search)


def _sensitivity(
    settings: SearchSettings, name: str, models: tuple[Path, Path], ctx: StageContext, held: list[Batch]
) -> SensitivityRecord:
    """Per-node sensitivity of ``models`` (FP32, fully quantized) on ``held``, written into the stage."""
    setup = settings.setup
    return run_sensitivity(
        settings.sensitivity,
        setup.quantization,
        settings.gate,
        setup.runtime,
        models,
        held,
        ctx.metric,
        ctx.stage,
        seed=settings.seed,
        name=name,
    )


def _plot(shipped: QuantizedModel, stage: Path) -> None:
    """calibration.png of the activations the shipped model quantizes (one left in float has no threshold)."""
    ranges = shipped.ranges
    quantized = {name for name, tensor in shipped.scales.tensors.items() if tensor.role == "activation"}
    figure = histogram_figure(ranges.absolute, ranges.chosen, ranges.methods, quantized)  # MissingDependency: no plot
    save_png(figure, stage / "calibration.png", dpi=90)


@dataclass(frozen=True)
class FullQuantization:
    """Every node quantized, with what the fallback step needs: the graph that was quantized (FP32, or its
    SmoothQuant-ed twin), the nodes the config keeps in float, and the SmoothQuant record."""

    source: Path
    full: QuantizedModel
    static: tuple[str, ...]
    smoothing: dict[str, Any] | None


def quantize_fully(setup: QuantSetup, fp32_path: Path, calibration: CalibrationSet, stage: Path) -> FullQuantization:
    """SmoothQuant (when configured), then the fully quantized model."""
    source, smoothing = fp32_path, None
    quant = setup.quantization
    if quant.smoothing == "smoothquant":
        smoothed = smooth_model(quant, setup.export, setup.runtime, fp32_path, calibration, stage / ".smoothed.onnx")
        source, smoothing = smoothed.path, smoothed.to_json()
    static = static_fallback(quant, setup.deploy, source)
    mixed = bool(static) or quant.fallback == "auto"
    out = stage / ".full" if mixed else stage
    full = quantize(with_excluded(setup, ()), source, calibration, out, smoothing=smoothing)
    return FullQuantization(source, full, static, smoothing)


def choose_precision(
    settings: SearchSettings, name: str, quantized: FullQuantization, calibration: CalibrationSet, ctx: StageContext
) -> Precision:
    """Analyze (when asked), search the fallback (when auto) and write the shipped Q/DQ model; ``name``: the
    build's, which the sensitivity record carries."""
    evaluation, metric, stage, setup = ctx.evaluation, ctx.metric, ctx.stage, settings.setup
    source, full, static, smoothing = quantized.source, quantized.full, quantized.static, quantized.smoothing
    auto = setup.quantization.fallback == "auto"
    analyze = settings.sensitivity.enabled or auto
    held = list(evaluation) if analyze else []  # sensitivity and the fallback search read the same batches
    record = _sensitivity(settings, name, (source, full.path), ctx, held) if analyze else None
    fallback_settings = (setup.quantization, settings.gate, setup.runtime)
    search = auto_fallback(*fallback_settings, source, full.path, held, metric, record) if auto else None
    nodes = static + tuple(n for n in (search or {}).get("nodes", ()) if n not in static)
    shipped = full
    if static or auto:
        excluded = with_excluded(setup, nodes)
        shipped = quantize(excluded, source, calibration, stage, ranges=full.ranges, smoothing=smoothing)
    fallback = FallbackChoice(static, nodes, search)
    return _precision(stage, (source, full, shipped), fallback, record, with_excluded(setup, ()), smoothing)


def _precision(
    stage: Path,
    models: tuple[Path, QuantizedModel, QuantizedModel],
    fallback: FallbackChoice,
    sensitivity: SensitivityRecord | None,
    setup: QuantSetup,
    smoothing: dict[str, Any] | None,
    auto: AutoSearch | None = None,
) -> Precision:
    """Plot the shipped model's ranges into ``stage`` and gather the result; ``models``: source, full, shipped."""
    source, full, shipped = models
    _plot(shipped, stage)
    return Precision(source, full, shipped, fallback, sensitivity, auto, setup, smoothing)
