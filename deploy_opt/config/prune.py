"""The ``prune`` section: structured pruning of a torch model, then distillation from the unpruned model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dopt_common.errors import ConfigError

PruneTarget = Literal["ffn", "heads", "channels"]


@dataclass(frozen=True)
class PruneDistillConfig:
    """Distillation of the pruned student from the unpruned FP32 teacher (outputs, optionally hidden states).

    ``loss``: ``auto`` is ``kl`` for class scores, ``cosine`` for the cosine metric, else ``mse``.
    ``hidden``: also pull each block's output towards the teacher's, through a learned projection where the
    widths differ (weight ``hidden_weight``). ``lr: auto`` is 1e-4 for a model with LayerNorm (a transformer) and
    1e-3 otherwise (a CNN). ``steps: 0`` skips distillation (the pruned model ships as is).
    The best checkpoint on the held-out ``validation`` share of the training minibatches wins.
    """

    steps: int = 300
    lr: float | Literal["auto"] = "auto"
    loss: Literal["auto", "kl", "mse", "cosine"] = "auto"
    temperature: float = 1.0
    hidden: bool = False
    hidden_weight: float = 1.0
    batch_size: int = 16
    optimizer: Literal["adamw", "int8adamw"] = "adamw"
    budget_s: float = 900.0
    eval_every: int | None = None
    validation: float = 0.125

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size <= 0:
            raise ConfigError(
                f"prune.distill: steps must be >= 0 and batch_size positive, got {self.steps} and {self.batch_size}"
            )
        for name in ("temperature", "budget_s") if self.lr == "auto" else ("lr", "temperature", "budget_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"prune.distill.{name} must be a positive number, got {value}")
        if not (math.isfinite(self.hidden_weight) and self.hidden_weight >= 0):
            raise ConfigError(f"prune.distill.hidden_weight must be >= 0, got {self.hidden_weight}")
        if self.eval_every is not None and self.eval_every <= 0:
            raise ConfigError(f"prune.distill.eval_every must be positive or null, got {self.eval_every}")
        if not 0.0 < self.validation < 0.5:
            raise ConfigError(f"prune.distill.validation must be in (0, 0.5), got {self.validation}")

    @property
    def evaluation_interval(self) -> int:
        """Steps between held-out evaluations."""
        return self.eval_every or max(1, self.steps // 5)


@dataclass(frozen=True)
class PruneConfig:
    """Structured pruning of a ``model.factory`` torch model before export (off while both ratios are 0).

    ``ratio``: the share of FFN neurons and conv channels removed; ``head_ratio``: the share of attention heads
    (null: ``ratio``). ``method``: the importance score, ``taylor`` (weight times RMS gradient over the
    calibration data: the labels' loss where there are class labels, else random projections of the output) or
    ``magnitude`` (L2 norm). ``per_layer: auto`` ranks the structures of all layers together, so layers whose
    structures matter more lose less (at most ``max_layer_ratio`` of any layer); ``uniform`` cuts every layer by
    the same share. Residual widths (a transformer's hidden size) are never pruned. ``round_to``: widths stay
    multiples of it (ORT's CPU convolutions fall off their blocked fast path below multiples of 8).
    """

    ratio: float = 0.0
    head_ratio: float | None = None
    method: Literal["magnitude", "taylor"] = "taylor"
    targets: tuple[PruneTarget, ...] = ("ffn", "heads", "channels")
    per_layer: Literal["auto", "uniform"] = "auto"
    max_layer_ratio: float = 0.8
    round_to: int | None = 8
    distill: PruneDistillConfig = field(default_factory=PruneDistillConfig)

    def __post_init__(self) -> None:
        for name in ("ratio", "head_ratio"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.0 <= value < 1.0):
                raise ConfigError(f"prune.{name} must be in [0, 1), got {value}; it is the share removed")
        if not (math.isfinite(self.max_layer_ratio) and 0.0 < self.max_layer_ratio < 1.0):
            raise ConfigError(f"prune.max_layer_ratio must be in (0, 1), got {self.max_layer_ratio}")
        if not self.targets:
            raise ConfigError("prune.targets is empty; name at least one of ffn, heads, channels")
        if self.round_to is not None and self.round_to <= 0:
            raise ConfigError(f"prune.round_to must be positive or null, got {self.round_to}")

    @property
    def heads(self) -> float:
        """The share of attention heads removed."""
        return self.ratio if self.head_ratio is None else self.head_ratio

    @property
    def enabled(self) -> bool:
        """Whether anything is pruned."""
        return self.ratio > 0 or self.heads > 0
