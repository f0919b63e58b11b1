"""The build pipeline, top to bottom: load → FP32 ONNX → calibrate and quantize (with fallback) → other backends
and compat → evaluate → benchmark → cross-backend comparison and align verify → gate → build.json and summary.md.

Each stage is a plain function in its own module of ``deploy_opt/stages/`` (or, for the stages that drive other
packages, of ``deploy_opt/pipeline/``) and returns a frozen result; this module only composes them. The build is
assembled in a staging folder and published whole (``staged_dir``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from deploy_opt.config.build import BuildConfig, CompareConfig
from deploy_opt.config.profiles import Profile
from deploy_opt.config.setup import BackendSettings, SearchSettings
from deploy_opt.evaluation.metrics import resolve_metric
from deploy_opt.pipeline.context import StageContext
from deploy_opt.pipeline.precision import (
    Precision,
    auto_precision,
    choose_precision,
    needs_held_evaluation,
    quantize_fully,
)
from deploy_opt.pipeline.prune import ORIGINAL_DIR, PrunedModel, finish_prune, prune_model
from deploy_opt.pipeline.qat import fine_tune, int8_nodes
from deploy_opt.prune.distill import DistillData
from deploy_opt.report import record
from deploy_opt.report.build_record import BuildRecord, ProfileRef
from deploy_opt.report.gate import GateResult, apply_gate
from deploy_opt.report.outcome import GateSettings
from deploy_opt.report.trust import alignment_criterion, with_criterion
from deploy_opt.stages.benchmark import respect_fixed_batch
from deploy_opt.stages.export import Fp32Model, prepare_fp32
from deploy_opt.stages.inputs import BuildInputs, load_inputs, training_batches
from deploy_opt.stages.runtime import cpu_timed, evaluate_runtimes, run_benchmark
from deploy_opt.stages.splits import split_evaluation
from deploy_opt.stages.summary import metric_record, sensitivity_summary, target_status
from deploy_opt.stages.verify import Verification, compare_and_align, write_backends
from dopt_common.files import ensure_writable_dir
from dopt_common.names import run_dir
from dopt_common.ownership import check_separate, run_kind
from dopt_common.runs import Timings, failed_dir, seed_everything, staged_dir
from exporters.tensorrt.profile import input_shapes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """Where the build landed and its verdict; ``kept``: the last passing build, left in place because this one
    failed its gate (this one is then in ``<name>.failed/`` beside it), else None."""

    out_dir: Path
    build: BuildRecord
    gate: GateResult
    kept: Path | None = None


def run_build(
    config: BuildConfig, profile: Profile, output_root: Path, progress: bool = True, wait: bool = False
) -> BuildResult:
    """Build, verify, evaluate and gate one model; every artifact lands in ``output_root/<name>/``.

    ``wait``: wait for another build of the same name to finish instead of failing at once.
    """
    out_dir = run_dir(ensure_writable_dir(output_root), config.name)
    held, read = input_locations(config)
    check_separate(out_dir, held, read)
    check_separate(failed_dir(out_dir), held, read)
    diverted: list[bool] = []  # decided before the publish: a failing build must not replace a passing one
    with staged_dir(out_dir, wait=wait, divert=lambda: diverted[0]) as stage:
        build, gate = _build_into(config, profile, stage, progress)
        diverted.append(not gate.passed and passed_before(out_dir))
    if diverted[0]:
        log.warning(
            "gate failed: this build is in %s; the last passing build stays in %s", failed_dir(out_dir), out_dir
        )
        return BuildResult(failed_dir(out_dir), build, gate, kept=out_dir)
    return BuildResult(out_dir, build, gate)


def passed_before(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a build to keep: its recorded gate passed, in any build.json format deploy_opt
    can read. A build whose record this release cannot read (another format version, an unreadable file) counts
    as passed: it is kept beside a failing build rather than destroyed."""
    if run_kind(out_dir) != "build":
        return False
    try:
        data = json.loads((out_dir / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return True
    gate = data.get("gate") if isinstance(data, dict) else None
    passed = gate.get("passed") if isinstance(gate, dict) else None
    return passed if isinstance(passed, bool) else True


def input_locations(config: BuildConfig) -> tuple[list[Path], list[Path]]:
    """What a build reads from disk: every input path (the config's folder, the model, the data), and of those
    the folders it reads as data (image folders, datasets, text folders, a Hugging Face model folder)."""
    base = Path(config.base_dir)
    model, data = config.model, config.data
    named = [model.onnx, model.hf, model.checkpoint, data.calibration, data.evaluation, data.validation]
    named += [data.train, data.tokenizer]
    paths = [base / ref for ref in named if ref is not None and ":" not in ref and (base / ref).exists()]
    return [base, *paths], [p for p in paths if p.is_dir()]


def _build_into(config: BuildConfig, profile: Profile, stage: Path, progress: bool) -> tuple[BuildRecord, GateResult]:
    times, threads = Timings(), config.stage_runtime.threads
    seed_everything(config.seed)
    with times.stage("load", explain=False):
        inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
    metric = resolve_metric(config.data.metric, config.base_dir)
    split = split_evaluation(
        config.data,
        inputs.specs,
        config.base_dir,
        inputs.evaluation(hold=needs_held_evaluation(config.quantization, config.sensitivity) or config.prune.enabled),
        inputs.calibration,
        config.seed,
    )
    # every choice below is made on split.decide; the gate judges split.judge
    ctx = StageContext(stage, times, progress, metric, list(split.decide))
    inputs, fp32, pruned, original = _export_models(config, inputs, ctx)
    config = respect_fixed_batch(config, fp32.path)
    precision = _quantize(config, fp32, inputs, ctx)
    shipped = precision.shipped
    samples = split.judge if isinstance(split.judge, list) else inputs.head  # what the comparison will run
    # Every input shape a stage runs, so the TensorRT profile spans them (sequence axes padded per batch vary).
    shapes = input_shapes(b.inputs for b in (*inputs.calibration.batches, *samples))
    with times.stage("backends"):
        backends = write_backends(BackendSettings.of(config), fp32.path, shipped, inputs.head[0], stage, shapes)
    with times.stage("evaluate"):
        models = _evaluated_models(fp32, precision, original)
        reference = inputs.torch_model if pruned is None else pruned.original
        names = [s.name for s in fp32.inputs]
        runtimes = evaluate_runtimes(
            models, names, reference, split.judge, metric, threads, progress, decision=split.separate_decision
        )
    with times.stage("benchmark"):
        fp32_ships = not int8_nodes(shipped.path, config.quantization.op_types)
        same = {"ort_int8": "ort_fp32"} if fp32_ships else None  # the same graph: timed once
        bench = run_benchmark(cpu_timed(config.deploy, config.benchmark), runtimes.sessions, inputs.head[0], same)
    with times.stage("compare_align"):
        verified = compare_and_align(
            _comparison_setting(config.compare, fp32_ships),
            (fp32.path, shipped.path),
            samples,
            stage,
            config.seed,
            inputs.torch_model,
            threads,
            judge_top1=metric.name == "top1",
        )
        (log.info if verified.alignment.ok else log.error)("align verify: %s", verified.alignment.verdict)
    metrics = metric_record(metric, runtimes, labelled=inputs.head[0].label is not None, split=split)
    prune = None if pruned is None else finish_prune(pruned, metrics, bench, models, metric.name, stage)
    sensitivity = sensitivity_summary(precision.sensitivity)
    build = record.build_record(
        name=config.name,
        description=config.description,
        seed=config.seed,
        profile=ProfileRef(profile.name, profile.description),
        export=fp32.info,
        quantization=shipped.info,
        metrics=metrics,
        benchmark=bench,
        gate=None,  # judged below, on this record
        targets=target_status(config.deploy, backends),
        calibration=inputs.calibration.to_json(),
        fallback=precision.fallback.to_json(),
        auto=precision.auto.to_json() if precision.auto else None,
        qat=precision.qat,
        prune=prune.to_json() if prune else None,
        backends=backends,
        alignment=verified.alignment_summary(),
        comparison=verified.comparison_summary(),
        sensitivity=sensitivity.to_json() if sensitivity else None,
        timings_s=times.seconds,
        versions=record.versions(),
        config=config.to_dict(),
    )
    gate = _judge(config, build, verified)
    build = record.write_reports(stage, dataclasses.replace(build, gate=gate))
    return build, gate


def _export_models(
    config: BuildConfig, inputs: BuildInputs, ctx: StageContext
) -> tuple[BuildInputs, Fp32Model, PrunedModel | None, Fp32Model | None]:
    """Prune (when asked), then export: (inputs with the pruned torch model, FP32 model, pruned run, original FP32).

    The original FP32 model is exported beside the pruned one: the gate judges against it, and it is the latency
    baseline. Without pruning the last two are None.
    """
    pruned = original = None
    stage = ctx.stage
    if config.prune.enabled:
        with ctx.times.stage("prune"):
            data = DistillData(
                names=[s.name for s in inputs.specs],
                batches=[*inputs.calibration.batches, *training_batches(config.data, config.base_dir, inputs.specs)],
                evaluation=ctx.evaluation,
                metric=ctx.metric,
            )
            factory = str(config.model.factory)
            pruned = prune_model(config.prune, factory, inputs.torch_model, data, stage, config.seed, ctx.progress)
        inputs = dataclasses.replace(inputs, torch_model=pruned.model)
    with ctx.times.stage("export"):
        parity = list(inputs.head[: config.export.parity_batches])
        source = (config.export, config.model, config.stage_runtime, config.base_dir)
        fp32 = prepare_fp32(*source, inputs.torch_model, inputs.calibration.batches[0], parity, stage)
        if pruned is not None:  # the reference the gate judges against, and the latency baseline
            original = prepare_fp32(
                *source,
                pruned.original,
                inputs.calibration.batches[0],
                parity,
                ensure_writable_dir(stage / ORIGINAL_DIR),
            )
    return inputs, fp32, pruned, original


def _quantize(config: BuildConfig, fp32: Fp32Model, inputs: BuildInputs, ctx: StageContext) -> Precision:
    """Calibrate and quantize: the auto search, or the configured ranges with the sensitivity fallback; then QAT
    when asked. Every choice is made on ``ctx.evaluation`` (the decide split)."""
    settings = SearchSettings.of(config)
    if config.quantization.mode == "auto":
        with ctx.times.stage("auto_search"):
            precision = auto_precision(settings, config.name, fp32.path, inputs.calibration, ctx)
    else:
        with ctx.times.stage("calibrate_quantize"):
            quantized = quantize_fully(settings.setup, fp32.path, inputs.calibration, ctx.stage)
        with ctx.times.stage("sensitivity_fallback"):
            precision = choose_precision(settings, config.name, quantized, inputs.calibration, ctx)
    if config.quantization.qat.enabled:
        extra = lambda: training_batches(config.data, config.base_dir, inputs.specs)  # noqa: E731 - read when QAT trains
        with ctx.times.stage("qat"):
            precision = fine_tune(settings, fp32.path, precision, inputs.calibration, ctx, extra)
    return precision


def _evaluated_models(fp32: Fp32Model, precision: Precision, original: Fp32Model | None) -> dict[str, Path]:
    """Every ONNX model the judged samples score, by the name build.json gives it."""
    models = {"ort_fp32": fp32.path, "ort_int8": precision.shipped.path}
    if precision.mixed:
        models["ort_int8_no_fallback"] = precision.full.path
    models |= dict(precision.alternatives)
    return models if original is None else {"ort_fp32_original": original.path} | models


def _judge(config: BuildConfig, build: BuildRecord, verified: Verification) -> GateResult:
    """The gate on the record's judged metrics, benchmark (a GPU profile's: the TensorRT engine's timing, in its
    backends) and what shipped, plus the alignment criterion."""
    gate_cfg = config.gate
    speedup = gate_cfg.min_speedup if config.benchmark.enabled else None  # no benchmark: speed is left out
    gate = apply_gate(build, GateSettings(gate_cfg.max_drop, speedup, gate_cfg.speedup_batch, gate_cfg.allow_fp32))
    return with_criterion(gate, alignment_criterion(verified.alignment.ok, verified.alignment.verdict))


def _comparison_setting(compare: CompareConfig, fp32_ships: bool) -> CompareConfig:
    """The cross-backend comparison, off when FP32 ships: no node is quantized, so every backend runs the FP32
    graph and there is no quantization error to localise (align verify still reads every artifact back)."""
    if not compare.enabled or not fp32_ships:
        return compare
    log.info("compare: not run, FP32 ships (no node quantized), so there is no INT8 error to localise")
    return dataclasses.replace(compare, enabled=False)
