"""The training config: YAML → frozen dataclasses, checked on load (unknown keys name the allowed ones).

Precedence, lowest first: dataclass defaults, the config file, ``--set`` style overrides.

Data contract (``data: "module:function"``): the function is called as ``fn(batch_size=..., seed=...)`` and
returns a :class:`deploy_opt.train.data.TrainData` (training batches per epoch, evaluation batches, the loss and
an optional metric). See that module for the details.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deploy_opt.config.loader import base_dir_field, build_dataclass, merge, parse_override, read_yaml, section_field
from deploy_opt.train.schedules import ScheduleConfig
from dopt_common.errors import ConfigError

OptimizerType = Literal["adamw", "lion", "sgd", "sophia"]
# The per-type default learning rates of the agreed optimizer API (Lion runs at ~1/10 of AdamW's LR; Sophia's
# clipped update is at most lr per element, like Lion's sign update).
DEFAULT_LR = {"adamw": 1e-3, "lion": 1e-4, "sgd": 1e-2, "sophia": 1e-4}
DEFAULT_BETAS = {"adamw": (0.9, 0.999), "lion": (0.9, 0.99), "sophia": (0.965, 0.99)}


@dataclass(frozen=True)
class OptimizerConfig:
    """Which int8-state optimizer, its hyper-parameters and its state quantization."""

    type: OptimizerType = "adamw"
    lr: float | None = None  # None: the type's default (adamw 1e-3, lion 1e-4, sgd 1e-2, sophia 1e-4)
    betas: tuple[float, ...] | None = None  # adamw, lion and sophia; None: the type's default
    eps: float = 1e-8  # adamw only
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    weight_decay: float = 0.01  # decoupled; never applied to the no_decay parameters
    no_decay: tuple[str, ...] | None = None  # name patterns without weight decay; None: bias and norm weights
    state: Literal["int8", "fp32"] = "int8"
    block_size: int = 2048
    min_numel: int = 4096  # smaller tensors keep fp32 state
    fp32_patterns: tuple[str, ...] = ("embed", "lm_head")  # parameters named like these keep fp32 state
    fp32_warmup_steps: int = 0
    rho: float = 0.04  # sophia only: the clipping scale γ of clip(m / max(γ h, ε), 1)
    update_period: int = 10  # sophia only: steps between Hessian estimates (k)
    # sophia only: gnb (Gauss-Newton-Bartlett, needs the data's logits), hutchinson, or auto (gnb when it can)
    estimator: Literal["auto", "gnb", "hutchinson"] = "auto"

    def __post_init__(self) -> None:
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"optimizer.lr must be positive, got {self.lr}")
        if self.betas is not None:
            if self.type == "sgd":
                raise ConfigError("optimizer.betas applies to adamw, lion and sophia; for sgd set optimizer.momentum")
            if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
                raise ConfigError(f"optimizer.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"optimizer.momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0 or self.eps <= 0:
            raise ConfigError(
                f"optimizer.weight_decay must be >= 0 and optimizer.eps > 0, got {self.weight_decay}, {self.eps}"
            )
        if not self.rho > 0 or self.update_period < 1:
            raise ConfigError(
                f"optimizer.rho must be > 0 and optimizer.update_period >= 1, got {self.rho}, {self.update_period}"
            )
        if not 64 <= self.block_size <= 8192:
            raise ConfigError(f"optimizer.block_size must be in 64..8192, got {self.block_size}")
        if self.min_numel < 0 or self.fp32_warmup_steps < 0:
            raise ConfigError(
                f"optimizer.min_numel and optimizer.fp32_warmup_steps must be >= 0, got {self.min_numel}, "
                f"{self.fp32_warmup_steps}"
            )

    @property
    def resolved_lr(self) -> float:
        """The learning rate: the configured one or the type's default."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.type]

    @property
    def resolved_betas(self) -> tuple[float, float]:
        """The betas: the configured ones or the type's default (adamw, lion and sophia only)."""
        betas = self.betas if self.betas is not None else DEFAULT_BETAS[self.type]
        return (float(betas[0]), float(betas[1]))


