"""The QAT stage: when PTQ is not enough, fine-tune the fake-quantized graph and ship it if it does better.

It starts from the fully quantized PTQ model (its placement and ``scales.json``), trains the student
(:mod:`deploy_opt.qat`), writes the fine-tuned FP32 weights back into the graph and the learned activation ranges
into the scale file, and writes the Q/DQ model the same way PTQ does (ORT's writer, bit-for-bit readback), so
``align verify``, the comparison and the gate judge it like any other build. ORT scores PTQ, PTQ + fallback and
QAT on the held-out evaluation set; QAT ships when it meets ``gate.max_drop`` with more nodes in INT8 or a
smaller drop than what PTQ would ship, else PTQ's answer stands and the record says why.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from deploy_opt.analysis.sensitivity.mixed_precision import with_excluded
from deploy_opt.autotune.trials import AutoSearch
from deploy_opt.config.build import RuntimeConfig
from deploy_opt.config.setup import QuantSetup, SearchSettings
from deploy_opt.data.sources import Batch
from deploy_opt.distill.loop import Lessons
from deploy_opt.evaluation.evaluate import evaluate, session_runner
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.onnx_torch import unsupported_ops
from deploy_opt.pipeline.context import StageContext
from deploy_opt.pipeline.precision import FallbackChoice, Precision
from deploy_opt.qat.student import build_student, learned_ranges, trained_model
from deploy_opt.qat.train import TrainingRun, train_student
from deploy_opt.report.qat_plot import plot_qat
from deploy_opt.stages.calibrate import ActivationRanges
from deploy_opt.stages.calibration_set import CalibrationSet
from deploy_opt.stages.quantize import QuantizedModel, quantize, weight_levels
from dopt_common.errors import DeployOptError
from dopt_common.ort import create_session
from exporters.onnx.io import save_onnx
from exporters.ort.graph import kept_nodes

log = logging.getLogger(__name__)


def fine_tune(
    settings: SearchSettings,
    fp32_path: Path,
    precision: Precision,
    calibration: CalibrationSet,
    ctx: StageContext,
    extra_training: Callable[[], list[Batch]],
) -> Precision:
    """``quantization.qat``: train and choose; returns the precision that ships, with its ``qat`` record.

    ``extra_training``: reads ``data.train``'s batches, called only when QAT trains.
    """
    held, metric, stage, progress = ctx.evaluation, ctx.metric, ctx.stage, ctx.progress
    why = _skip_reason(settings, fp32_path, precision, held, metric)
    if why is not None:
        log.info("QAT skipped: %s", why)
        return dataclasses.replace(precision, qat={"ran": False, "why": why})
    settings = _within_auto_budget(settings, precision.auto)
    work = stage / ".qat"
    try:
        start, setup = _start(settings.setup, fp32_path, precision, calibration, work)
        train = [*calibration.batches, *extra_training()]
        data = _StudentData(train, held, metric)
        trained = _train(settings, start, setup, precision.smoothing, calibration, data, work, progress)
    except (DeployOptError, RuntimeError, ValueError) as exc:
        if settings.setup.quantization.qat.enabled is True:
            raise
        why = f"QAT failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); PTQ's answer stands"
        log.warning("QAT: %s", why)
        return dataclasses.replace(precision, qat={"ran": False, "why": why})
    models = {"ort_fp32": fp32_path, "ptq": precision.shipped.path, "qat": trained.model.path}
    if start.model is not precision.shipped:
        models["ptq_all_int8"] = start.model.path
    scores = _scores(settings.setup.runtime, models, held, metric)
    nodes = {
        key: int8_nodes(path, settings.setup.quantization.op_types) for key, path in models.items() if key != "ort_fp32"
    }
    choice = choose_model(metric, scores, nodes, settings.gate.max_drop)
    record = _record(metric, scores, nodes, trained.run, choice)
    plot_qat(trained.run, metric.name, scores, stage / "qat.png")
    log.info("QAT: %s ships; %s", choice, record["why"])
    if choice == "ptq":
        others = [("ort_int8_qat", trained.model.path)]
        if "ptq_all_int8" in models and not precision.mixed:
            others.insert(0, ("ort_int8_ptq_all_int8", start.model.path))
        return dataclasses.replace(precision, qat=record, alternatives=tuple(others))
    alternatives = [("ort_int8_ptq", _keep_copy(precision.shipped.path, work / "ptq.int8.onnx"))]
    if choice == "qat":
        if "ptq_all_int8" in models:
            alternatives.insert(0, ("ort_int8_ptq_all_int8", start.model.path))
        source = Path(shutil.copyfile(trained.graph, stage / "model.qat.onnx"))  # scales.json's model_sha256
        ranges, made_by = trained.ranges, trained.provenance
    else:  # QAT ended below its all-INT8 start, which beats what PTQ shipped: the start ships
        alternatives.append(("ort_int8_qat", trained.model.path))
        source, ranges, made_by = start.source, start.model.ranges, {"smoothing": precision.smoothing}
    weights = _absmax_weights(setup) if choice == "qat" else setup
    shipped = quantize(weights, source, calibration, stage, ranges=ranges, **made_by)
    return Precision(
        source=source,
        full=shipped,
        shipped=shipped,
        fallback=FallbackChoice((), ()),
        sensitivity=precision.sensitivity,
        auto=precision.auto,
        setup=setup,
        smoothing=precision.smoothing,
        qat=record,
        alternatives=tuple(alternatives),
    )


def _skip_reason(
    settings: SearchSettings, fp32_path: Path, precision: Precision, held: list[Batch], metric: Metric
) -> str | None:
    """Why ``enabled: auto`` does not train (None: it trains; ``enabled: true`` always does)."""
    if settings.setup.quantization.qat.enabled is True:
        return None
    searched = auto_search_reason(precision.auto, settings.gate.max_drop)
    if searched is not None:
        return searched
    spent = budget_reason(precision.auto, settings.setup.auto.budget_s)
    if spent is not None:
        return spent
    if int8_nodes(precision.shipped.path, settings.setup.quantization.op_types):
        before = _scores(settings.setup.runtime, {"ort_fp32": fp32_path, "ptq": precision.shipped.path}, held, metric)
        drop = metric.drop(before["ort_fp32"], before["ptq"])
        if drop <= settings.gate.max_drop:
            return f"PTQ meets gate.max_drop ({drop:.3f} <= {settings.gate.max_drop}); QAT not needed"
    missing = unsupported_ops(onnx.load(str(fp32_path), load_external_data=False))
    if missing:  # enabled: true raises instead, naming them (build_student)
        return f"the torch evaluator does not run {', '.join(missing)}; QAT cannot train this graph"
    return None


# QAT recovers a PTQ drop of a few times max_drop; past that, ``enabled: auto`` spends its budget for nothing (a
# ViT-S saliency model's closest PTQ candidate dropped 13.9 points against max_drop 1, and 11 minutes of QAT
# left it at 16.2), so it does not start.
QAT_REACH = 3.0


def auto_search_reason(auto: AutoSearch | None, max_drop: float) -> str | None:
    """Why the auto search's answer needs no QAT, naming the model that ships (None: no INT8 model met max_drop)."""
    if auto is None:
        return None
    if auto.chosen is not None:  # the chosen candidate met max_drop and paid
        measured = [t for t in auto.trials if t.candidate == auto.chosen]
        drop = f" (drop {measured[-1].drop:.3f} <= {max_drop:g})" if measured else ""
        return f"PTQ met gate.max_drop in the auto search: {auto.chosen.label} ships{drop}; QAT not needed"
    reachable = [t for t in auto.trials if t.quantized_nodes and t.meets(max_drop, spare=False)]
    if reachable:  # INT8 was accurate enough but slower than FP32: QAT would not make it faster
        return (
            f"PTQ met gate.max_drop in the auto search ({reachable[0].candidate.label}), but no INT8 model was "
            "faster than FP32 by auto.min_gain; FP32 ships and QAT would not make INT8 faster"
        )
    quantized = [t for t in auto.trials if t.quantized_nodes]
    closest = min(quantized, key=lambda t: t.drop) if quantized else None
    if closest is not None and closest.drop > QAT_REACH * max(max_drop, 1e-9):
        return (
            f"the closest INT8 model of the auto search ({closest.candidate.label}) drops {closest.drop:.3f}, "
            f"over {QAT_REACH:g}x gate.max_drop {max_drop:g}: a fine-tune within quantization.qat.budget_s does "
            "not close that much; FP32 ships (quantization.qat.enabled: true trains anyway)"
        )
    return None


