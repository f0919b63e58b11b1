"""The training companion: int8 block-wise optimizers, schedules, memory estimates and the training loop.

``from deploy_opt.train import Int8AdamW, Int8Lion, Int8SGD, Int8Sophia``, the short path users of
``bnb.optim.AdamW8bit`` and ``torchao.optim.AdamW8bit`` expect. Loaded lazily: importing this package does not
import torch.
"""

from __future__ import annotations

from dopt_common.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports("deploy_opt.train", _PUBLIC, __all__)
