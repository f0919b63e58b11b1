"""The verification stages: other backends' artifacts and compat reports, then the comparison and align verify."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from deploy_opt.analysis.align import AlignReport, verify_alignment
from deploy_opt.analysis.compare import compare_backends, fixed_samples
from deploy_opt.analysis.comparison import ComparedModels, Comparison
from deploy_opt.analysis.compat import check_compat
from deploy_opt.analysis.compat_report import write_compat
from deploy_opt.config.build import CompareConfig
from deploy_opt.config.setup import BackendSettings
from deploy_opt.data.sources import Batch
from deploy_opt.report.model_sections import Backends
from deploy_opt.stages.backends import write_backend_artifacts
from deploy_opt.stages.quantize import QuantizedModel


@dataclass(frozen=True)
class Verification:
    """The cross-backend comparison (None when disabled) and the align verify verdict."""

    comparison: Comparison | None
    alignment: AlignReport

    def comparison_summary(self) -> dict[str, Any] | None:
        """The verdict and first divergence for build.json; the whole comparison is in compare.json."""
        return None if self.comparison is None else self.comparison.summary()

    def alignment_summary(self) -> dict[str, Any]:
        """The align verify verdict and one line per artifact, for build.json."""
        return {"verdict": self.alignment.verdict, "artifacts": [c.to_json() for c in self.alignment.checks]}


def write_backends(
    settings: BackendSettings,
    fp32_path: Path,
    shipped: QuantizedModel,
    sample: Batch,
    stage: Path,
    shapes: Sequence[Mapping[str, tuple[int, ...]]] = (),
) -> Backends:
    """AIMET, TensorRT cache and engine from scales.json, plus compat reports of the FP32 and Q/DQ models.

    ``shapes``: every batch's ``{input: shape}`` (calibration and evaluation), for the engine's profile.
    """
    artifacts = write_backend_artifacts(settings, shipped, sample, stage, shapes, fp32=fp32_path)
    compat = {}
    targets = settings.deploy.targets
    reports = [("compat", fp32_path, targets), ("compat.int8", shipped.path, targets)]
    if (stage / "model.trt.onnx").is_file():  # TensorRT's form of the Q/DQ model is judged for TensorRT alone
        others = tuple(t for t in targets if t != "tensorrt")
        reports[1:] = [("compat.int8", shipped.path, others), ("compat.trt", stage / "model.trt.onnx", ("tensorrt",))]
    for name, model, judged in reports:
        report = check_compat(model, judged)
        write_compat(report, stage, name=name)
        compat[name] = report.counts()
    return Backends(artifacts, compat)


def compare_and_align(
    compare: CompareConfig,
    models: tuple[Path, Path],
    samples: Sequence[Batch],
    stage: Path,
    seed: int,
    torch_model: Any,
    threads: int,
    judge_top1: bool,
) -> Verification:
    """Compare every backend on fixed samples (when enabled), then read every artifact's scales back."""
    comparison = None
    if compare.enabled:
        seed = seed if compare.seed is None else compare.seed
        with ExitStack() as stack:
            extra = {}
            if (stage / "model.engine").is_file():
                from exporters.tensorrt.runner import engine_runner

                runner = stack.enter_context(engine_runner(stage / "model.engine"))
                graph = onnx.load(str(models[0]), load_external_data=False).graph
                extra["tensorrt_int8"] = runner.in_order([o.name for o in graph.output])  # by name, not position
            compared = ComparedModels(*models, torch_model, extra, threads, judge_top1)
            samples_ = fixed_samples(list(samples), compare.samples, seed)
            comparison = compare_backends(compared, samples_, stage, config=compare, seed=seed)
    return Verification(comparison, verify_alignment(stage))
