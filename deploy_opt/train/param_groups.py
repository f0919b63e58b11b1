"""Parameter groups with and without weight decay: no decay on biases and normalization weights by default.

Decoupled weight decay pulls weights toward zero. That is a prior on matrices (and convolution kernels), but on
a bias or a norm's gain it only fights the shift and scale the layer needs (the practice of BERT, GPT-2/nanoGPT
and Hugging Face's Trainer). The default rule: a parameter is excluded from decay when it has at most one
dimension (biases, LayerNorm/RMSNorm/BatchNorm weights, scalars) or its name matches a ``no_decay`` pattern.
Embeddings are 2-D and are decayed by default, as in GPT-2 and the HF Trainer; add ``extra_no_decay=("embed",)``
to exclude them.

A pattern matches a parameter name case-insensitively: as a glob when it holds ``*``, ``?`` or ``[``, else as a
substring (the same reading as the optimizers' ``fp32_patterns``).
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dopt_common.errors import ConfigError, InputError

log = logging.getLogger(__name__)

DEFAULT_NO_DECAY = ("bias", "norm")


def decay_groups(
    model_or_named_params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor],
    weight_decay: float,
    no_decay: Sequence[str] = DEFAULT_NO_DECAY,
    extra_no_decay: Sequence[str] = (),
    exclude_1d: bool = True,
) -> list[dict[str, Any]]:
    """Param groups ``{"params", "names", "weight_decay"}``: decayed first, then not; empty groups dropped.

    Every trainable parameter (``requires_grad``) appears exactly once; frozen ones and repeats of a shared
    (tied) tensor are left out. Plain tensors without names are named by position ("0", "1", ...).
    """
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not math.isfinite(weight_decay):
        raise ConfigError(f"weight_decay {weight_decay!r} must be a finite number >= 0 (e.g. 0.01 or 0.1)")
    if weight_decay < 0:
        raise ConfigError(f"weight_decay {weight_decay} must be >= 0 (e.g. 0.01 or 0.1)")
    patterns = tuple(p.lower() for p in (*_as_patterns(no_decay, "no_decay"), *_as_patterns(extra_no_decay, "extra")))
    decay: dict[str, list] = {"params": [], "names": []}
    keep: dict[str, list] = {"params": [], "names": []}
    for name, param in _named_trainable(model_or_named_params):
        group = keep if (exclude_1d and param.ndim <= 1) or _matches(name, patterns) else decay
        group["params"].append(param)
        group["names"].append(name)
    groups = [
        {**decay, "weight_decay": float(weight_decay)},
        {**keep, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise InputError("no trainable parameters: every parameter has requires_grad=False or none were given")
    for g in groups:
        count = sum(p.numel() for p in g["params"])
        log.info("weight_decay=%g: %d tensors, %d parameters", g["weight_decay"], len(g["params"]), count)
    return groups


def _named_trainable(source: Any) -> list[tuple[str, torch.Tensor]]:
    items = source.named_parameters() if isinstance(source, torch.nn.Module) else source
    if isinstance(items, torch.Tensor):
        raise InputError("decay_groups got a single tensor; pass a model, model.named_parameters() or a list")
    seen: set[int] = set()
    named: list[tuple[str, torch.Tensor]] = []
    for index, item in enumerate(items):
        name, param = (str(index), item) if isinstance(item, torch.Tensor) else _pair(item, index)
        if not param.requires_grad:
            continue
        if id(param) in seen:
            log.debug("parameter %s is a repeat of a shared tensor; kept once", name)
            continue
        seen.add(id(param))
        named.append((name, param))
    return named


def _pair(item: Any, index: int) -> tuple[str, torch.Tensor]:
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], torch.Tensor):
        return str(item[0]), item[1]
    raise InputError(
        f"parameter #{index} is a {type(item).__name__}, not a tensor or a (name, tensor) pair; "
        "pass a model, model.named_parameters() or a list of tensors"
    )


def _as_patterns(value: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    patterns = tuple(value)
    if not all(isinstance(p, str) and p for p in patterns):
        raise ConfigError(f"{what} patterns {list(patterns)!r} must be non-empty strings (e.g. 'bias', '*.ln_*')")
    return patterns


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    lowered = name.lower()
    return any(fnmatch.fnmatchcase(lowered, p) if any(c in p for c in "*?[") else p in lowered for p in patterns)
