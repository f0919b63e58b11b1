"""The quantization config an int8 optimizer writes into its checkpoints, and the conversions between state forms.

A param's state holds, per moment ``kind`` (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ``hessian``), either
one fp32 tensor under ``kind`` (the key torch's own optimizers use) or ``kind + "_codes"`` (int8/uint8, flat) and
``kind + "_scales"`` (fp32, one per block). ``step`` is a 0-d fp32 tensor, as in ``torch.optim.AdamW``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict

import torch

from deploy_opt.train.blockwise import (
    DEFAULT_SECOND_MOMENT_CODE,
    check_block_size,
    check_second_moment_code,
    dequantize,
    quantize,
)
from dopt_common.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

CONFIG_KEY = "quant_config"
FORMAT_VERSION = 1
STATES = ("int8", "fp32")
# Which moments each optimizer keeps, and their code ("signed", or "second" for the configured unsigned code).
MOMENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "Int8AdamW": (("exp_avg", "signed"), ("exp_avg_sq", "second")),
    "Int8Lion": (("exp_avg", "signed"),),
    "Int8SGD": (("momentum_buffer", "signed"),),
    # Sophia's Hessian EMA is non-negative like AdamW's second moment, and spans decades the same way.
    "Int8Sophia": (("exp_avg", "signed"), ("hessian", "second")),
}


@dataclasses.dataclass(frozen=True)
class StateConfig:
    """How an optimizer stores its state; written under ``quant_config`` in every state dict."""

    optimizer: str
    state: str = "int8"
    block_size: int = 2048
    min_numel: int = 4096
    fp32_patterns: tuple[str, ...] = ("embed", "lm_head")
    fp32_warmup_steps: int = 0
    second_moment_code: str = DEFAULT_SECOND_MOMENT_CODE

    def __post_init__(self) -> None:
        if self.optimizer not in MOMENTS:
            raise ConfigError(f"optimizer {self.optimizer!r} is not one of {', '.join(MOMENTS)}")
        if self.state not in STATES:
            raise ConfigError(f"state {self.state!r} is not one of int8, fp32; use state='int8' or state='fp32'")
        check_block_size(self.block_size)
        check_second_moment_code(self.second_moment_code)
        for field in ("min_numel", "fp32_warmup_steps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{field} must be an integer >= 0, got {value!r}")
        if isinstance(self.fp32_patterns, str) or not all(isinstance(p, str) for p in self.fp32_patterns):
            raise ConfigError(f"fp32_patterns must be a sequence of strings, got {self.fp32_patterns!r}")
        object.__setattr__(self, "fp32_patterns", tuple(self.fp32_patterns))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form stored in checkpoints."""
        return {"format": FORMAT_VERSION, **dataclasses.asdict(self), "fp32_patterns": list(self.fp32_patterns)}

    def keeps_fp32(self, name: str | None, numel: int) -> bool:
        """Whether a parameter always keeps fp32 state (state='fp32', small tensor, or a name pattern)."""
        if self.state == "fp32" or numel < self.min_numel:
            return True
        return name is not None and any(pat in name or fnmatch.fnmatchcase(name, pat) for pat in self.fp32_patterns)

    def quantizes(self, name: str | None, numel: int, step: int) -> bool:
        """Whether the state of this parameter is stored in int8 after ``step`` updates."""
        return not self.keeps_fp32(name, numel) and step >= self.fp32_warmup_steps


def check_range(name: str, value: float, low: float, high: float = math.inf, high_open: bool = False) -> None:
    """Raise ``ConfigError`` naming ``name`` unless ``value`` lies in ``[low, high]`` (``[low, high)``)."""
    if not (low <= value < high if high_open else low <= value <= high):
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ConfigError(f"{name} = {value!r} is outside {bound}")


class StateOptions(TypedDict, total=False):
    """How an int8-state optimizer keeps its state: the keyword arguments every one takes (``StateConfig``'s fields,
    and ``compiled``: the fused kernels on, off, or None for their own rule)."""

    state: str
    block_size: int
    min_numel: int
    fp32_patterns: Iterable[str]
    fp32_warmup_steps: int
    compiled: bool | None


