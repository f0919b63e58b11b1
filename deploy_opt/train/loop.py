"""The training loop: int8-state optimizer, schedule, clipping, anomaly skip, JSON-lines log, checkpoint and resume.

One step: forward, loss, backward; the global grad norm is measured and clipped (outside the optimizer); a step
whose norm is not finite, or exceeds ``anomaly_factor`` x the median of the recent accepted norms, is skipped
(the weights and the optimizer state stay as they were) and logged; the schedule follows the global step, skipped
or not. ``train_log.jsonl`` gets one ``{"event": "step", ...}`` line per step; ``checkpoint.pt`` is replaced every
``checkpoint_every`` steps and at the end; a resumed run continues with the same batches, LR and RNG states and
ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from deploy_opt.data.sources import call_user, resolve_callable
from deploy_opt.train.checkpoint import CHECKPOINT_NAME, Progress, read_checkpoint, restore_checkpoint, save_checkpoint
from deploy_opt.train.config import OptimizerConfig, TrainConfig
from deploy_opt.train.data import TrainData, batch_size_of, evaluate, load_train_data, run_model
from deploy_opt.train.hessian import sophia_backward
from deploy_opt.train.optimizers import Int8AdamW, Int8Lion, Int8SGD, optimizer_state_bytes
from deploy_opt.train.param_groups import DEFAULT_NO_DECAY, decay_groups
from deploy_opt.train.run_log import truncate_log, write_event
from deploy_opt.train.schedules import build_scheduler
from deploy_opt.train.sophia import Int8Sophia
from dopt_common.errors import ConfigError, OutputError, SourceError
from dopt_common.files import atomic_path, ensure_writable_dir, write_json
from dopt_common.runs import report_lock, seed_everything

log = logging.getLogger(__name__)
LOG_NAME = "train_log.jsonl"
RESULT_NAME = "train_result.json"
MODEL_NAME = "model.pt"


@dataclass(frozen=True)
class TrainResult:
    """What a run produced: steps done and skipped, the last loss, evaluation metrics and the files written."""

    steps: int
    total_steps: int
    skipped_steps: int
    final_loss: float | None  # the training loss of the last step that updated the weights (in this call)
    metrics: dict[str, float]
    optimizer_state_bytes: int
    output_dir: str
    checkpoint: str
    log: str
    model: str | None  # the final weights (a plain state_dict), written when the run completed
    seconds: float
    completed: bool = True
    skipped_at: tuple[int, ...] = field(default=())


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """The configured int8-state optimizer over decay / no-decay param groups (named, for fp32_patterns)."""
    groups = decay_groups(model, config.weight_decay, no_decay=config.no_decay or DEFAULT_NO_DECAY)
    common: dict[str, Any] = {
        "lr": config.resolved_lr,
        "weight_decay": config.weight_decay,
        "state": config.state,
        "block_size": config.block_size,
        "min_numel": config.min_numel,
        "fp32_patterns": config.fp32_patterns,
        "fp32_warmup_steps": config.fp32_warmup_steps,
    }
    if config.type == "adamw":
        return Int8AdamW(groups, betas=config.resolved_betas, eps=config.eps, **common)
    if config.type == "lion":
        return Int8Lion(groups, betas=config.resolved_betas, **common)
    if config.type == "sophia":
        return Int8Sophia(
            groups, betas=config.resolved_betas, rho=config.rho, update_period=config.update_period, **common
        )
    return Int8SGD(groups, momentum=config.momentum, nesterov=config.nesterov, **common)


def count_train_steps(config: TrainConfig, data: TrainData) -> int:
    """The run's total optimizer steps: ``steps``, or ``epochs`` x the batches in one epoch."""
    if config.steps is not None:
        return config.steps
    batches = data.train(0)
    try:
        per_epoch = len(batches)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(
            "epochs needs the data's train(epoch) to return a list (its length is the steps per epoch); "
            "fix: set 'steps' instead of 'epochs', or return a list"
        ) from exc
    if per_epoch == 0:
        raise SourceError("the data's train(0) returned no batches; fix the data function")
    return config.epochs * per_epoch  # type: ignore[operator]


def train(
    config: TrainConfig,
    output_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_at: int | None = None,
) -> TrainResult:
    """Train as configured; ``resume`` continues from ``checkpoint.pt``, ``stop_at`` pauses after that step."""
    out = ensure_writable_dir(output_dir if output_dir is not None else config.resolve_output_dir())
    checkpoint_path = out / CHECKPOINT_NAME
    if not resume and checkpoint_path.exists():
        raise OutputError(
            f"'{out}' already holds a training run ({CHECKPOINT_NAME}); fix: resume it, or choose another output folder"
        )
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        with report_lock(out):  # one run per folder: two would interleave their checkpoints and logs
            return _prepare_and_run(config, out, resume, progress, stop_at)
    finally:
        torch.set_num_threads(threads)


