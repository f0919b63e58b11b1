"""The device check's optimizer section: deploy_opt's Int8AdamW against torch's fused AdamW on one device.

Both train their own copy of the same initial model (``benchmarks.device.lm``) on the same batches, in lockstep, the
order rotated every step so that clocks and caches treat them alike. Same hyper-parameters, decay groups, warmup +
cosine schedule and clipping as ``benchmarks/train/optimizers.py``, whose state counter this reuses (every
tensor in ``optimizer.state``, shared tables once). Times are CUDA events around ``step()`` and around the whole
step (forward, backward, clip, step) on CUDA, ``perf_counter`` on a CPU; the medians skip the first steps, where
allocation and ``torch.compile`` of Int8AdamW's fused kernels land (reported apart as ``first_steps_s``).

On CUDA, ``Int8AdamW`` (``compiled=None``) updates every int8-state tensor with one compiled call
(``kernels.adamw_param``: whole blocks and tail in one graph, hyper-parameters as 0-d CPU tensors,
``dynamic=False``) and its fp32-state tensors together through torch's foreach AdamW; ``Int8AdamW eager``
(``compiled=False``) keeps the per-op path for int8 state. Each Int8AdamW row records ``step_paths``, how many
parameters took each path in the last step, so the table shows which code was timed. Goals against fused
AdamW: optimizer step within 2x, full step within 1.1x, held-out loss within 0.02, at most 2.05 state bytes per
parameter.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.device.lm import SIZES, LMData, build_lm, eval_loss, lm_data, lm_loss, save_lm, train_tokenizer
from benchmarks.train.optimizers import WEIGHT_DECAY, lockstep, state_bytes, timed_step
from deploy_opt.train.optimizers import Int8AdamW, optimizer_state_bytes
from deploy_opt.train.param_groups import decay_groups
from deploy_opt.train.schedules import ScheduleConfig, build_scheduler
from dopt_common.timer import median_ms

log = logging.getLogger(__name__)
REFERENCE = "torch AdamW fused"
OPTIMIZERS = (REFERENCE, "Int8AdamW", "Int8AdamW eager")
LR = 1e-3


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """One of OPTIMIZERS over decay / no-decay groups, all with the same hyper-parameters."""
    groups = decay_groups(model, WEIGHT_DECAY)
    common = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": WEIGHT_DECAY}
    if name == REFERENCE:
        plain = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in groups]
        return torch.optim.AdamW(plain, **common, fused=True)
    if name == "Int8AdamW":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=())
    if name == "Int8AdamW eager":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=(), compiled=False)
    raise ValueError(f"unknown optimizer {name!r}")


class StepClock:
    """Times two nested spans of a step: CUDA events on a GPU (read after one sync), perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[Any, Any, Any]] = []
        self.full_ms: list[float] = []
        self.step_ms: list[float] = []

    def mark(self) -> Any:
        """A point in time on the device's stream."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, start: Any, before_step: Any, end: Any) -> None:
        """Record one step's three marks."""
        self.pending.append((start, before_step, end))

    def settle(self) -> None:
        """Turn the pending marks into milliseconds (one synchronize for all of them on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
        for start, before_step, end in self.pending:
            if self.cuda:
                self.full_ms.append(start.elapsed_time(end))
                self.step_ms.append(before_step.elapsed_time(end))
            else:
                self.full_ms.append((end - start) * 1e3)
                self.step_ms.append((end - before_step) * 1e3)
        self.pending.clear()


def _one_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, clock: StepClock
) -> torch.Tensor:
    loss, start, before_step, end = timed_step(model, optimizer, lambda: lm_loss(model, batch), clock.mark)
    clock.add(start, before_step, end)
    return loss.detach()


def _train(
    names: list[str], base: torch.nn.Module, data: LMData, device: torch.device, say: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    models = {n: copy.deepcopy(base) for n in names}
    optimizers = {n: make_optimizer(n, models[n]) for n in names}
    schedule = ScheduleConfig("warmup_cosine", warmup_ratio=0.05, min_lr_ratio=0.1)
    schedulers = {n: build_scheduler(optimizers[n], schedule, len(data.train)) for n in names}
    clocks = {n: StepClock(device) for n in names}
    losses: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    wall = dict.fromkeys(names, 0.0)
    for step, batch in enumerate(data.train):
        for name in lockstep(names, step):
            started = time.perf_counter()
            losses[name].append(_one_step(models[name], optimizers[name], batch, clocks[name]))
            schedulers[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall[name] += time.perf_counter() - started
        if (step + 1) % max(1, len(data.train) // 5) == 0:
            say(
                f"optimizers: step {step + 1}/{len(data.train)}: "
                + ", ".join(f"{n} {float(losses[n][-1]):.3f}" for n in names)
            )
    for clock in clocks.values():
        clock.settle()
    return {
        n: {
            "model": models[n],
            "optimizer": optimizers[n],
            "clock": clocks[n],
            "losses": [float(x) for x in losses[n]],
            "wall_s": wall[n],
        }
        for n in names
    }


def _row(name: str, run: dict[str, Any], data: LMData, params: int, skip: int) -> dict[str, Any]:
    clock, losses = run["clock"], run["losses"]
    tail = max(1, len(losses) // 10)
    held = state_bytes(run["optimizer"])
    row = {
        "optimizer": name,
        "params": params,
        "state_bytes": held,
        "bytes_per_param": held / params,
        "optimizer_ms": median_ms(clock.step_ms[skip:] or clock.step_ms),
        "step_ms": median_ms(clock.full_ms[skip:] or clock.full_ms),
        "first_steps_s": sum(clock.full_ms[:skip]) / 1e3,
        "wall_s": run["wall_s"],
        "train_loss": statistics.fmean(losses[-tail:]),
        "eval_loss": eval_loss(run["model"], data.evaluation),
        "curve": [round(statistics.fmean(losses[i : i + tail]), 4) for i in range(0, len(losses), tail)],
    }
    if isinstance(run["optimizer"], Int8AdamW):
        row["reported_state_bytes"] = int(optimizer_state_bytes(run["optimizer"])["total"])
        row["step_paths"] = dict(run["optimizer"].step_paths)
    return row


def run_optimizers(
    device: torch.device, size_name: str, out_dir: Path, say: Callable[[str], None], seed: int = 0
) -> dict[str, Any]:
    """Train the small LM with every optimizer; the rows, the ratios to fused AdamW, and the saved model's path."""
    size = SIZES[size_name]
    started = time.perf_counter()
    tokenizer = train_tokenizer(size.vocab)
    data = lm_data(tokenizer, size, device, seed)
    base = build_lm(size, len(tokenizer), seed).to(device)
    params = sum(p.numel() for p in base.parameters())
    initial = eval_loss(base, data.evaluation)
    say(
        f"optimizers: {params / 1e6:.1f}M parameters, {len(data.train)} steps of {size.batch} x {size.seq_len} "
        f"tokens on {device}; held-out loss before training {initial:.3f}"
    )
    runs = _train(list(OPTIMIZERS), base, data, device, say)
    skip = max(3, len(data.train) // 20)
    rows = [_row(name, runs[name], data, params, skip) for name in OPTIMIZERS]
    reference = rows[0]
    for row in rows:
        row["optimizer_ratio"] = row["optimizer_ms"] / reference["optimizer_ms"]
        row["step_ratio"] = row["step_ms"] / reference["step_ms"]
        row["eval_loss_gap"] = row["eval_loss"] - reference["eval_loss"]
    model_dir = save_lm(runs[REFERENCE]["model"], tokenizer, out_dir / "lm")
    return {
        "device": str(device),
        "size": size_name,
        "params": params,
        "steps": len(data.train),
        "batch": [size.batch, size.seq_len],
        "median_skips_steps": skip,
        "initial_eval_loss": initial,
        "rows": rows,
        "model_dir": str(model_dir),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "seconds": time.perf_counter() - started,
    }
