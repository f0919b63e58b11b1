"""A scales file for any MatMul/Gemm model, with seeded random activation ranges: a stand-in for calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from calibrators.activations.collect import select_tensors
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile

OPS = ["MatMul", "Gemm"]


def scales_for_model(model_path: Path, scheme: str, seed: int, meta: dict[str, Any]) -> ScaleFile:
    """Each MatMul/Gemm input gets a minmax range drawn from ``seed`` (ends 0.5 to 3 either side of zero); weights
    and biases get the scales calibration would give them; ``meta`` is the file's metadata."""
    model = onnx.load(str(model_path))
    rng = np.random.default_rng(seed)
    tensors = {
        n: activation_scale(n, -float(rng.uniform(0.5, 3)), float(rng.uniform(0.5, 3)), scheme, "minmax")
        for n in select_tensors(model, OPS)
    }
    tensors |= weight_scales(model, OPS)
    tensors |= bias_scales(model, tensors, OPS)
    return ScaleFile(scheme, tensors, meta)
