"""Gathering int8 optimizer state from torch.distributed engines into one single-process checkpoint.

The optimizers run unchanged under the engines (``ZeroRedundancyOptimizer(..., optimizer_class=Int8AdamW)`` and
FSDP2's ``fully_shard``); what needs care is moving their state between layouts without mixing scales:

- ZeRO-1 gives each rank whole parameters, so a parameter's codes and their block scales travel together.
  ``zero_state_dict`` consolidates them and adds back the quantization config that torch's consolidation drops.
- FSDP2 gives each rank a dim-0 shard of every parameter, and each shard has its own blocks: codes from two
  shards never share a scale, and concatenating them would pair codes with the wrong scales. ``fsdp_state_dict``
  dequantizes every shard with its own scales, all-gathers the fp32 moments into full tensors, and returns a
  state dict in the optimizer's fp32 form; ``load_state_dict(..., convert=True)`` re-blocks it for one process.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from deploy_opt.train.state_io import CONFIG_KEY
from dopt_common.errors import CheckpointError

log = logging.getLogger(__name__)


def zero_state_dict(zero: Any, to: int = 0) -> dict[str, Any] | None:
    """Consolidate a ZeroRedundancyOptimizer's state on rank ``to`` (a collective: call it on every rank).

    Returns the full state dict, with the inner optimizer's ``quant_config``, on rank ``to`` and None elsewhere.
    """
    import torch.distributed as dist

    zero.consolidate_state_dict(to=to)
    if dist.get_rank() != to:
        return None
    state_dict = zero.state_dict()
    inner = zero.optim.state_dict()
    if CONFIG_KEY in inner:
        state_dict[CONFIG_KEY] = inner[CONFIG_KEY]
    return state_dict


def fsdp_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full fp32 state of an optimizer over FSDP2 (DTensor) parameters (a collective: call it on every rank).

    Every moment is dequantized with its own shard's scales, then all-gathered along the parameter's placements.
    """
    from torch.distributed.tensor import DTensor

    to_fp32 = getattr(optimizer, "to_fp32_state_dict", None)
    if to_fp32 is None:
        raise CheckpointError(f"{type(optimizer).__name__} has no to_fp32_state_dict(); use an Int8* optimizer")
    local = to_fp32()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ids = [i for group in local["param_groups"] for i in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for saved_id, param in zip(ids, params, strict=True):
        param_state = local["state"].get(saved_id)
        if param_state is None:
            continue
        full = {}
        for key, value in param_state.items():
            if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.to_local().shape:
                value = DTensor.from_local(
                    value, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                ).full_tensor()
            full[key] = value
        state[saved_id] = full
    return {**local, "state": state}
