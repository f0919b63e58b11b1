"""The search space (``--space space.yaml``): the stage-1 grid and the stage-2 ranges, typed and checked.

Stage 1 runs every optimizer in ``optimizers`` at each LR decade (``base_lr * 10**d`` for ``d`` in ``lr_decades``;
``base_lr`` is the config's LR for its own optimizer type, else the type's default) for ``steps_fraction`` of the
config's steps. Stage 2 keeps the winner's optimizer and samples, with Optuna's TPE, its LR within
``lr_factor`` of the winner's, the betas (or SGD's momentum), the weight decay (log scale), the warmup ratio and,
for Sophia, rho; trials under the median (or ASHA's rungs) at a rung stop early.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from deploy_opt.config.loader import build_dataclass, read_yaml
from deploy_opt.train.config import DEFAULT_LR
from dopt_common.errors import ConfigError

OPTIMIZERS = tuple(DEFAULT_LR)


def _check_range(name: str, bounds: tuple[float, float], low: float, high: float) -> None:
    if len(bounds) != 2 or not low <= bounds[0] <= bounds[1] <= high:
        raise ConfigError(f"space {name} must be [low, high] with {low} <= low <= high <= {high}, got {list(bounds)}")


@dataclass(frozen=True)
class GridStage:
    """Stage 1: optimizer type x LR decade, short runs."""

    optimizers: tuple[str, ...] = ("adamw", "sgd", "sophia")
    lr_decades: tuple[int, ...] = (-1, 0, 1)
    steps_fraction: float = 0.25

    def __post_init__(self) -> None:
        unknown = [o for o in self.optimizers if o not in OPTIMIZERS]
        if not self.optimizers or unknown:
            raise ConfigError(f"space stage1.optimizers {list(self.optimizers)}: use some of {', '.join(OPTIMIZERS)}")
        if not self.lr_decades or len(set(self.lr_decades)) != len(self.lr_decades):
            raise ConfigError(f"space stage1.lr_decades must be distinct integers, got {list(self.lr_decades)}")
        if not 0.0 < self.steps_fraction <= 1.0:
            raise ConfigError(f"space stage1.steps_fraction must be in (0, 1], got {self.steps_fraction}")

    @property
    def cells(self) -> list[tuple[str, int]]:
        """The grid, optimizer-major: (type, decade)."""
        return [(o, d) for o in self.optimizers for d in self.lr_decades]


@dataclass(frozen=True)
class TpeStage:
    """Stage 2: TPE around the winner, full-length runs, pruned at rungs."""

    lr_factor: float = 3.0
    beta1: tuple[float, float] = (0.8, 0.98)
    beta2: tuple[float, float] = (0.95, 0.9999)
    momentum: tuple[float, float] = (0.8, 0.98)
    weight_decay: tuple[float, float] = (1e-5, 0.1)
    warmup_ratio: tuple[float, float] = (0.0, 0.2)
    rho: tuple[float, float] = (0.01, 0.1)
    pruner: Literal["median", "asha", "none"] = "median"
    rungs: int = 4  # evaluation points per trial where the pruner may stop it (segments of equal length)
    startup_trials: int = 2  # the median pruner's: trials that always finish before it prunes

    def __post_init__(self) -> None:
        if not self.lr_factor >= 1.0:
            raise ConfigError(f"space stage2.lr_factor must be >= 1, got {self.lr_factor}")
        for name in ("beta1", "beta2", "momentum"):
            _check_range(f"stage2.{name}", getattr(self, name), 0.0, 0.99999)
        _check_range("stage2.weight_decay", self.weight_decay, 1e-12, 10.0)
        _check_range("stage2.warmup_ratio", self.warmup_ratio, 0.0, 0.5)
        _check_range("stage2.rho", self.rho, 1e-6, 10.0)
        if not 1 <= self.rungs <= 20 or self.startup_trials < 0:
            raise ConfigError(
                f"space stage2.rungs must be in 1..20 and startup_trials >= 0, got {self.rungs}, {self.startup_trials}"
            )


@dataclass(frozen=True)
class SearchSpace:
    """Both stages and the sampler's seed."""

    stage1: GridStage = field(default_factory=GridStage)
    stage2: TpeStage = field(default_factory=TpeStage)
    seed: int = 0

    def to_dict(self) -> dict:
        """Plain data for search.json."""
        return dataclasses.asdict(self)


def load_space(path: str | Path | None) -> SearchSpace:
    """The space from YAML (unknown keys name the allowed ones), or the default space."""
    if path is None:
        return SearchSpace()
    return build_dataclass(SearchSpace, read_yaml(Path(path), "search space"), "space")
