"""The training companion: int8 block-wise optimizers, schedules, memory estimates and the training loop.

``from deploy_opt.train import Int8AdamW, Int8Lion, Int8SGD, Int8Sophia``, the short path users of
``bnb.optim.AdamW8bit`` and ``torchao.optim.AdamW8bit`` expect. Loaded lazily: importing this package does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Int8AdamW": "deploy_opt.train.optimizers",
    "Int8Lion": "deploy_opt.train.optimizers",
    "Int8SGD": "deploy_opt.train.optimizers",
    "Int8Sophia": "deploy_opt.train.sophia",
    "Sophia": "deploy_opt.train.sophia",
    "train": "deploy_opt.train.loop",
    "load_train_config": "deploy_opt.train.config",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'deploy_opt.train' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(__all__)
