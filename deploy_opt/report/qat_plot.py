"""``qat.png``: the QAT loss curves, and the held-out metric of the fake-quantized graph every few steps."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dopt_common.deps import require
from dopt_common.files import save_png

_LINES = (
    ("ort_fp32", "ORT FP32", "#555555"),
    ("ptq", "PTQ shipped before QAT", "#c44e52"),
    ("ptq_all_int8", "PTQ, all INT8", "#dd8452"),
    ("qat", "QAT (ORT)", "#55a868"),
)


def plot_qat(run: Any, metric: str, scores: Mapping[str, float], path: Path) -> Path:
    """Two panels: training and validation loss per step; the held-out metric with FP32 and PTQ marked."""
    matplotlib = require("matplotlib", purpose="the QAT plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    if run.train_loss:
        steps, values = zip(*run.train_loss, strict=True)
        left.plot(steps, values, color="#8fa8d6", lw=0.8, label="training minibatch")
    steps, values = zip(*run.validation_loss, strict=True)
    left.plot(steps, values, "o-", color="#4c72b0", lw=1.5, ms=4, label="validation (chooses the checkpoint)")
    left.axvline(run.best_step, color="#c44e52", ls="--", lw=1, label=f"kept: step {run.best_step}")
    left.set_yscale("log")
    left.set(xlabel="step", ylabel=f"{run.loss} distillation loss", title=f"QAT loss ({run.optimizer})")
    left.legend(fontsize=7)
    if run.metric:
        steps, values = zip(*run.metric, strict=True)
        right.plot(steps, values, "o-", color="#55a868", label="fake-quantized graph (torch)")
    for key, label, color in _LINES:
        if key in scores:
            right.axhline(scores[key], color=color, ls=":" if key != "ort_fp32" else "-", lw=1, label=f"{label}")
    right.set(xlabel="step", ylabel=metric, title="held-out metric")
    right.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path, dpi=90)