class SecondMomentOptions(StateOptions, total=False):
    """``StateOptions`` and the 8-bit code of the second moment (AdamW's, and Sophia's Hessian EMA)."""

    second_moment_code: str


def state_config(optimizer: str, options: Mapping[str, Any]) -> tuple[StateConfig, bool | None]:
    """An optimizer's ``StateConfig`` and ``compiled`` from its keyword arguments (one pattern may be a bare
    string); a keyword it does not take is a TypeError, as for any function."""
    takes = SecondMomentOptions if MOMENTS[optimizer][-1][1] == "second" else StateOptions
    unknown = sorted(set(options) - takes.__optional_keys__)
    if unknown:
        raise TypeError(f"{optimizer}() got an unexpected keyword argument {unknown[0]!r}")
    fields = {k: v for k, v in options.items() if k != "compiled"}
    if "fp32_patterns" in fields:  # any iterable, read once here (a generator would be spent by StateConfig's check)
        patterns = fields["fp32_patterns"]
        fields["fp32_patterns"] = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return StateConfig(optimizer, **fields), options.get("compiled")


def config_of_checkpoint(state_dict: dict[str, Any]) -> StateConfig | None:
    """The config a checkpoint was written with; a plain torch checkpoint gets an inferred fp32 config (or None)."""
    raw = state_dict.get(CONFIG_KEY)
    if raw is None:
        family = _infer_family(state_dict.get("state", {}))
        return None if family is None else StateConfig(optimizer=family, state="fp32")
    raw = dict(raw)
    version = raw.pop("format", None)
    if version != FORMAT_VERSION:
        raise CheckpointError(f"optimizer checkpoint format {version!r} is not {FORMAT_VERSION}; save it again")
    try:
        return StateConfig(**{**raw, "fp32_patterns": tuple(raw.get("fp32_patterns", ()))})
    except (TypeError, ConfigError) as exc:
        raise CheckpointError(f"optimizer checkpoint has an invalid {CONFIG_KEY}: {exc}") from exc


def _infer_family(state: dict[Any, dict[str, Any]]) -> str | None:
    keys = {key for param_state in state.values() for key in param_state}
    if "hessian" in keys:
        return "Int8Sophia"
    if "exp_avg_sq" in keys:
        return "Int8AdamW"
    if "momentum_buffer" in keys:
        return "Int8SGD"
    if "exp_avg" in keys:
        return "Int8Lion"
    return None


def config_differences(saved: StateConfig, current: StateConfig) -> list[str]:
    """What differs between two configs, as ``field: checkpoint X, optimizer Y`` (only fields that matter)."""
    fields = ["optimizer", "state"]
    if saved.state == current.state == "int8":
        fields += ["block_size", "min_numel", "fp32_patterns", "fp32_warmup_steps"]
        if current.optimizer in ("Int8AdamW", "Int8Sophia"):
            fields.append("second_moment_code")
    return [
        f"{field}: checkpoint {_show(getattr(saved, field))}, optimizer {_show(getattr(current, field))}"
        for field in fields
        if getattr(saved, field) != getattr(current, field)
    ]


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def check_checkpoint(saved: StateConfig | None, current: StateConfig, convert: bool) -> bool:
    """Raise ``CheckpointError`` on a mismatch (unless ``convert``); return whether the state must be converted."""
    if saved is None:  # no state at all: nothing to check or convert
        return False
    diffs = config_differences(saved, current)
    if saved.optimizer != current.optimizer:
        raise CheckpointError(
            f"{diffs[0]}; the state of another algorithm cannot be loaded, build a {saved.optimizer} instead"
        )
    if diffs and not convert:
        raise CheckpointError(f"{'; '.join(diffs)}; pass convert=True to convert")
    return bool(diffs)


