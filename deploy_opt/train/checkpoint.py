"""Training checkpoints: everything a resumed run needs to continue bit for bit, written atomically.

One file, ``checkpoint.pt`` in the output folder, replaced at every save. It holds the model, the optimizer's
state_dict (which records the optimizer type and quantization config), the scheduler, the global step and the
position in the epoch, the anomaly-skip history, the RNG states and a snapshot of the config. It loads with
``torch.load(weights_only=True)``: only tensors and plain Python values are stored.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dopt_common.errors import CheckpointError
from dopt_common.files import atomic_path

log = logging.getLogger(__name__)
FORMAT = "deploy_opt.train.checkpoint"
VERSION = 1
CHECKPOINT_NAME = "checkpoint.pt"
# Config keys that may change between the interrupted run and its resume: they do not change the numbers.
RESUMABLE_CHANGES = frozenset({"output_dir", "base_dir", "log_every", "checkpoint_every", "threads", "description"})


@dataclass
class Progress:
    """Where a run is: the global step, the epoch and how many of its batches were used, and the skip history."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    skipped_at: list[int] = field(default_factory=list)  # the global steps skipped as anomalous
    recent_norms: list[float] = field(default_factory=list)


def capture_rng() -> dict[str, Any]:
    """The torch, numpy and Python RNG states, as tensors and plain values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(np.asarray(keys).astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Put the RNG states captured by :func:`capture_rng` back."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    progress: Progress,
    config: dict[str, Any],
) -> Path:
    """Write the checkpoint atomically (a crash leaves the previous one intact)."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "progress": vars(progress).copy(),
        "model": model.state_dict(),
        "optimizer_type": type(optimizer).__name__,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": capture_rng(),
        "config": config,
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    log.debug("checkpoint at step %d written to %s", progress.step, path)
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint file and check its format and version."""
    if not path.is_file():
        raise CheckpointError(f"no checkpoint to resume from at '{path}'; fix: run without resume first")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or foreign file: one line, never torch's advice to load it unsafely
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        detail = "" if not first or "weights" in first.lower() or "trust" in first.lower() else f": {first[:120]}"
        raise CheckpointError(
            f"cannot read checkpoint '{path}' ({type(exc).__name__}{detail}); it is truncated, corrupt or not a "
            "deploy_opt training checkpoint; fix: resume from another checkpoint, or start without resume"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a deploy_opt training checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint '{path}' has version {payload.get('version')}; this deploy_opt reads version {VERSION}"
        )
    return payload


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """The config keys (dotted) whose values differ, ignoring the ones a resume may change."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if not prefix and key in RESUMABLE_CHANGES:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif _plain(a) != _plain(b):
            out.append(f"{prefix}{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def restore_checkpoint(
    payload: dict[str, Any],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config: dict[str, Any],
    path: Path,
) -> Progress:
    """Load model, optimizer, scheduler and RNG states from a checkpoint made with the same config."""
    differences = config_differences(payload["config"], config)
    if differences:
        raise CheckpointError(
            f"cannot resume from '{path}': the config changed ({'; '.join(differences)}); fix: resume with the "
            "config that wrote the checkpoint, or start a new run in another output folder"
        )
    if payload["optimizer_type"] != type(optimizer).__name__:
        raise CheckpointError(
            f"checkpoint '{path}' holds {payload['optimizer_type']} state but the run builds "
            f"{type(optimizer).__name__}; fix: resume with the same optimizer.type"
        )
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint '{path}' does not fit the model: {exc}") from exc
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    restore_rng(payload["rng"])
    return Progress(**payload["progress"])