# ``enabled: auto`` is the default, so it must keep a default build within minutes: it trains at most this long
# (a YOLOv8n at 320x320 ran 2.5 s a step here, and its 600 s default budget made a 15-minute build), and after
# an auto search at most what the search left of ``auto.budget_s`` (a PP-OCRv4 recogniser's search spent its
# 240 s, then QAT's 161 s made a 7.8-minute build); less than ``MIN_AUTO_QAT_S`` is too few steps to move a model.
# ``enabled: true`` trains for ``budget_s``.
AUTO_QAT_S = 90.0
MIN_AUTO_QAT_S = 30.0


def budget_reason(auto: AutoSearch | None, budget_s: float) -> str | None:
    """Why ``enabled: auto`` does not train after an auto search that spent ``auto.budget_s`` (None: it may)."""
    if auto is None or budget_s - auto.work_s >= MIN_AUTO_QAT_S:
        return None
    return (
        f"the auto search spent {auto.work_s:.0f} work seconds of auto.budget_s {budget_s:g}, which an automatic "
        f"fine-tune shares (it needs {MIN_AUTO_QAT_S:g} s); FP32 ships (raise auto.budget_s, or set "
        "quantization.qat.enabled: true to train anyway)"
    )


def _within_auto_budget(settings: SearchSettings, auto: AutoSearch | None) -> SearchSettings:
    """``enabled: auto`` trains at most ``AUTO_QAT_S``, and after an auto search at most what the search left of
    ``auto.budget_s`` (``budget_reason`` already kept it from starting with less than ``MIN_AUTO_QAT_S``)."""
    setup = settings.setup
    qat = setup.quantization.qat
    if qat.enabled is True:
        return settings
    left = AUTO_QAT_S if auto is None else min(AUTO_QAT_S, settings.setup.auto.budget_s - auto.work_s)
    budgeted = dataclasses.replace(qat, budget_s=min(qat.budget_s, left))
    quant = dataclasses.replace(setup.quantization, qat=budgeted)
    return dataclasses.replace(settings, setup=dataclasses.replace(setup, quantization=quant))


