"""The optimizer that keeps its state in block-wise 8-bit codes: parameter groups with names, the per-parameter
step (dequantize the moments, update, requantize; or one fused compiled kernel), state placement and checkpoints.
``deploy_opt.train.optimizers`` (AdamW, Lion, SGD) and ``deploy_opt.train.sophia`` subclass it with their update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import torch

from deploy_opt.train.blockwise import (
    DEFAULT_SECOND_MOMENT_CODE,
    block_count,
    block_parts,
    scale_parts,
)
from deploy_opt.train.state_io import (
    CONFIG_KEY,
    MOMENTS,
    StateConfig,
    check_checkpoint,
    config_of_checkpoint,
    convert_param_state,
    local_tensor,
    moment_code,
    read_moment,
    write_moment,
)
from dopt_common.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)
# compiled=None compiles the fused kernel for int8-state tensors of at least this many elements (32 blocks of 2048).
AUTO_COMPILE_NUMEL = 65536


def _named_groups(params: Any) -> Any:
    """Turn groups carrying ``"names"`` into ``(name, tensor)`` pairs, which torch stores as ``param_names``."""
    if isinstance(params, torch.Tensor):
        return [params]
    params = list(params)
    if not params or not isinstance(params[0], dict):
        return params
    groups = []
    for group in params:
        group = dict(group)
        names = group.pop("names", None)
        if names is not None:
            tensors = group["params"]
            tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            if len(names) != len(tensors):
                raise ConfigError(f"a param group has {len(tensors)} params but {len(names)} names; give one each")
            group["params"] = [t if isinstance(t, tuple) else (n, t) for n, t in zip(names, tensors, strict=True)]
        groups.append(group)
    return groups


def check_range(name: str, value: float, low: float, high: float = math.inf, high_open: bool = False) -> None:
    if not (low <= value < high if high_open else low <= value <= high):
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ConfigError(f"{name} = {value!r} is outside {bound}")


class BlockwiseOptimizer(torch.optim.Optimizer):
    """What the three int8-state optimizers share: fallback rules, per-parameter step, checkpoints."""

    def __init__(
        self, params: Any, defaults: dict[str, Any], config: StateConfig, compiled: bool | None = None
    ) -> None:
        self.config = config
        if compiled is not None and not isinstance(compiled, bool):
            raise ConfigError(f"compiled must be True, False or None (auto), got {compiled!r}")
        self.compiled = compiled
        # The fused kernels pay only compiled (eagerly their temporaries cost more than the per-op path saves);
        # None follows `compiles()`, True/False force them on/off (tests and benchmarks compare the two).
        self.use_kernels: bool | None = None
        super().__init__(_named_groups(params), defaults)

    # --- the update, per parameter ---------------------------------------------------------------------
    def _update(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        moments: dict[str, torch.Tensor],
        group: dict[str, Any],
        step: int,
    ) -> None:
        raise NotImplementedError

    def _run_kernel(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        group: dict[str, Any],
        step: int,
        compile_: bool,
    ) -> None:
        raise NotImplementedError

    def compiles(self, numel: int) -> bool:
        """Whether an int8-state parameter of ``numel`` elements takes the compiled kernel.

        ``compiled=None`` (the default) compiles for tensors of at least ``AUTO_COMPILE_NUMEL`` elements: there the
        fused kernel is 2-8x faster than the per-op path, and below it compiling costs more than it saves.
        """
        return self.compiled if self.compiled is not None else numel >= AUTO_COMPILE_NUMEL

    def _moments(self, group: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return MOMENTS[self.config.optimizer]

    def _blocks(self, state: dict[str, Any], kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A moment's codes ([blocks, block_size] views, from ``block_parts``) and scales, for a kernel call."""
        return state[kind + "_codes"], state[kind + "_scales"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One optimization step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param, name in zip(group["params"], self._names(group), strict=True):
                if param.grad is not None:
                    self._step_param(param, name, group)
        return loss

    def _names(self, group: dict[str, Any]) -> list[str | None]:
        names = group.get("param_names")
        if names is None or len(names) != len(group["params"]):
            # ZeroRedundancyOptimizer hands each rank a slice of the params with the full name list.
            return [None] * len(group["params"])
        return list(names)

    def _step_param(self, param: torch.Tensor, name: str | None, group: dict[str, Any]) -> None:
        local, grad = local_tensor(param), local_tensor(param.grad)
        if grad.is_sparse:
            raise ConfigError(f"{type(self).__name__} does not support sparse gradients (param {name or '?'})")
        state = self.state[param]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32)
        state["step"] += 1
        step = int(state["step"].item())
        cfg = self.config
        as_int8 = cfg.quantizes(name, local.numel(), step)
        if as_int8 and self._fits_kernel(state, local, grad, group):
            compile_ = self.compiles(local.numel())
            work = local if local.dtype == torch.float32 else local.float()
            # One kernel call for the whole blocks, one for a shorter tail block.
            numel, size = local.numel(), cfg.block_size
            pieces = {
                key: block_parts(value, size) if key.endswith("_codes") else scale_parts(value, numel, size)
                for key, value in state.items()
                if key.endswith(("_codes", "_scales"))
            }
            # detach(): both views exist before the first call writes the parameter, which autograd forbids for
            # views of a tensor that requires grad (the writes still land in the parameter's storage).
            parts = zip(
                block_parts(work.detach().view(-1), size), block_parts(grad.float().view(-1), size), strict=True
            )
            for index, (part, part_grad) in enumerate(parts):
                self._run_kernel(
                    part, part_grad, {key: value[index] for key, value in pieces.items()}, group, step, compile_
                )
            if work is not local:
                local.copy_(work)
            return
        moments = {}
        for kind, kind_code in self._moments(group):
            value = read_moment(state, kind, moment_code(kind_code, cfg), cfg.block_size, local.shape)
            moments[kind] = value if value is not None else torch.zeros_like(local, dtype=torch.float32)
        work = local if local.dtype == torch.float32 else local.float()
        self._update(work, grad.float(), moments, group, step)
        if work is not local:
            local.copy_(work)
        for kind, kind_code in self._moments(group):
            write_moment(state, kind, moment_code(kind_code, cfg), moments[kind], cfg.block_size, as_int8)

    def _fits_kernel(
        self, state: dict[str, Any], local: torch.Tensor, grad: torch.Tensor, group: dict[str, Any]
    ) -> bool:
        """Whether the fused kernel can run: contiguous, state int8 already (or still empty)."""
        moments = self._moments(group)
        use_kernels = self.compiles(local.numel()) if self.use_kernels is None else self.use_kernels
        if not (use_kernels and moments and local.is_contiguous() and grad.is_contiguous()):
            return False
        if all(kind + "_codes" in state for kind, _ in moments):
            return True
        if any(kind in state or kind + "_codes" in state for kind, _ in moments):
            return False  # fp32 state after warmup: the unfused path quantizes it
        for kind, kind_code in moments:  # zero state; zero scales (only here) make even a "half step" read 0
            codes = torch.zeros(
                local.numel(), dtype=torch.int8 if kind_code == "signed" else torch.uint8, device=local.device
            )
            state[kind + "_codes"] = codes
            state[kind + "_scales"] = torch.zeros(
                block_count(local.numel(), self.config.block_size), device=local.device
            )
        return True

    # --- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus ``quant_config``: the optimizer type and its quantization config."""
        state_dict = super().state_dict()
        state_dict[CONFIG_KEY] = self.config.to_dict()
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any], convert: bool = False) -> None:
        """Load a checkpoint after checking its config; ``convert=True`` converts fp32 <-> int8 or re-blocks.

        A checkpoint from another config (including a plain ``torch.optim`` one) raises ``CheckpointError``
        naming each difference, unless ``convert`` is set.
        """
        saved = config_of_checkpoint(state_dict)
        must_convert = check_checkpoint(saved, self.config, convert)
        params = [p for group in self.param_groups for p in group["params"]]
        names = [n for group in self.param_groups for n in self._names(group)]
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        if len(saved_ids) != len(params):
            raise CheckpointError(
                f"optimizer checkpoint has {len(saved_ids)} parameters, this optimizer {len(params)}; "
                "build the optimizer over the same parameters"
            )
        state = {}
        for saved_id, param, name in zip(saved_ids, params, names, strict=True):
            param_state = state_dict["state"].get(saved_id)
            if param_state is None:
                continue
            if must_convert:
                local = local_tensor(param)
                step = int(float(param_state.get("step", 0)))
                as_int8 = self.config.quantizes(name, local.numel(), step)
                param_state = convert_param_state(param_state, saved, self.config, local.shape, as_int8, local.device)
            state[saved_id] = param_state
        plain = {k: v for k, v in state_dict.items() if k != CONFIG_KEY}
        super().load_state_dict({**plain, "state": state})
        # torch casts floating state to the param's dtype; scales and fp32 moments must stay fp32.
        for saved_id, param in zip(saved_ids, params, strict=True):
            if saved_id in state:
                device = local_tensor(param).device
                self.state[param] = {key: _placed(value, key, device) for key, value in state[saved_id].items()}
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def to_fp32_state_dict(self) -> dict[str, Any]:
        """A state dict with every moment as a plain fp32 tensor shaped like its param (loadable by torch.optim)."""
        state_dict = self.state_dict()
        fp32_config = StateConfig(**{**self.config.__dict__, "state": "fp32"})
        params = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        state = {}
        for saved_id, param in zip(saved_ids, params, strict=True):
            if saved_id in state_dict["state"]:
                local = local_tensor(param)
                state[saved_id] = convert_param_state(
                    state_dict["state"][saved_id], self.config, fp32_config, local.shape, False, local.device
                )
        groups = [{**_TORCH_GROUP_KEYS.get(self.config.optimizer, {}), **group} for group in state_dict["param_groups"]]
        return {**state_dict, "state": state, "param_groups": groups, CONFIG_KEY: fp32_config.to_dict()}


# The group options torch.optim.AdamW / SGD read in step() that our groups lack (torch's own defaults).
_COMMON = {"maximize": False, "foreach": None, "differentiable": False, "fused": None}
_TORCH_GROUP_KEYS = {
    "Int8AdamW": {**_COMMON, "amsgrad": False, "capturable": False, "decoupled_weight_decay": True},
    "Int8SGD": {**_COMMON, "dampening": 0.0},
}


def _placed(value: Any, key: str, device: torch.device) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if key == "step":
        return value.detach().to("cpu", torch.float32).clone()
    dtype = value.dtype if not value.is_floating_point() else torch.float32
    return local_tensor(value).detach().to(device=device, dtype=dtype).clone()


def state_config(
    optimizer: str,
    state: str,
    block_size: int,
    min_numel: int,
    fp32_patterns: Iterable[str],
    fp32_warmup_steps: int,
    second_moment_code: str = DEFAULT_SECOND_MOMENT_CODE,
) -> StateConfig:
    if isinstance(fp32_patterns, str):
        fp32_patterns = (fp32_patterns,)
    return StateConfig(
        optimizer, state, block_size, min_numel, tuple(fp32_patterns), fp32_warmup_steps, second_moment_code
    )
