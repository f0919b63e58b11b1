"""Stage: SmoothQuant on the FP32 ONNX graph, before calibration (``quantization.smoothing: smoothquant``).

Per-channel activation maxima of every MatMul/Gemm input are collected on the calibration samples, then
``calibrators.smoothquant`` moves the outliers into the weights (folded into a LayerNorm, or an inserted Mul).
The smoothed model is what gets calibrated and quantized; ``model.onnx`` stays the original.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SmoothedModel:
    """The smoothed FP32 model and how it was made (scales.json's ``provenance.smoothing``)."""

    path: Path
    alpha: float
    source_sha256: str
    smoothed_sha256: str
    targets: list[dict[str, Any]]  # one record per smoothed tensor

    def to_json(self) -> dict[str, Any]:
        """The provenance record."""
        return {
            "method": "smoothquant",
            "alpha": self.alpha,
            "source_sha256": self.source_sha256,
            "smoothed_sha256": self.smoothed_sha256,
            "targets": self.targets,
        }


def smooth_model(
    quant: QuantizationConfig,
    export: ExportConfig,
    runtime: RuntimeConfig,
    fp32_path: Path,
    calibration: CalibrationSet,
    out_path: Path,
) -> SmoothedModel:
    """Write the smoothed FP32 model to ``out_path``; returns it with its provenance."""
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
    return SmoothedModel(out_path, quant.smoothing_alpha, sha256_file(fp32_path), sha256_file(out_path), records)