@dataclasses.dataclass(frozen=True)
class _Trained:
    run: TrainingRun
    graph: Path  # the fine-tuned FP32 graph
    ranges: ActivationRanges  # the start's, with the learned ranges in place
    provenance: dict[str, Any]  # quantize()'s smoothing and qat entries
    model: QuantizedModel  # the Q/DQ model written from them


@dataclasses.dataclass(frozen=True)
class _StudentData:
    train: list[Batch]  # the calibration sample and data.train
    held: list[Batch]  # what picks the best checkpoint
    metric: Metric


def _train(
    settings: SearchSettings,
    start: _Start,
    setup: QuantSetup,
    smoothing: dict[str, Any] | None,
    calibration: CalibrationSet,
    data: _StudentData,
    work: Path,
    progress: bool,
) -> _Trained:
    """Train the student of ``start`` and write its Q/DQ model the way PTQ does (into ``work``)."""
    qat = settings.setup.quantization.qat
    student = build_student(
        onnx.load(str(start.source)),
        onnx.load(str(start.model.path)),
        start.model.scales,
        weight_levels(setup.quantization.weight_range, setup.deploy.targets)[0],
        qat.learn_scales,
    )
    run = train_student(student, qat, Lessons(data.train, data.held, data.metric), settings.seed, progress)
    graph = save_onnx(trained_model(student), work / "model.qat.onnx", settings.setup.export.external_data_mb)
    ranges = _with_learned(start.model.ranges, learned_ranges(student))
    provenance = {"smoothing": smoothing, "qat": _provenance(qat, run)}
    model = quantize(_absmax_weights(setup), graph, calibration, work / "int8", ranges=ranges, **provenance)
    return _Trained(run, graph, ranges, provenance, model)


@dataclasses.dataclass(frozen=True)
class _Start:
    source: Path  # the FP32 graph the start model was quantized from
    model: QuantizedModel


def _start(
    base: QuantSetup, fp32_path: Path, precision: Precision, calibration: CalibrationSet, work: Path
) -> tuple[_Start, QuantSetup]:
    """QAT starts from the fully quantized PTQ model; when the search shipped FP32, from a fresh one."""
    if precision.full.info.quantized_nodes and precision.setup is not None:
        return _Start(precision.source, precision.full), precision.setup
    setup = with_excluded(base, ())
    model = quantize(setup, fp32_path, calibration, work / "start")
    return _Start(fp32_path, model), setup


def _scores(runtime: RuntimeConfig, models: dict[str, Path], held: list[Batch], metric: Metric) -> dict[str, float]:
    """ORT's score of each model (``ort_fp32`` among them: the reference of unlabelled data)."""
    threads = runtime.threads
    runners = {name: session_runner(create_session(path, threads=threads)) for name, path in models.items()}
    return evaluate(runners, held, metric, "ort_fp32", False).values


