"""Stage: the other backends' artifacts, all written from the one scales.json.

- ``encodings.json``: AIMET encodings (every build);
- ``calibration.cache``: the legacy TensorRT cache, when activations are symmetric (TensorRT's only scheme);
- ``model.engine``: a TensorRT engine from the Q/DQ model, when the profile targets TensorRT and tensorrt runs
  here. Without tensorrt every step up to the builder call still runs, and the build records why it stopped.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from deploy_opt.build.benchmark import feed_of_size
from deploy_opt.build.quantize import QuantizedModel
from deploy_opt.build.sources import Batch
from deploy_opt.config.build import BuildConfig
from dopt_common.errors import DeployOptError
from exporters.aimet import write_aimet_encodings
from exporters.tensorrt.cache import write_trt_cache

log = logging.getLogger(__name__)
DEFAULT_TRT_VERSION = "10.0.1"


def write_backend_artifacts(config: BuildConfig, quantized: QuantizedModel, sample: Batch, stage: Path) -> dict:
    """Write the interop files and, where possible, the TensorRT engine; returns the build.json section."""
    scales = quantized.scales
    record: dict[str, Any] = {"aimet": write_aimet_encodings(scales, stage / "encodings.json").name}
    if scales.activations == "symmetric":
        version = _installed_trt_version() or DEFAULT_TRT_VERSION
        record["trt_cache"] = write_trt_cache(scales, stage / "calibration.cache", trt_version=version).name
    else:
        record["trt_cache"] = (
            "not written: activations are asymmetric (uint8, the ORT CPU choice); TensorRT takes only symmetric "
            "int8, so build with a TensorRT profile or --set quantization.activations=symmetric"
        )
    if "tensorrt" in config.deploy.targets:
        record["tensorrt"] = build_tensorrt(config, quantized, sample, stage)
    return record


def build_tensorrt(config: BuildConfig, quantized: QuantizedModel, sample: Batch, stage: Path) -> dict[str, Any]:
    """The engine and its timing against ORT CUDA, or 'not available: why' without failing the build."""
    from exporters.tensorrt.engine import ShapeProfile, build_engine, tensorrt_status

    status = tensorrt_status()
    if not status.startswith("available"):
        log.warning("tensorrt: %s; the Q/DQ model, cache and compat report are written, the engine is not", status)
        return {"status": f"tensorrt: {status}"}
    sizes = config.benchmark.batch_sizes
    profile = ShapeProfile.from_sample(sample.inputs, max_batch=max(max(sizes), sample.size))
    try:
        built = build_engine(
            quantized.path,
            stage / "model.engine",
            profile,
            fp16_fallback=config.deploy.fallback_precision == "fp16",
        )
    except DeployOptError as exc:
        log.error("tensorrt engine build failed: %s", exc)
        return {"status": f"tensorrt: build failed: {exc}"}
    record: dict[str, Any] = {"status": f"built: {built.path.name}", **built.to_json()}
    record["timing_ms"] = time_engine_vs_ort_cuda(built.path, quantized.path, sample, sizes)
    return record


def time_engine_vs_ort_cuda(engine: Path, qdq: Path, sample: Batch, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Median ms per batch size: the engine, and ORT CUDA on the same Q/DQ model where its EP exists."""
    import onnxruntime as ort

    from dopt_common.ort import create_session
    from exporters.tensorrt.engine import engine_runner, time_runner

    run = engine_runner(engine)
    cuda = None
    if "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = create_session(qdq, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    timing: dict[str, Any] = {}
    for size in sizes:
        feeds = feed_of_size(sample, size)
        row = {"tensorrt": time_runner(run, feeds)}
        if cuda is not None:
            row["ort_cuda"] = time_runner(lambda f: cuda.run(None, f), feeds)
            row["speedup_vs_ort_cuda"] = row["ort_cuda"] / row["tensorrt"]
        timing[str(size)] = row
    if cuda is None:
        timing["ort_cuda"] = "not available: the installed onnxruntime has no CUDAExecutionProvider"
    return timing


def _installed_trt_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("tensorrt")
    except Exception:
        return None
