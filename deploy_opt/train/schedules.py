"""Learning-rate schedules as multipliers of the peak LR: warmup + cosine, warmup + linear, step, constant.

Every schedule is a pure function of the global step, so ``torch.optim.lr_scheduler.LambdaLR`` can drive it and a
resumed run continues at the same LR: the scheduler's ``state_dict`` holds ``last_epoch`` (the global step).

Conventions, shared by all kinds:
- ``warmup_steps = ceil(warmup_ratio * total_steps)``. Warmup is linear and starts at ``1 / warmup_steps``, not at
  0, so the first optimizer step is not wasted; it reaches 1.0 at step ``warmup_steps - 1``.
- Decay runs from step ``warmup_steps`` to ``total_steps`` and ends on the floor ``min_lr_ratio`` (never 0: a
  floor keeps late steps useful, as in Chinchilla and LLaMA, which decay to 10% of the peak). After
  ``total_steps`` the multiplier stays at the floor.
- ``step``: the multiplier is ``gamma ** k`` after the k-th milestone (every ``step_size`` steps, or the listed
  ``milestones``), never below the floor. One decay may not drop the LR by more than ``max_drop`` (a fraction):
  a ``gamma < 1 - max_drop`` is a ConfigError rather than a silent clamp, so the config says what actually runs.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from dopt_common.errors import ConfigError

if TYPE_CHECKING:
    import torch

KINDS = ("warmup_cosine", "warmup_linear", "step", "constant")
ALIASES = {"cosine": "warmup_cosine", "linear": "warmup_linear", "step_decay": "step"}


@dataclass(frozen=True)
class ScheduleConfig:
    """One schedule, checked on creation. ``type`` also accepts the aliases cosine, linear and step_decay."""

    type: str = "warmup_cosine"
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    step_size: int | None = None
    milestones: tuple[int, ...] = ()
    gamma: float = 0.5
    max_drop: float = 0.5

    def __post_init__(self) -> None:
        kind = ALIASES.get(str(self.type).lower(), str(self.type).lower())
        if kind not in KINDS:
            raise ConfigError(f"scheduler type '{self.type}' is not one of {', '.join(KINDS)}; pick one of them")
        object.__setattr__(self, "type", kind)
        _check_fraction("warmup_ratio", self.warmup_ratio, low=0.0, high=1.0, high_open=True)
        _check_fraction("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0, low_open=True)
        _check_fraction("max_drop", self.max_drop, low=0.0, high=1.0, low_open=True, high_open=True)
        _check_fraction("gamma", self.gamma, low=0.0, high=1.0, low_open=True)
        object.__setattr__(self, "milestones", tuple(self.milestones))
        if kind == "step":
            self._check_step()

    def _check_step(self) -> None:
        if (self.step_size is None) == (not self.milestones):
            raise ConfigError(
                "a 'step' schedule needs exactly one of step_size (decay every N steps) or "
                "milestones (decay at these steps); set one and remove the other"
            )
        if self.step_size is not None and (_not_int(self.step_size) or self.step_size < 1):
            raise ConfigError(f"step_size {self.step_size!r} must be a whole number >= 1")
        if self.milestones:
            if any(_not_int(m) or m < 1 for m in self.milestones):
                raise ConfigError(f"milestones {list(self.milestones)} must be whole numbers >= 1")
            if any(b <= a for a, b in zip(self.milestones, self.milestones[1:], strict=False)):
                # Two decays at one step would drop the LR by gamma**2 at once, past the max_drop cap.
                raise ConfigError(f"milestones {list(self.milestones)} must be strictly increasing")
        if self.gamma < 1 - self.max_drop:
            raise ConfigError(
                f"gamma {self.gamma} drops the LR by {1 - self.gamma:.0%} in one step, more than max_drop "
                f"{self.max_drop:.0%}; use gamma >= {1 - self.max_drop:g} (more, smaller steps) or raise max_drop"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "scheduler") -> ScheduleConfig:
        """Build from a YAML section; unknown keys are a ConfigError naming them and the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        values = dict(data)
        if "milestones" in values:
            values["milestones"] = tuple(values["milestones"] or ())
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """Plain data for checkpoints and logs."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


def warmup_steps_for(total_steps: int, warmup_ratio: float) -> int:
    """The number of warmup steps: ``ceil(warmup_ratio * total_steps)``."""
    return math.ceil(warmup_ratio * total_steps - 1e-9)


def warmup_cosine(step: int, total_steps: int, warmup_ratio: float = 0.03, min_lr_ratio: float = 0.1) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``total_steps``; the floor after that."""
    return _warmup_then(step, total_steps, warmup_ratio, min_lr_ratio, _cosine)