def _absmax_weights(setup: QuantSetup) -> QuantSetup:
    """QAT trained each weight with its absmax scale; the writer uses the same rule."""
    return dataclasses.replace(setup, calibration=dataclasses.replace(setup.calibration, weights="absmax"))


def _with_learned(ranges: ActivationRanges, learned: dict[str, tuple[float, float]]) -> ActivationRanges:
    chosen = {**ranges.chosen, **learned}
    methods = {**ranges.methods, **{name: "qat" for name in learned}}
    observed = {**{n: chosen[n] for n in learned}, **ranges.observed}
    return dataclasses.replace(ranges, chosen=chosen, methods=methods, observed=observed)


def _provenance(qat: Any, run: TrainingRun) -> dict[str, Any]:
    """What scales.json says about where its QAT scales came from."""
    return {
        "steps": run.steps,
        "best_step": run.best_step,
        "optimizer": run.optimizer,
        "loss": run.loss,
        "lr": qat.lr,
        "scale_lr": qat.scale_lr,
        "batch_size": qat.batch_size,
        "validation_loss": [[s, round(v, 6)] for s, v in run.validation_loss],
    }


_PREFERENCE = ("ptq", "ptq_all_int8", "qat")  # on an exact tie, the model that changed least ships


def choose_model(metric: Metric, scores: dict[str, float], nodes: dict[str, int], max_drop: float) -> str:
    """Which of PTQ's answer (``ptq``), the all-INT8 PTQ start and QAT ships, by their ORT scores.

    Among the INT8 models within ``max_drop``: the most INT8 nodes (the fastest), then the smallest drop. When
    none is within it: PTQ's answer if it is FP32 (no INT8 model is good enough), else the smallest drop among
    those with at least as many INT8 nodes as PTQ's answer. So a QAT run that ends below its start never ships.
    """
    drops = {key: metric.drop(scores["ort_fp32"], scores[key]) for key in nodes}
    order = {key: -i for i, key in enumerate(_PREFERENCE)}
    within = [key for key in nodes if nodes[key] and drops[key] <= max_drop]
    if within:
        return max(within, key=lambda k: (nodes[k], -drops[k], order.get(k, -9)))
    if not nodes["ptq"]:
        return "ptq"
    rivals = [key for key in nodes if nodes[key] >= nodes["ptq"]]
    return min(rivals, key=lambda k: (drops[k], -order.get(k, -9)))


def int8_nodes(path: Path, op_types: tuple[str, ...]) -> int:
    """The nodes of ``op_types`` that run in INT8 in a Q/DQ model, and the integer nodes of a dynamic INT8 one
    (MatMulInteger, ConvInteger, QAttention, DynamicQuantizeLSTM)."""
    from exporters.ort.dynamic_read import INTEGER_OPS

    model = onnx.load(str(path), load_external_data=False)
    dynamic = sum(n.op_type in INTEGER_OPS or n.op_type == "DynamicQuantizeLSTM" for n in model.graph.node)
    return len(kept_nodes(model, op_types)) + dynamic


def _record(
    metric: Metric, scores: dict[str, float], nodes: dict[str, int], run: TrainingRun, choice: str
) -> dict[str, Any]:
    """The build.json ``qat`` section: the side-by-side scores, the choice and the training curves."""
    fp32 = scores["ort_fp32"]
    rows = {
        key: {"metric": scores[key], "drop": metric.drop(fp32, scores[key]), "int8_nodes": count}
        for key, count in nodes.items()
    }
    ptq_nodes = nodes["ptq"]
    start_drop = rows.get("ptq_all_int8", rows["ptq"])["drop"]
    qat_row, ptq_row = rows["qat"], rows["ptq"]
    why = (
        f"QAT: drop {qat_row['drop']:.3f} with {qat_row['int8_nodes']} INT8 nodes; PTQ's answer: "
        f"drop {ptq_row['drop']:.3f} with {ptq_nodes}"
    )
    return {
        "ran": True,
        "shipped": choice,
        "why": why,
        "fp32": fp32,
        "rows": rows,
        "improved_on_start": rows["qat"]["drop"] < start_drop,
        "training": run.to_json(),
        "plot": "qat.png",
    }


def _keep_copy(path: Path, copy: Path) -> Path:
    """PTQ's shipped model is about to be overwritten by QAT's; a copy is benchmarked beside it."""
    return Path(shutil.copyfile(path, copy))