def _prepare_and_run(config: TrainConfig, out: Path, resume: bool, progress: bool, stop_at: int | None) -> TrainResult:
    checkpoint_path = out / CHECKPOINT_NAME
    seed_everything(config.seed)
    model = build_model(config)
    data = load_train_data(config.data, config.batch_size, config.seed, config.base_dir)
    total_steps = count_train_steps(config, data)
    optimizer = build_optimizer(model, config.optimizer)
    scheduler = build_scheduler(optimizer, config.scheduler, total_steps)
    state = Progress()
    log_path = out / LOG_NAME
    if resume:
        payload = read_checkpoint(checkpoint_path)
        state = restore_checkpoint(
            payload,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            config=config.to_dict(),
            path=checkpoint_path,
        )
        truncate_log(log_path, state.step)
        log.info("resumed from %s at step %d of %d", checkpoint_path, state.step, total_steps)
    else:
        log_path.unlink(missing_ok=True)
    with open(log_path, "a", encoding="utf-8") as log_file:
        write_event(log_file, _start_event(config, model, data, total_steps, resumed_at=state.step if resume else None))
        session = _Session(model, optimizer, scheduler, state)
        return _run(config, session, data, total_steps, log_file, out, progress, stop_at)


@dataclass(frozen=True)
class _Session:
    """The objects a run trains and advances: the model, its optimizer and schedule, and the step counters."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: Progress


def _run(
    config: TrainConfig,
    session: _Session,
    data: TrainData,
    total_steps: int,
    log_file: Any,
    out: Path,
    progress: bool,
    stop_at: int | None,
) -> TrainResult:
    from tqdm.auto import tqdm

    model, optimizer, scheduler, state = session.model, session.optimizer, session.scheduler, session.state
    started = time.perf_counter()
    end = total_steps if stop_at is None else min(stop_at, total_steps)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    last_loss: float | None = None
    model.train()
    bar = tqdm(total=total_steps, initial=state.step, desc="train", unit="step", disable=not progress)
    while state.step < end:
        seen = 0
        for inputs, target in islice(iter(data.train(state.epoch)), state.batch_in_epoch, None):
            seen += 1
            record = _train_step(config, model, data, optimizer, params, state, inputs, target)
            scheduler.step()
            state.step += 1
            state.batch_in_epoch += 1
            record = {"event": "step", "step": state.step, "epoch": state.epoch, **record}
            write_event(log_file, record)
            if not record["skipped"]:
                last_loss = record["loss"]
            if record["skipped"]:
                state.skipped_at.append(state.step)
            _show_step(bar, record, total_steps, config.log_every)
            if config.checkpoint_every and state.step % config.checkpoint_every == 0 and state.step < end:
                _save(out, model, optimizer, scheduler, state, config)
            if state.step >= end:
                break
        else:
            # The epoch ran out (also when a resume starts exactly at its end): go on with the next one.
            if seen == 0 and state.batch_in_epoch == 0:
                raise SourceError(f"the data's train({state.epoch}) returned no batches; fix the data function")
            state.epoch += 1
            state.batch_in_epoch = 0
    bar.close()
    checkpoint = _save(out, model, optimizer, scheduler, state, config)
    completed = state.step >= total_steps
    metrics: dict[str, float] = {}
    model_path: str | None = None
    if completed:
        metrics = evaluate(model, data)
        write_event(log_file, {"event": "eval", "step": state.step, **metrics})
        log.info("evaluation after %d steps: %s", state.step, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        with atomic_path(out / MODEL_NAME) as tmp:
            torch.save(model.state_dict(), tmp)
        model_path = str(out / MODEL_NAME)
    result = TrainResult(
        steps=state.step,
        total_steps=total_steps,
        skipped_steps=len(state.skipped_at),
        final_loss=last_loss,
        metrics=metrics,
        optimizer_state_bytes=int(optimizer_state_bytes(optimizer)["total"]),
        output_dir=str(out),
        checkpoint=str(checkpoint),
        log=str(out / LOG_NAME),
        model=model_path,
        seconds=time.perf_counter() - started,
        completed=completed,
        skipped_at=tuple(state.skipped_at),
    )
    write_json(out / RESULT_NAME, asdict(result))
    from deploy_opt.report.llm_train_pages import write_train_page

    write_train_page(out)
    return result


def _show_step(bar: Any, record: dict[str, Any], total_steps: int, log_every: int) -> None:
    """The progress bar's step and loss; every ``log_every`` steps (and every skipped one) a log line."""
    bar.update(1)
    bar.set_postfix(loss=f"{record['loss']:.4g}", lr=f"{record['lr']:.3g}", refresh=False)
    if record["step"] % log_every == 0 or record["skipped"]:
        log.info(
            "step %d/%d loss %.4g lr %.3g grad_norm %.3g%s",
            record["step"],
            total_steps,
            record["loss"],
            record["lr"],
            record["grad_norm"],
            " (skipped)" if record["skipped"] else "",
        )


