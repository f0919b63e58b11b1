"""The build pipeline, top to bottom: source → FP32 ONNX → calibrate → scales.json → Q/DQ → other backends'
artifacts (AIMET, TensorRT cache and engine) and the compat report → evaluate → benchmark → cross-backend
comparison → align verify → gate → reports. Each stage is a plain function; this module only composes them.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.analysis.align import verify_alignment
from deploy_opt.analysis.compare import compare_backends, fixed_samples
from deploy_opt.analysis.compat import check_compat, write_compat
from deploy_opt.analysis.sensitivity.mixed_precision import (
    auto_fallback,
    run_sensitivity,
    static_fallback,
    with_excluded,
)
from deploy_opt.build import benchmark
from deploy_opt.build.backends import write_backend_artifacts
from deploy_opt.build.calibration_set import choose_calibration, evaluation_ids, refuse_overlap
from deploy_opt.build.evaluate import evaluate, session_runner, torch_runner
from deploy_opt.build.export import input_specs_from_onnx, prepare_fp32
from deploy_opt.build.metrics import resolve_metric
from deploy_opt.build.quantize import quantize
from deploy_opt.build.smoothing import smooth_model
from deploy_opt.build.sources import iter_batches, load_torch_model
from deploy_opt.config.build import BuildConfig
from deploy_opt.config.profiles import Profile
from deploy_opt.report import record as report
from deploy_opt.report.calibration_plot import plot_histograms
from deploy_opt.report.gate import GateResult, apply_gate
from dopt_common.errors import InputError
from dopt_common.files import ensure_writable_dir
from dopt_common.ort import create_session
from exporters.onnx.checks import check_onnx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """Where the build landed and its verdict."""

    out_dir: Path
    build: dict[str, Any]
    gate: GateResult


def run_build(config: BuildConfig, profile: Profile, output_root: Path, progress: bool = True) -> BuildResult:
    """Build, verify, evaluate and gate one model; every artifact lands in ``output_root/<name>/``."""
    out_dir = ensure_writable_dir(output_root) / config.name
    stage = report.staging_dir(out_dir)
    try:
        result = _build_into(config, profile, stage, progress)
        report.publish(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return BuildResult(out_dir, result.build, result.gate)


def _build_into(config: BuildConfig, profile: Profile, stage: Path, progress: bool) -> BuildResult:
    times = report.Timings()
    _seed_everything(config.seed)
    base = config.base_dir

    with times.stage("load"):
        torch_model = (
            load_torch_model(config.model.factory, config.model.checkpoint, base) if config.model.factory else None
        )
        specs = config.model.inputs or input_specs_from_onnx(check_onnx(Path(base) / config.model.onnx))
        calibration = choose_calibration(config, specs)
        refuse_overlap(calibration, evaluation_ids(config, specs))
        # Evaluation streams (a user's validation set may not fit in memory); only its head is kept.
        stream = iter_batches(config.data.evaluation, specs, base, "data.evaluation", config.data.eval_samples)
        head = list(itertools.islice(stream, max(1, config.export.parity_batches)))
        if not head:
            raise InputError(f"data.evaluation '{config.data.evaluation}' yielded no samples; fix the data function")

    with times.stage("export"):
        fp32 = prepare_fp32(config, torch_model, calibration.batches[0], head[: config.export.parity_batches], stage)

    quant = config.quantization
    auto = quant.fallback == "auto"
    analyze = config.sensitivity.enabled or auto
    with times.stage("calibrate_quantize"):
        # The graph that is calibrated and quantized: the FP32 model, or its SmoothQuant-ed twin.
        source, smoothing = fp32.path, None
        if quant.smoothing == "smoothquant":
            source, smoothing = smooth_model(config, fp32.path, calibration, stage / ".smoothed.onnx")
        static = static_fallback(config, source)
        mixed = bool(static) or auto
        # With fallback, the fully quantized model is the reference point (and what sensitivity analyzes).
        full = quantize(
            with_excluded(config, ()), source, calibration, stage / ".full" if mixed else stage, smoothing=smoothing
        )

    metric = resolve_metric(config.data.metric, base)
    # Sensitivity and auto fallback revisit the evaluation set, so it is held; otherwise it streams.
    evaluation = head + list(stream) if analyze else itertools.chain(head, stream)
    fallback: dict = {"static": list(static), "nodes": list(static)}
    with times.stage("sensitivity_fallback"):
        record = run_sensitivity(config, source, full.path, evaluation, metric, stage) if analyze else None
        if auto:
            fallback["auto"] = auto_fallback(config, source, full.path, evaluation, metric, record)
            fallback["nodes"] = list(static) + [n for n in fallback["auto"]["nodes"] if n not in static]
        quantized = full
        if mixed:
            excluded = with_excluded(config, tuple(fallback["nodes"]))
            quantized = quantize(excluded, source, calibration, stage, ranges=full.ranges, smoothing=smoothing)
        ranges = quantized.ranges
        plot_histograms(
            {n: ranges.absolute[n] for n in ranges.plotted}, ranges.chosen, ranges.methods, stage / "calibration.png"
        )

    with times.stage("backends"):
        backends = write_backend_artifacts(config, quantized, head[0], stage)
        compat = {}
        for name, model in (("compat", fp32.path), ("compat.int8", quantized.path)):
            compat_report = check_compat(model, config.deploy.targets)
            write_compat(compat_report, stage, name=name)
            compat[name] = {"summary": compat_report.get("summary"), "flagged": len(compat_report.get("flagged") or [])}
        backends["compat"] = compat

    with times.stage("evaluate"):
        threads = config.benchmark.threads
        sessions = {
            "ort_fp32": create_session(fp32.path, threads=threads),
            "ort_int8": create_session(quantized.path, threads=threads),
        }
        if mixed:
            sessions["ort_int8_no_fallback"] = create_session(full.path, threads=threads)
        runners = {name: session_runner(s) for name, s in sessions.items()}
        if torch_model is not None:
            runners = {"torch_fp32": torch_runner(torch_model, [s.name for s in fp32.inputs])} | runners
        reference = "torch_fp32" if torch_model is not None else "ort_fp32"
        scores = evaluate(runners, evaluation, metric, reference, progress)

    with times.stage("benchmark"):
        bench = None
        if config.benchmark.enabled:
            b = config.benchmark
            bench = {
                "threads": b.threads,
                "warmup": b.warmup,
                "repeats": b.repeats,
                "input_shapes": {k: list(v.shape[1:]) for k, v in head[0].inputs.items()},
                "batches": benchmark.compare(sessions, head[0], b.batch_sizes, b.warmup, b.repeats),
            }

    with times.stage("compare_align"):
        comparison = None
        if config.compare.enabled:
            seed = config.seed if config.compare.seed is None else config.compare.seed
            extra = {}
            if (stage / "model.engine").is_file():
                from exporters.tensorrt.engine import engine_runner

                extra["tensorrt_int8"] = engine_runner(stage / "model.engine")
            comparison = compare_backends(
                fp32.path,
                quantized.path,
                fixed_samples(evaluation if isinstance(evaluation, list) else head, config.compare.samples, seed),
                stage,
                config=config.compare,
                seed=seed,
                torch_model=torch_model,
                extra_runners=extra,
                threads=config.benchmark.threads,
                judge_top1=metric.name == "top1",
            )
        alignment = verify_alignment(stage)
        (log.info if alignment.ok else log.error)("align verify: %s", alignment.verdict)

    metrics = {
        "name": metric.name,
        "higher_is_better": metric.higher_is_better,
        "samples": scores.samples,
        "reference": "labels" if head[0].label is not None else f"{reference} output",
        **scores.values,
        "drop": metric.drop(scores.values["ort_fp32"], scores.values["ort_int8"]),
        "drop_vs": "ort_fp32",
    }
    if "ort_int8_no_fallback" in scores.values:
        metrics["drop_no_fallback"] = metric.drop(scores.values["ort_fp32"], scores.values["ort_int8_no_fallback"])
    gate = apply_gate(
        {"metrics": metrics, "benchmark": bench},
        config.gate.max_drop,
        config.gate.min_speedup if bench else None,
        config.gate.speedup_batch,
    )
    build = report.build_record(
        name=config.name,
        description=config.description,
        seed=config.seed,
        profile={"name": profile.name, "description": profile.description},
        export=fp32.info,
        quantization=quantized.info,
        metrics=metrics,
        benchmark=bench,
        gate=gate.to_json(),
        targets=_targets(config, backends),
        calibration=calibration.to_json(),
        fallback=fallback,
        backends=backends,
        alignment={"verdict": alignment.verdict, "artifacts": [c.to_json() for c in alignment.checks]},
        comparison=_comparison_summary(comparison),
        sensitivity=_sensitivity_summary(record),
        timings_s=times.seconds,
        versions=report.versions(),
        config=config.to_dict(),
    )
    report.write_reports(stage, build)
    return BuildResult(stage, build, gate)


def _comparison_summary(record: dict | None) -> dict | None:
    """The verdict and first divergence for build.json; the whole comparison is in compare.json."""
    if record is None:
        return None
    return {
        "file": "compare.json",
        "verdict": record.get("verdict"),
        "first_divergence": record.get("first_divergence"),
        "backends": {name: b.get("status") for name, b in (record.get("backends") or {}).items()},
    }


def _sensitivity_summary(record: dict | None) -> dict | None:
    """The top of the ranking for build.json; the whole analysis is in sensitivity.json."""
    if record is None:
        return None
    top = sorted(record["nodes"], key=lambda n: n["rank"])[:10]
    return {
        "mode": record["mode"],
        "metric": record["metric"],
        "timings_s": record["timings_s"],
        "files": ["sensitivity.json", "sensitivity.png", "sensitivity.html"],
        "top": [{k: n[k] for k in ("rank", "name", "op_type", "drop_both", "proxy")} for n in top],
    }


def _targets(config: BuildConfig, backends: dict[str, Any]) -> dict[str, str]:
    status = {}
    for target in config.deploy.targets:
        if target == "ort-cpu":
            status[target] = "built: model.int8.onnx (ONNX Runtime CPU, Q/DQ)"
        elif target == "ort-cuda":
            status[target] = "built: model.int8.onnx runs on ORT CUDA as is (compare.json says whether it ran here)"
        else:
            status[target] = (backends.get("tensorrt") or {}).get("status", "tensorrt: not attempted")
    return status


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass
