"""Stage: SmoothQuant on the FP32 ONNX graph, before calibration (``quantization.smoothing: smoothquant``).

Per-channel activation maxima of every MatMul/Gemm input are collected on the calibration samples, then
``calibrators.smoothquant`` moves the outliers into the weights (folded into a LayerNorm, or an inserted Mul).
The smoothed model is what gets calibrated and quantized; ``model.onnx`` stays the original.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import onnx

from calibrators.activations.channels import ChannelAbsMaxObserver
from calibrators.activations.collect import collect
from calibrators.smoothquant import apply_smoothquant, smoothing_targets
from deploy_opt.config.build import ExportConfig, QuantizationConfig, RuntimeConfig
from deploy_opt.stages.calibration_set import CalibrationSet
from dopt_common.files import sha256_file
from exporters.onnx.io import save_onnx

log = logging.getLogger(__name__)


def smooth_model(
    quant: QuantizationConfig,
    export: ExportConfig,
    runtime: RuntimeConfig,
    fp32_path: Path,
    calibration: CalibrationSet,
    out_path: Path,
) -> tuple[Path, dict[str, Any]]:
    """Write the smoothed FP32 model to ``out_path``; returns it and the provenance record."""
    model = onnx.load(str(fp32_path))
    targets = smoothing_targets(model)
    observer = ChannelAbsMaxObserver()
    collect(
        fp32_path,
        (b.inputs for b in calibration.batches),
        [t.tensor for t in targets],
        observer,
        threads=runtime.threads,
    )
    smoothed, records = apply_smoothquant(model, observer.absmax(), quant.smoothing_alpha)
    save_onnx(smoothed, out_path, external_data_mb=export.external_data_mb)
    log.info("smoothquant: %d tensors smoothed (alpha %.2f)", len(records), quant.smoothing_alpha)
    return out_path, {
        "method": "smoothquant",
        "alpha": quant.smoothing_alpha,
        "source_sha256": sha256_file(fp32_path),
        "smoothed_sha256": sha256_file(out_path),
        "targets": records,
    }