def _train_step(
    config: TrainConfig,
    model: torch.nn.Module,
    data: TrainData,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    state: Progress,
    inputs: Any,
    target: Any,
) -> dict[str, Any]:
    """Forward, backward, clip, maybe skip, step; returns the step's log fields."""
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    output = run_model(model, inputs)
    loss = data.loss(output, target)
    hessian = sophia_backward(optimizer, loss, output, data.logits, config.optimizer.estimator)
    with_grad = [p for p in params if p.grad is not None]
    grad_norm = _clip(with_grad, config.clip_norm)
    reason = _anomaly(grad_norm, state.recent_norms, config)
    lr = float(optimizer.param_groups[0]["lr"])
    update_norm = 0.0
    if reason:
        log.warning("step %d skipped: %s", state.step + 1, reason)
    else:
        before = [p.detach().clone() for p in with_grad]
        if hessian is not None:
            optimizer.update_hessian(hessian)  # type: ignore[attr-defined]
        optimizer.step()
        update_norm = _distance(before, with_grad)
        state.recent_norms.append(grad_norm)
        del state.recent_norms[: -config.anomaly_window]
    record = {
        "lr": lr,
        "loss": float(loss.detach()),
        "grad_norm": grad_norm,
        "update_norm": update_norm,
        "optimizer_state_bytes": int(optimizer_state_bytes(optimizer)["total"]),
        "step_time_s": time.perf_counter() - started,
        "skipped": bool(reason),
        "batch_size": batch_size_of(target, inputs),
    }
    if reason:
        record["skip_reason"] = reason
    return record


def _clip(params: list[torch.Tensor], clip_norm: float | None) -> float:
    """The global L2 grad norm before clipping; grads are scaled down to ``clip_norm`` when above it."""
    if not params:
        return 0.0
    if clip_norm is None:
        return float(torch.nn.utils.get_total_norm([p.grad for p in params]))
    return float(torch.nn.utils.clip_grad_norm_(params, clip_norm))


def _anomaly(grad_norm: float, recent: list[float], config: TrainConfig) -> str:
    """Why this step must be skipped, or "" when it may run."""
    if not math.isfinite(grad_norm):
        return f"grad norm is {grad_norm}"
    if config.anomaly_factor is None or len(recent) < config.anomaly_min_history:
        return ""
    median = statistics.median(recent)
    if grad_norm > config.anomaly_factor * median:
        return (
            f"grad norm {grad_norm:.4g} exceeds {config.anomaly_factor:g} x the median {median:.4g} of the last "
            f"{len(recent)} steps"
        )
    return ""


def _distance(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """‖after − before‖₂ over all tensors (the update the optimizer really applied)."""
    if not before:
        return 0.0
    deltas = torch._foreach_sub(before, [p.detach() for p in after])
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(deltas))))


def _save(
    out: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: Progress,
    config: TrainConfig,
) -> Path:
    return save_checkpoint(
        out / CHECKPOINT_NAME,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        progress=state,
        config=config.to_dict(),
    )


def build_model(config: TrainConfig) -> torch.nn.Module:
    """The config's model from its factory; SourceError when the factory returns something else."""
    factory = resolve_callable(config.model, config.base_dir, what="model")
    model = call_user(factory, f"model factory '{config.model}'")
    if not isinstance(model, torch.nn.Module):
        raise SourceError(f"model factory '{config.model}' returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _start_event(
    config: TrainConfig, model: torch.nn.Module, data: TrainData, total_steps: int, resumed_at: int | None
) -> dict[str, Any]:
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    event: dict[str, Any] = {
        "event": "resume" if resumed_at is not None else "start",
        "step": resumed_at or 0,
        "total_steps": total_steps,
        "parameters": params,
        "config": config.to_dict(),
    }
    if config.model_type is not None and resumed_at is None:
        event["recommendation"] = _recommendation(config, params, data)
    return event


def _recommendation(config: TrainConfig, params: int, data: TrainData) -> dict[str, Any]:
    """The recommender's advice for this model type, size and data; a differing config choice is a warning."""
    from deploy_opt.train.recommend import recommend

    samples = sum(batch_size_of(target, inputs) for inputs, target in data.train(0))
    memory_gb = config.memory_gb or machine_memory_gb()
    rec = recommend(config.model_type, params, samples, memory_gb)  # type: ignore[arg-type]
    if (rec.optimizer, rec.state) != (config.optimizer.type, config.optimizer.state):
        log.warning(
            "the recommender suggests %s with %s state for this run, the config uses %s with %s state (%s)",
            rec.optimizer,
            rec.state,
            config.optimizer.type,
            config.optimizer.state,
            "; ".join(f"{c}: {r}" for c, r in rec.reasons),
        )
    return rec.to_json()


def machine_memory_gb() -> float:
    """This machine's RAM in GB (16 when the OS does not say): the recommender's default budget."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 16.0
