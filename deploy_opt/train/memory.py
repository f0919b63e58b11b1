"""Training memory on paper: bytes per parameter for weights, gradients and optimizer state, per device.

The count follows the ZeRO paper's mixed-precision accounting (Rajbhandari et al. 2020, section 3.1): with 16-bit
parameters the optimizer keeps an fp32 master copy, so AdamW costs 2 (weights) + 2 (gradients) + 4 (master)
+ 4 + 4 (moments) = 16 bytes per parameter. Block-wise int8 state stores each moment in 1 byte plus one fp32
scale per block. Activations, temporary buffers, the allocator's slack and the CUDA context are not counted.

Sharding (``shards`` > 1) divides components across data-parallel ranks:
- ``shard="optimizer"`` (ZeRO-1, ``torch.distributed.optim.ZeroRedundancyOptimizer``): optimizer states, their
  int8 scales and the fp32 master weights; compute weights and gradients stay whole on every device.
- ``shard="full"`` (ZeRO-3 / FSDP ``fully_shard``): every component, including compute weights and gradients.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from dopt_common.errors import ConfigError

GB = 1e9  # decimal gigabytes, as GPU memory is sold and as the "112 GB" is counted

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
STATE_BYTES = {"fp32": 4, "int8": 1}
OPTIMIZER_STATES = {
    "adamw": ("exp_avg", "exp_avg_sq"),
    "lion": ("exp_avg",),
    "sgd": ("momentum_buffer",),
    "sophia": ("exp_avg", "hessian"),
}
SHARD_MODES = ("optimizer", "full")
SCALE_BYTES = 4  # one fp32 absmax scale per block per state tensor
MIN_BLOCK, MAX_BLOCK = 64, 8192

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)$")


@dataclass(frozen=True)
class MemoryComponent:
    """One line of the breakdown: what it is, its cost per parameter, and its bytes in total and per device."""

    name: str
    bytes_per_param: float
    total_bytes: int
    per_device_bytes: int
    sharded: bool

    def to_json(self) -> dict[str, Any]:
        """Plain data for the CLI's --json output."""
        return {
            "name": self.name,
            "bytes_per_param": self.bytes_per_param,
            "total_bytes": self.total_bytes,
            "per_device_bytes": self.per_device_bytes,
            "sharded": self.sharded,
        }


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes needed to train ``params`` parameters with one optimizer setup, split by component."""

    params: int
    optimizer: str
    state: str
    param_dtype: str
    shards: int
    shard: str
    block_size: int
    master_weights: bool
    components: tuple[MemoryComponent, ...]

    @property
    def total_bytes(self) -> int:
        """All components over all devices."""
        return sum(c.total_bytes for c in self.components)

    @property
    def per_device_bytes(self) -> int:
        """What one device holds after sharding."""
        return sum(c.per_device_bytes for c in self.components)

    @property
    def bytes_per_param(self) -> float:
        """Total bytes divided by the parameter count (before sharding)."""
        return self.total_bytes / self.params

    @property
    def state_bytes(self) -> int:
        """Optimizer states plus their int8 scales, over all devices (comparable to ``optimizer_state_bytes``)."""
        return sum(c.total_bytes for c in self.components if c.name.startswith(("state:", "scales")))

    @property
    def sharded_components(self) -> tuple[str, ...]:
        """Names of the components divided across ``shards`` devices."""
        return tuple(c.name for c in self.components if c.sharded)

    def component(self, name: str) -> MemoryComponent:
        """The component called ``name``; a ConfigError lists the names there are."""
        for c in self.components:
            if c.name == name:
                return c
        raise ConfigError(f"no memory component '{name}'; there are: {', '.join(c.name for c in self.components)}")

    def to_json(self) -> dict[str, Any]:
        """Plain data: the inputs, every component, and the totals in bytes and GB."""
        return {
            "params": self.params,
            "optimizer": self.optimizer,
            "state": self.state,
            "param_dtype": self.param_dtype,
            "shards": self.shards,
            "shard": self.shard,
            "sharded_components": list(self.sharded_components),
            "block_size": self.block_size,
            "master_weights": self.master_weights,
            "components": [c.to_json() for c in self.components],
            "bytes_per_param": self.bytes_per_param,
            "total_bytes": self.total_bytes,
            "per_device_bytes": self.per_device_bytes,
            "total_gb": self.total_bytes / GB,
            "per_device_gb": self.per_device_bytes / GB,
            "excludes": "activations, temporary buffers, allocator slack, CUDA context",
        }


def parse_count(value: str | int | float) -> int:
    """'7e9', '7B', '125M', '1.5k' or '7000000000' → a whole, positive parameter or sample count."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"count {value!r} is not a number; write it as 7e9, 7B, 125M or 7000000000")
    text = str(value).strip().lower().replace("_", "").replace(",", "")
    match = _COUNT.match(text)
    if match is None:
        raise ConfigError(f"count '{value}' is not a number; write it as 7e9, 7B, 125M or 7000000000")
    number = float(match.group(1)) * _SUFFIXES[match.group(2)]
    if not math.isfinite(number) or number < 1:
        raise ConfigError(f"count '{value}' must be a finite number >= 1 (e.g. 7e9 or 125M)")
    if abs(number - round(number)) > 1e-6 * max(1.0, number):
        raise ConfigError(f"count '{value}' = {number} is not a whole number; give a whole count such as 125M")
    return int(round(number))