@dataclass(frozen=True)
class TrainConfig:
    """One training run: model, data, optimizer, schedule, length, safety nets and outputs."""

    model: str  # "package.module:function" returning a torch.nn.Module
    data: str  # "package.module:function" called as fn(batch_size=..., seed=...) returning a TrainData
    optimizer: OptimizerConfig = section_field(OptimizerConfig)
    # type (warmup_cosine | warmup_linear | step | constant), warmup_ratio, min_lr_ratio, step_size, milestones,
    # gamma, max_drop: see deploy_opt.train.schedules
    scheduler: ScheduleConfig = section_field(ScheduleConfig)
    steps: int | None = None  # set exactly one of steps and epochs
    epochs: int | None = None
    batch_size: int = 32
    clip_norm: float | None = 1.0  # max global grad norm; null: no clipping (the norm is still logged)
    # Skip a step whose grad norm exceeds anomaly_factor x the median of the last anomaly_window accepted norms,
    # once anomaly_min_history norms were seen; null: never skip (non-finite norms are always skipped).
    anomaly_factor: float | None = 10.0
    anomaly_window: int = 50
    anomaly_min_history: int = 10
    log_every: int = 10  # steps between human-readable log lines (train_log.jsonl gets every step)
    checkpoint_every: int | None = None  # steps between checkpoints; null: only at the end
    seed: int = 0
    threads: int | None = None  # torch intra-op threads; null: torch's default
    output_dir: str = "train_output"  # relative paths are resolved against the config file's folder
    description: str = ""
    # Log the recommender's advice (and its reasons) for this model type at the start of the run; null: don't.
    model_type: Literal["cnn", "mlp", "transformer", "llm"] | None = None
    memory_gb: float | None = None  # the memory budget the recommender judges by; null: this machine's RAM
    base_dir: str = base_dir_field()

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ConfigError("set exactly one of 'steps' (optimizer steps) or 'epochs' (passes over the data)")
        for key in ("steps", "epochs", "batch_size", "log_every", "checkpoint_every", "threads", "anomaly_window"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ConfigError(f"clip_norm must be positive or null (no clipping), got {self.clip_norm}")
        if self.anomaly_factor is not None and not self.anomaly_factor > 1.0:
            raise ConfigError(f"anomaly_factor must be > 1 or null (never skip), got {self.anomaly_factor}")
        if not 1 <= self.anomaly_min_history <= self.anomaly_window:
            raise ConfigError(
                f"anomaly_min_history must be in 1..anomaly_window ({self.anomaly_window}), "
                f"got {self.anomaly_min_history}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data (for the checkpoint and the log)."""
        return dataclasses.asdict(self)

    def resolve_output_dir(self) -> Path:
        """``output_dir``, relative to the config file's folder when it is not absolute."""
        path = Path(self.output_dir)
        return path if path.is_absolute() else Path(self.base_dir) / path


def build_train_config(data: dict[str, Any], base_dir: str | Path = ".") -> TrainConfig:
    """Build a TrainConfig from a mapping (as read from YAML); raises ConfigError naming the bad key."""
    config = build_dataclass(TrainConfig, data, "")
    return dataclasses.replace(config, base_dir=str(base_dir))


def load_train_config(path: str | Path, overrides: list[str] | dict[str, Any] | None = None) -> TrainConfig:
    """Read a training YAML and apply overrides (``section.key=value`` strings or a nested mapping)."""
    path = Path(path)
    data = read_yaml(path, "training config")
    if isinstance(overrides, dict):
        data = merge(data, overrides)
    else:
        for text in overrides or []:
            data = merge(data, parse_override(text))
    return build_train_config(data, base_dir=path.resolve().parent)
