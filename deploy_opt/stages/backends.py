"""Stage: the other backends' artifacts, all written from the one scales.json.

- ``encodings.json``: AIMET encodings (every build);
- ``calibration.cache``: the legacy TensorRT cache, when activations are symmetric (TensorRT's only scheme) and
  the installed TensorRT, if any, is older than 11 (which reads no such cache);
- ``model.engine``: a TensorRT engine from the Q/DQ model, when the profile targets TensorRT and tensorrt runs
  here, with an optimisation profile spanning every input shape the build saw. Without tensorrt every step up to
  the builder call still runs, and the build records why it stopped. Its timings sit beside ORT CUDA's only when
  the ORT session really runs on CUDA.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrators.scales.format import ScaleFile
from deploy_opt.config.setup import BackendSettings
from deploy_opt.data.sources import Batch
from deploy_opt.report.model_sections import BackendArtifacts, TensorRTRecord
from deploy_opt.stages.benchmark import feed_of_size
from deploy_opt.stages.quantize import QuantizedModel
from dopt_common.errors import DeployOptError
from exporters.aimet import write_aimet_encodings
from exporters.tensorrt.cache import write_trt_cache
from exporters.tensorrt.profile import Shape, ShapeProfile, declared_dims, input_shapes

log = logging.getLogger(__name__)
DEFAULT_TRT_VERSION = "10.0.1"


def write_backend_artifacts(
    settings: BackendSettings,
    quantized: QuantizedModel,
    sample: Batch,
    stage: Path,
    shapes: Sequence[Mapping[str, Shape]] = (),
    fp32: Path | None = None,
) -> BackendArtifacts:
    """Write the interop files and, where possible, the TensorRT engine; returns what each wrote, or why not.

    ``shapes``: ``{input: shape}`` of every batch the build runs (calibration and evaluation), for the engine's
    optimisation profile. ``fp32``: the FP32 model the engine is timed against on ORT CUDA (the Q/DQ model
    when not given).
    """
    scales = quantized.scales
    record: dict[str, Any] = {"aimet": write_aimet_encodings(scales, stage / "encodings.json").name}
    record["trt_cache"] = write_calibration_cache(scales, stage)
    if "tensorrt" in settings.deploy.targets:
        qdq = tensorrt_qdq(quantized.path, stage, settings.export.external_data_mb)
        if qdq != quantized.path:
            record["tensorrt_qdq"] = (
                f"{qdq.name}: model.int8.onnx keeps ORT's int32 biases for ORT CPU; TensorRT refuses them, so the "
                "engine is built from this copy with float biases and the same scales"
            )
        record["tensorrt"] = build_tensorrt(settings, qdq, sample, stage, shapes, fp32 or quantized.path).to_json()
    return BackendArtifacts.from_json(record)


def write_calibration_cache(scales: ScaleFile, stage: Path) -> str:
    """``calibration.cache`` for the installed TensorRT (10.0.1's header where none is), or why it is not written.

    TensorRT 11 removed implicit INT8 calibration (IInt8Calibrator, BuilderFlag.INT8), the only reader of the
    file, so an installed TensorRT >= 11 gets none."""
    from exporters.tensorrt.engine import major_version

    installed = _installed_trt_version()
    if installed and major_version(installed) >= 11:
        return (
            f"not written: the installed TensorRT {installed} has no implicit INT8 calibration (TensorRT 11 removed "
            "IInt8Calibrator and BuilderFlag.INT8), so nothing reads a calibration cache; its engines take their "
            "scales from the Q/DQ model"
        )
    if scales.activations != "symmetric":
        return (
            "not written: activations are asymmetric (uint8, the ORT CPU choice); TensorRT takes only symmetric "
            "int8, so build with a TensorRT profile or --set quantization.activations=symmetric"
        )
    return write_trt_cache(scales, stage / "calibration.cache", trt_version=installed or DEFAULT_TRT_VERSION).name


def tensorrt_qdq(qdq: Path, stage: Path, external_data_mb: int) -> Path:
    """The Q/DQ model TensorRT parses: ``qdq`` itself, or its float-bias copy where it has int32 biases."""
    import onnx

    from exporters.tensorrt.form import int32_dequantize_nodes, to_tensorrt_form

    if not int32_dequantize_nodes(onnx.load(str(qdq), load_external_data=False)):
        return qdq
    return to_tensorrt_form(qdq, stage / "model.trt.onnx", external_data_mb)[0]


def build_tensorrt(
    settings: BackendSettings,
    qdq: Path,
    sample: Batch,
    stage: Path,
    shapes: Sequence[Mapping[str, Shape]],
    fp32: Path,
) -> TensorRTRecord:
    """The engine and its timing against ORT CUDA on ``fp32``, or 'not available: why' without failing."""
    from exporters.tensorrt.engine import build_engine, tensorrt_status

    status = tensorrt_status()
    if not status.startswith("available"):
        log.warning("tensorrt: %s; the Q/DQ model, cache and compat report are written, the engine is not", status)
        return TensorRTRecord.from_json({"status": f"tensorrt: {status}"})
    try:
        profile = engine_profile(settings, qdq, sample, shapes)
        built = build_engine(
            qdq,
            stage / "model.engine",
            profile,
            fp16_fallback=settings.deploy.fallback_precision == "fp16",
        )
    except DeployOptError as exc:
        log.error("tensorrt engine build failed: %s", exc)
        return TensorRTRecord.from_json({"status": f"tensorrt: build failed: {exc}"})
    record: dict[str, Any] = {"status": f"built: {built.path.name}", **built.to_json()}
    record["profile"] = {name: profile.describe(name) for name in profile.shapes}
    try:
        timing = time_engine_vs_ort_cuda(built.path, fp32, sample, settings.benchmark.batch_sizes)
        record["timing_ms"] = timing.to_json()
    except DeployOptError as exc:
        log.error("tensorrt timing failed: %s", exc)
        record["timing_ms"] = f"failed: {exc}"
    return TensorRTRecord.from_json(record)


def engine_profile(
    settings: BackendSettings, qdq: Path, sample: Batch, shapes: Sequence[Mapping[str, Shape]]
) -> ShapeProfile:
    """min/opt/max per input from every shape the build runs: calibration, evaluation, benchmark and compare.

    Batch: 1 to the largest batch any stage runs, tuned for the gate's batch. Other symbolic dims: the range
    seen, tuned for the benchmark sample's (the shape the timings are taken at).
    """
    sizes = settings.benchmark.batch_sizes
    compare = settings.compare.batch_size if settings.compare.enabled else 1
    sample_shapes = input_shapes([sample.inputs])[0]
    return ShapeProfile.from_shapes(
        [*shapes, sample_shapes],
        max_batch=max(*sizes, compare, sample.size),
        opt_batch=settings.gate.speedup_batch or max(sizes),
        declared=declared_dims(qdq),
        opt=sample_shapes,
    )


TIMING_METHOD = (
    "median ms per batch size; tensorrt_execute: CUDA events around execute_async_v3 alone; tensorrt and "
    "ort_cuda_fp32: wall clock per call with host-device copies (the like-for-like pair the speedup divides); "
    "ORT CUDA runs the FP32 model, since its CUDA EP runs Q/DQ in float"
)
ORT_GPU_FIX = "pip install 'onnxruntime-gpu[cuda,cudnn]' in place of onnxruntime"


@dataclass(frozen=True)
class EngineTiming:
    """The engine's median ms per batch size, and ORT CUDA's on the FP32 model where CUDA really ran it."""

    ort_cuda: str  # 'ran on ...', or 'not available: why'
    rows: dict[str, dict[str, float]]  # by batch size: tensorrt_execute, tensorrt, ort_cuda_fp32, speedup_vs_...
    method: str = TIMING_METHOD

    def to_json(self) -> dict[str, Any]:
        """build.json's ``backends.tensorrt.timing_ms``."""
        return {"method": self.method, "ort_cuda": self.ort_cuda, **self.rows}


def time_engine_vs_ort_cuda(engine: Path, fp32: Path, sample: Batch, sizes: tuple[int, ...]) -> EngineTiming:
    """Median ms per batch size: the INT8 engine, and ORT CUDA on the FP32 model where CUDA really runs it.

    Not the Q/DQ model: ORT's CUDA EP fuses no Q/DQ (its QDQ selectors serve the CPU, DML and ACL providers) and
    runs it in float at about half the FP32 model's speed, which would flatter the engine."""
    from exporters.tensorrt.runner import engine_runner, time_runner, wall_median_ms

    session, cuda_status = ort_cuda_session(fp32)
    rows: dict[str, dict[str, float]] = {}
    with engine_runner(engine) as runner:
        for size in sizes:
            feeds = feed_of_size(sample, size)
            row = {"tensorrt_execute": time_runner(runner, feeds), "tensorrt": wall_median_ms(runner, feeds)}
            if session is not None:
                row["ort_cuda_fp32"] = wall_median_ms(lambda f: session.run(None, f), feeds)
                row["speedup_vs_ort_cuda_fp32"] = row["ort_cuda_fp32"] / row["tensorrt"]
            rows[str(size)] = row
    return EngineTiming(cuda_status, rows)


def ort_cuda_session(qdq: Path) -> tuple[Any | None, str]:
    """An ORT session that really runs on CUDA, or (None, 'not available: why').

    ORT falls back to CPU without an error when the CUDA or cuDNN libraries do not load (onnxruntime-gpu
    installed without its ``[cuda,cudnn]`` extras), so the session's own providers are checked, not only the
    package's.
    """
    from dopt_common.deps import require
    from dopt_common.ort import create_session

    ort = require("onnxruntime", purpose="timing ONNX Runtime CUDA")
    available = list(ort.get_available_providers())
    if "CUDAExecutionProvider" not in available:
        return None, f"not available: onnxruntime has no CUDAExecutionProvider ({available}); fix: {ORT_GPU_FIX}"
    try:
        session = create_session(qdq, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    except DeployOptError as exc:
        return None, f"not available: {exc}"
    providers = list(session.get_providers())
    if "CUDAExecutionProvider" not in providers:
        return None, (
            f"not available: session fell back to CPU (providers {providers}: the CUDA/cuDNN libraries did not "
            f"load); fix: {ORT_GPU_FIX}"
        )
    return session, f"ran on {providers}"


def _installed_trt_version() -> str | None:
    """``tensorrt.__version__``: the module, not a distribution. NVIDIA's split wheels (``tensorrt-cu13``,
    ``-libs``, ``-bindings``) install no distribution named ``tensorrt``, so ``importlib.metadata`` misses them,
    and TensorRT skips a cache whose header names another version."""
    from deploy_opt.analysis.compat_data import installed_tensorrt

    return installed_tensorrt()