def estimate_memory(
    params: int | float | str,
    optimizer: str = "adamw",
    state: str = "int8",
    param_dtype: str = "bf16",
    shards: int = 1,
    block_size: int = 2048,
    master_weights: bool | None = None,
    shard: str = "optimizer",
) -> MemoryEstimate:
    """Bytes of master weights, compute weights, gradients, optimizer states and scales; total and per device.

    ``master_weights`` defaults to True for 16-bit parameters (an fp32 copy the optimizer updates) and must be
    False for fp32 parameters, which are their own master copy. ``shards``/``shard``: see the module docstring.
    """
    count = parse_count(params)
    optimizer, state, param_dtype, shard = (str(x).lower() for x in (optimizer, state, param_dtype, shard))
    _check_choice("optimizer", optimizer, tuple(OPTIMIZER_STATES))
    _check_choice("state", state, tuple(STATE_BYTES))
    _check_choice("param dtype", param_dtype, tuple(DTYPE_BYTES))
    _check_choice("shard", shard, SHARD_MODES)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"shards {shards!r} must be a whole number >= 1 (the data-parallel ranks)")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not MIN_BLOCK <= block_size <= MAX_BLOCK:
        raise ConfigError(f"block size {block_size!r} must be a whole number in {MIN_BLOCK}..{MAX_BLOCK}")
    master = _resolve_master(master_weights, param_dtype)

    pdt = DTYPE_BYTES[param_dtype]
    parts: list[tuple[str, int, bool]] = []  # name, total bytes, sharded
    if master:
        parts.append(("master weights (fp32)", 4 * count, True))
    parts.append((f"compute weights ({param_dtype})", pdt * count, shard == "full"))
    parts.append((f"gradients ({param_dtype})", pdt * count, shard == "full"))
    names = OPTIMIZER_STATES[optimizer]
    for name in names:
        parts.append((f"state: {name} ({state})", STATE_BYTES[state] * count, True))
    if state == "int8":
        blocks = math.ceil(count / block_size)
        parts.append((f"scales (fp32, 1 per {block_size} per state)", SCALE_BYTES * blocks * len(names), True))

    components = tuple(
        MemoryComponent(name, total / count, total, math.ceil(total / shards) if sharded else total, sharded)
        for name, total, sharded in parts
    )
    return MemoryEstimate(count, optimizer, state, param_dtype, shards, shard, block_size, master, components)


def format_estimate(est: MemoryEstimate) -> str:
    """The printed table: component, bytes/param, GB in total and GB per device, then what is sharded."""
    head = (
        f"{est.params:,} parameters ({_short(est.params)}), {est.optimizer}, {est.state} state"
        + (f" (block {est.block_size})" if est.state == "int8" else "")
        + f", {est.param_dtype} parameters, {est.shards} shard{'s' if est.shards != 1 else ''}"
    )
    width = max(len("component"), *(len(c.name) for c in est.components), len("total"))
    rows = [head, "", f"{'component':<{width}}  {'bytes/param':>11}  {'GB total':>10}  {'GB/device':>10}"]
    rows.append("-" * len(rows[-1]))
    for c in est.components:
        mark = " *" if c.sharded and est.shards > 1 else ""
        rows.append(
            f"{c.name:<{width}}  {_num(c.bytes_per_param):>11}  {c.total_bytes / GB:>10.2f}  "
            f"{c.per_device_bytes / GB:>10.2f}{mark}"
        )
    rows.append("-" * len(rows[3]))
    rows.append(
        f"{'total':<{width}}  {_num(est.bytes_per_param):>11}  {est.total_bytes / GB:>10.2f}  "
        f"{est.per_device_bytes / GB:>10.2f}"
    )
    rows.append("")
    if est.shards > 1:
        mode = "ZeRO-1" if est.shard == "optimizer" else "ZeRO-3/FSDP"
        rows.append(f"* divided across {est.shards} devices ({mode}, shard={est.shard}).")
    rows.append("GB = 1e9 bytes. Not counted: activations, temporary buffers, allocator slack, CUDA context.")
    return "\n".join(rows)


def _resolve_master(master_weights: bool | None, param_dtype: str) -> bool:
    if master_weights is None:
        return param_dtype != "fp32"
    if master_weights and param_dtype == "fp32":
        raise ConfigError(
            "master_weights=True with fp32 parameters: fp32 parameters are their own master copy; "
            "drop master_weights or use bf16/fp16 parameters"
        )
    return bool(master_weights)


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{what} '{value}' is not one of {', '.join(allowed)}; pick one of them")


def _short(count: int) -> str:
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)


def _num(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".")
