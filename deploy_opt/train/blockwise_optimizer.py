"""The optimizer that keeps its state in block-wise 8-bit codes: parameter groups with names, the step, state
placement and checkpoints. ``deploy_opt.train.optimizers`` (AdamW, Lion, SGD) and ``deploy_opt.train.sophia``
subclass it with their update.

A step takes each parameter one of four ways (``step_paths`` counts them):

- ``foreach``: fp32 state (small tensors, name patterns, warmup, ``state="fp32"``) of fp32 parameters, all of a
  group's at once through torch's multi-tensor ops (``deploy_opt.train.foreach``);
- ``fused``: int8 state on CUDA, one compiled call per parameter, whatever its size (``kernels.*_param``: whole
  blocks and tail in one graph, the group's hyper-parameters as 0-d CPU tensors made once per step,
  ``dynamic=False``);
- ``blocks``: int8 state on the CPU, compiled for tensors of ``AUTO_COMPILE_NUMEL`` elements and more
  (``kernels.*_blocks``: one call for the whole blocks and one for a shorter tail block);
- ``per-op``: everything else (dequantize the moments, the optimizer's ``_update``, requantize).

All four give the same numbers, to fp32 rounding.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from deploy_opt.train import kernels
from deploy_opt.train.blockwise import (
    block_count,
    block_parts,
    scale_parts,
)
from deploy_opt.train.foreach import ForeachUpdate, Group, Tensors
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
# compiled=None compiles the fused kernel for int8-state tensors of at least this many elements (32 blocks of 2048)
# on the CPU (measured there); on CUDA it compiles for every size.
AUTO_COMPILE_NUMEL = 65536
Moments = dict[str, torch.Tensor]  # the per-op path's fp32 moments of one parameter, by kind ("exp_avg", ...)


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


class BlockwiseOptimizer(torch.optim.Optimizer):
    """What the int8-state optimizers share: fallback rules, the step's paths, checkpoints."""

    # The subclass's multi-tensor update of fp32 state (``foreach.*_foreach``), or None: one parameter at a time.
    foreach_update: ClassVar[ForeachUpdate | None] = None
    # The subclass's fused int8 kernels (``kernels.*_blocks`` for the CPU, ``kernels.*_param`` for CUDA), or None:
    # the per-op path only (``_fits_kernel`` says False).
    block_kernel: ClassVar[Callable[..., None] | None] = None
    param_kernel: ClassVar[Callable[..., None] | None] = None

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
        # None: int8 state takes one kernel call per parameter on CUDA only; True/False force it on/off (tests run
        # the CUDA path's kernels on the CPU).
        self.per_param_kernels: bool | None = None
        # fp32 state through torch's multi-tensor ops; False sends it through the per-op path (tests compare).
        self.use_foreach = True
        self.step_paths: Counter[str] = Counter()  # parameters per path in the last step (see the module doc)
        self._step_scalars: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        super().__init__(_named_groups(params), defaults)

    # --- the update, per parameter ---------------------------------------------------------------------
    def _update(self, param: torch.Tensor, grad: torch.Tensor, moments: Moments, group: Group, step: int) -> None:
        raise NotImplementedError

    def _kernel_operands(
        self, param: torch.Tensor, state: dict[str, Any], group: Group
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The fused kernels' arguments between ``grad`` and ``hyper`` (int8 state), and after it."""
        raise NotImplementedError

    def _run_kernel(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        group: Group,
        step: int,
        compile_: bool,
        whole: bool = False,
    ) -> None:
        """One fused kernel call. ``whole``: ``param_kernel`` on one whole flat parameter, ``hyper`` as 0-d CPU
        tensors (the CUDA path); else ``block_kernel`` on whole blocks, ``hyper`` as one tensor on the parameter's
        device (the CPU path)."""
        operands, options = self._kernel_operands(param, state, group)
        if whole:
            kernel, hyper, options = self.param_kernel, self._scalars(group, step), (*options, self.config.block_size)
        else:
            kernel, hyper = self.block_kernel, self._hyper_tensor(group, step, param.device)
        kernels.run_kernel(kernel, compile_, param, grad, *operands, hyper, *options)

    def _hyper_values(self, group: Group, step: int) -> list[float]:
        """The kernels' ``hyper`` for a group at ``step`` (see ``kernels``)."""
        raise NotImplementedError

    def _hyper_tensor(self, group: Group, step: int, device: torch.device) -> torch.Tensor:
        """``hyper`` as one fp32 tensor on ``device``: the block kernels' (CPU) form."""
        return torch.tensor(self._hyper_values(group, step), dtype=torch.float32, device=device)

    def _scalars(self, group: Group, step: int) -> tuple[torch.Tensor, ...]:
        """``hyper`` as 0-d CPU tensors, made once per group and step: the per-parameter kernels' (CUDA) form."""
        key = (id(group), step)
        hyper = self._step_scalars.get(key)
        if hyper is None:
            hyper = self._step_scalars[key] = kernels.scalars(*self._hyper_values(group, step))
        return hyper

    def _foreach_update(
        self, params: Tensors, grads: Tensors, moments: dict[str, Tensors], steps: Tensors, group: Group
    ) -> None:
        if self.foreach_update is None:
            raise NotImplementedError(f"{type(self).__name__} has no multi-tensor update")
        self.foreach_update(params, grads, moments, steps, group)

    def compiles(self, numel: int, device: torch.device | None = None) -> bool:
        """Whether an int8-state parameter of ``numel`` elements (on ``device``) takes the compiled kernel.

        ``compiled=None`` (the default) compiles every size on CUDA, and on the CPU tensors of at least
        ``AUTO_COMPILE_NUMEL`` elements: there the fused kernel is 2-8x faster than the per-op path, and below it
        compiling costs more than it saves.
        """
        if self.compiled is not None:
            return self.compiled
        return (device is not None and device.type == "cuda") or numel >= AUTO_COMPILE_NUMEL

    def takes_per_param_kernel(self, device: torch.device) -> bool:
        """Whether int8 state on ``device`` takes the one-call-per-parameter kernels (CUDA) or the block ones."""
        return self.per_param_kernels if self.per_param_kernels is not None else device.type == "cuda"

    def _moments(self, group: Group) -> tuple[tuple[str, str], ...]:
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
        self.step_paths.clear()
        self._step_scalars.clear()
        with kernels.unlimited_recompiles():
            for group in self.param_groups:
                batch = []
                for param, name in zip(group["params"], self._names(group), strict=True):
                    if param.grad is None:
                        continue
                    if self._joins_foreach(param, name, group):
                        batch.append(param)
                    else:
                        self._step_param(param, name, group)
                if batch:
                    self._foreach_step(batch, group)
        return loss

    def _joins_foreach(self, param: torch.Tensor, name: str | None, group: Group) -> bool:
        """Whether this step updates the parameter with the group's multi-tensor update: fp32 state, fp32 tensors."""
        if not (self.use_foreach and self.foreach_update is not None):
            return False
        local, grad = local_tensor(param), local_tensor(param.grad)
        if grad.is_sparse or local.dtype != torch.float32 or grad.dtype != torch.float32:
            return False
        state = self.state[param]
        kinds = [kind for kind, _ in self._moments(group)]
        if any(kind + "_codes" in state for kind in kinds):
            return False  # int8 state (or the switch to it after warmup): the per-parameter paths
        step = int(state["step"].item()) + 1 if "step" in state else 1
        return not kinds or not self.config.quantizes(name, local.numel(), step)

    def _foreach_step(self, params: Tensors, group: Group) -> None:
        """One multi-tensor update of ``params`` (all fp32 state), creating zero moments on their first step."""
        locals_, grads, steps = [], [], []
        moments: dict[str, list[torch.Tensor]] = {kind: [] for kind, _ in self._moments(group)}
        for param in params:
            state, local = self.state[param], local_tensor(param)
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
            locals_.append(local)
            grads.append(local_tensor(param.grad))
            steps.append(state["step"])
            for kind, values in moments.items():
                if kind not in state:
                    state[kind] = torch.zeros_like(local, dtype=torch.float32)
                values.append(state[kind])
        self._foreach_update(locals_, grads, moments, steps, group)
        self.step_paths["foreach"] += len(params)

    def _names(self, group: Group) -> list[str | None]:
        names = group.get("param_names")
        if names is None or len(names) != len(group["params"]):
            # ZeroRedundancyOptimizer hands each rank a slice of the params with the full name list.
            return [None] * len(group["params"])
        return list(names)

    def _step_param(self, param: torch.Tensor, name: str | None, group: Group) -> None:
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
            compile_ = self.compiles(local.numel(), local.device)
            if self.takes_per_param_kernel(local.device):
                # detach(): as in _run_blocks, the kernel's in-place writes still land in the parameter's storage
                self._run_kernel(local.detach().view(-1), grad.view(-1), state, group, step, compile_, whole=True)
                self.step_paths["fused"] += 1
                return
            self._run_blocks(local, grad, state, group, step, compile_)
            self.step_paths["blocks"] += 1
            return
        self.step_paths["per-op"] += 1
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

    def _run_blocks(
        self,
        local: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        group: Group,
        step: int,
        compile_: bool,
    ) -> None:
        """The CPU path's kernels on one parameter: one call for its whole blocks, one for a shorter tail block."""
        cfg = self.config
        work = local if local.dtype == torch.float32 else local.float()
        numel, size = local.numel(), cfg.block_size
        pieces = {
            key: block_parts(value, size) if key.endswith("_codes") else scale_parts(value, numel, size)
            for key, value in state.items()
            if key.endswith(("_codes", "_scales"))
        }
        # detach(): both views exist before the first call writes the parameter, which autograd forbids for
        # views of a tensor that requires grad (the writes still land in the parameter's storage).
        parts = zip(block_parts(work.detach().view(-1), size), block_parts(grad.float().view(-1), size), strict=True)
        for index, (part, part_grad) in enumerate(parts):
            self._run_kernel(
                part, part_grad, {key: value[index] for key, value in pieces.items()}, group, step, compile_
            )
        if work is not local:
            local.copy_(work)

    def _fits_kernel(self, state: dict[str, Any], local: torch.Tensor, grad: torch.Tensor, group: Group) -> bool:
        """Whether the fused kernel can run: contiguous, state int8 already (or still empty)."""
        moments = self._moments(group)
        use_kernels = self.compiles(local.numel(), local.device) if self.use_kernels is None else self.use_kernels
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
