"""The ``quantization.qat`` section: quantization-aware fine-tuning with distillation from the FP32 graph."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dopt_common.errors import ConfigError

DistillLoss = Literal["auto", "kl", "mse", "cosine"]


@dataclass(frozen=True)
class DistillConfig:
    """How the student (the fake-quantized graph) is pulled towards the teacher (the FP32 graph's own output).

    ``auto``: ``kl`` when the output is a class score (metric top1) or already a probability distribution,
    ``cosine`` for the cosine metric, else ``mse``. ``temperature`` softens both distributions for ``kl``.
    """

    loss: DistillLoss = "auto"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"quantization.qat.distill.temperature must be positive, got {self.temperature}")


@dataclass(frozen=True)
class QATConfig:
    """Quantization-aware fine-tuning of the ONNX graph, starting from the PTQ model's scales.

    ``enabled``: false, true, or auto (the default: only when PTQ with the allowed fallback misses
    ``gate.max_drop``, and the graph runs in the torch evaluator).
    ``optimizer``: ``adamw`` (fp32 state) or ``int8adamw`` (deploy_opt's block-wise 8-bit state).
    ``learn_scales``: learn the activation scales (LSQ); off, they stay those of the PTQ ``scales.json``.
    ``budget_s``: wall-clock limit of the training loop; a run over it keeps its best checkpoint so far. With
    ``enabled: auto`` (not asked for by the user) at most 90 s, and after an auto search at most what the search
    left of ``auto.budget_s`` (``pipeline/qat.py``), so a default build stays within minutes.
    ``eval_every``: steps between held-out evaluations (for ``qat.png``); null: five evaluations per run.
    """

    enabled: bool | Literal["auto"] = "auto"
    steps: int = 300
    lr: float = 1e-5
    scale_lr: float = 1e-3
    batch_size: int = 16
    optimizer: Literal["adamw", "int8adamw"] = "adamw"
    distill: DistillConfig = field(default_factory=DistillConfig)
    learn_scales: bool = True
    budget_s: float = 600.0
    eval_every: int | None = None
    validation: float = 0.125

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"quantization.qat.{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("lr", "scale_lr", "budget_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"quantization.qat.{name} must be a positive number, got {value}")
        if self.eval_every is not None and self.eval_every <= 0:
            raise ConfigError(f"quantization.qat.eval_every must be positive or null, got {self.eval_every}")
        if not 0.0 < self.validation < 0.5:
            raise ConfigError(
                f"quantization.qat.validation must be in (0, 0.5), got {self.validation}; it is the share of "
                "the training batches held out to choose the best checkpoint"
            )

    @property
    def evaluation_interval(self) -> int:
        """Steps between held-out evaluations."""
        return self.eval_every or max(1, self.steps // 5)