def warmup_linear(step: int, total_steps: int, warmup_ratio: float = 0.03, min_lr_ratio: float = 0.1) -> float:
    """Linear warmup to 1, then linear decay to ``min_lr_ratio`` at ``total_steps``; the floor after that."""
    return _warmup_then(step, total_steps, warmup_ratio, min_lr_ratio, lambda progress: 1.0 - progress)


def constant(step: int, total_steps: int, warmup_ratio: float = 0.0) -> float:
    """Linear warmup to 1, then 1."""
    _check_steps(step, total_steps)
    warmup = warmup_steps_for(total_steps, warmup_ratio)
    return (step + 1) / warmup if step < warmup else 1.0


def step_decay(
    step: int,
    total_steps: int,
    step_size: int | None = None,
    milestones: Sequence[int] = (),
    gamma: float = 0.5,
    max_drop: float = 0.5,
    warmup_ratio: float = 0.0,
    min_lr_ratio: float = 0.1,
) -> float:
    """``gamma ** k`` after k decays (every ``step_size`` steps or at ``milestones``), floored at ``min_lr_ratio``."""
    config = ScheduleConfig("step", warmup_ratio, min_lr_ratio, step_size, tuple(milestones), gamma, max_drop)
    return _step_factor(step, total_steps, config)


def schedule_factor(kind: str | ScheduleConfig, step: int, total_steps: int, **params: Any) -> float:
    """The LR multiplier of schedule ``kind`` at ``step`` (stateless; ``params`` are ScheduleConfig fields)."""
    config = kind if isinstance(kind, ScheduleConfig) else ScheduleConfig(type=kind, **params)
    if isinstance(kind, ScheduleConfig) and params:
        raise ConfigError(f"schedule_factor got a ScheduleConfig and extra settings {sorted(params)}; pass one")
    if config.type == "warmup_cosine":
        return warmup_cosine(step, total_steps, config.warmup_ratio, config.min_lr_ratio)
    if config.type == "warmup_linear":
        return warmup_linear(step, total_steps, config.warmup_ratio, config.min_lr_ratio)
    if config.type == "constant":
        return constant(step, total_steps, config.warmup_ratio)
    return _step_factor(step, total_steps, config)


def lr_lambda(config: ScheduleConfig, total_steps: int) -> Callable[[int], float]:
    """``lr_at(step)``: the multiplier function for ``LambdaLR`` (a partial, so it pickles)."""
    _check_steps(0, total_steps)
    return functools.partial(schedule_factor, config, total_steps=total_steps)


def build_scheduler(
    optimizer: torch.optim.Optimizer, kind: str | ScheduleConfig, total_steps: int, **kwargs: Any
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over every param group; call ``.step()`` once per optimizer step.

    To resume, build the optimizer and scheduler as before, then ``load_state_dict`` both: the scheduler's state
    carries ``last_epoch`` (the global step) and the optimizer's groups carry ``lr`` and ``initial_lr``.
    """
    from torch.optim.lr_scheduler import LambdaLR

    config = kind if isinstance(kind, ScheduleConfig) else ScheduleConfig(type=kind, **kwargs)
    if isinstance(kind, ScheduleConfig) and kwargs:
        raise ConfigError(f"build_scheduler got a ScheduleConfig and extra settings {sorted(kwargs)}; pass one")
    return LambdaLR(optimizer, lr_lambda(config, total_steps))


def _warmup_then(
    step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float, shape: Callable[[float], float]
) -> float:
    _check_steps(step, total_steps)
    _check_fraction("warmup_ratio", warmup_ratio, low=0.0, high=1.0, high_open=True)
    _check_fraction("min_lr_ratio", min_lr_ratio, low=0.0, high=1.0, low_open=True)
    warmup = warmup_steps_for(total_steps, warmup_ratio)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape(progress)


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _step_factor(step: int, total_steps: int, config: ScheduleConfig) -> float:
    _check_steps(step, total_steps)
    warmup = warmup_steps_for(total_steps, config.warmup_ratio)
    if step < warmup:
        return (step + 1) / warmup
    if config.step_size is not None:
        decays = step // config.step_size
    else:
        decays = bisect.bisect_right(config.milestones, step)
    return max(config.min_lr_ratio, config.gamma**decays)


def _check_steps(step: int, total_steps: int) -> None:
    if _not_int(total_steps) or total_steps < 1:
        raise ConfigError(f"total_steps {total_steps!r} must be a whole number >= 1 (the optimizer steps of the run)")
    if _not_int(step) or step < 0:
        raise ConfigError(f"step {step!r} must be a whole number >= 0")


def _check_fraction(
    name: str, value: object, *, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}" + (")" if high_open else "]")
        raise ConfigError(f"{name} {value!r} must be a number in {lo}, {hi}")


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