def moment_code(kind_code: str, config: StateConfig) -> str:
    """The blockwise code of a moment: 'signed', or the config's second-moment code."""
    return config.second_moment_code if kind_code == "second" else kind_code


def read_moment(
    param_state: dict[str, Any], kind: str, code: str, block_size: int, shape: torch.Size
) -> torch.Tensor | None:
    """The fp32 tensor (shaped ``shape``) of one moment, from its fp32 or its codes/scales form; None if absent."""
    value = param_state.get(kind)
    if isinstance(value, torch.Tensor):
        return local_tensor(value).float().reshape(shape)
    codes = param_state.get(kind + "_codes")
    if codes is None:
        return None
    # second moments: a code 0 reads as half a step (see blockwise.dequantize_unsigned)
    return dequantize(codes, param_state[kind + "_scales"], block_size, code, zero_as_half_step=True).view(shape)


def write_moment(
    param_state: dict[str, Any], kind: str, code: str, value: torch.Tensor, block_size: int, as_int8: bool
) -> None:
    """Store one moment into ``param_state`` as fp32 or as codes/scales, reusing existing code buffers."""
    if not as_int8:
        param_state.pop(kind + "_codes", None)
        param_state.pop(kind + "_scales", None)
        param_state[kind] = value
        return
    out = None
    codes, scales = param_state.get(kind + "_codes"), param_state.get(kind + "_scales")
    if codes is not None and codes.numel() == value.numel() and scales is not None:
        out = (codes, scales)
    param_state[kind + "_codes"], param_state[kind + "_scales"] = quantize(value, block_size, code, out)
    param_state.pop(kind, None)


def convert_param_state(
    param_state: dict[str, Any],
    saved: StateConfig,
    current: StateConfig,
    shape: torch.Size,
    as_int8: bool,
    device: torch.device,
) -> dict[str, Any]:
    """One param's state rewritten from ``saved``'s form into ``current``'s (fp32 or int8 at its block size)."""
    out: dict[str, Any] = {"step": _step_tensor(param_state.get("step"))}
    for kind, kind_code in MOMENTS[current.optimizer]:
        value = read_moment(param_state, kind, moment_code(kind_code, saved), saved.block_size, shape)
        if value is not None:
            # clone: the result must not alias the source state (torch's load_state_dict keeps tensors as given)
            value = value.to(device).clone()
            write_moment(out, kind, moment_code(kind_code, current), value, current.block_size, as_int8)
    return out


def _step_tensor(step: Any) -> torch.Tensor:
    if isinstance(step, torch.Tensor):
        return step.detach().to("cpu", torch.float32).reshape(()).clone()
    return torch.tensor(float(step or 0), dtype=torch.float32)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), or the tensor itself."""
    to_local: Callable[[], torch.Tensor] | None = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Bytes held by an optimizer's state tensors: total, per parameter element, and by moment kind.

    Works for any ``torch.optim.Optimizer`` (and the local optimizer of a ``ZeroRedundancyOptimizer``); a
    DTensor counts its local shard. ``by_kind`` folds ``kind_codes`` and ``kind_scales`` into ``kind``;
    ``scales`` and ``fp32`` say how much of the total is block scales and fp32 moments.
    """
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps this rank's state there
    by_kind: dict[str, int] = {}
    scales = fp32 = 0
    for param_state in inner.state.values():
        for key, value in param_state.items():
            if not isinstance(value, torch.Tensor):
                continue
            nbytes = local_tensor(value).nbytes
            kind = key.removesuffix("_codes").removesuffix("_scales")
            by_kind[kind] = by_kind.get(kind, 0) + nbytes
            if key.endswith("_scales"):
                scales += nbytes
            elif key != "step" and value.is_floating_point():
                fp32 += nbytes
    numel = sum(local_tensor(p).numel() for group in inner.param_groups for p in group["params"])
    total = sum(by_kind.values())
    return {
        "total": total,
        "per_param": total / numel if numel else 0.0,
        "by_kind": by_kind,
        "scales": scales,
        "fp32": fp32,
        "params": numel,
    }
