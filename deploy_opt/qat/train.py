"""The QAT loop: distil the fake-quantized student towards the FP32 graph, keep the best checkpoint.

The training batches are the calibration sample (and ``data.train`` when given), cut into minibatches. A share of
them (``validation``) is held out of the updates: the checkpoint with the best metric on it wins (against the
labels, else the FP32 output; ties go to the lower loss), step 0 (the PTQ start) included, so a run that only gets
worse keeps its start. The held-out evaluation set is scored every
``eval_every`` steps for the report (``qat.png``), never used to choose. A run over ``budget_s`` stops there and
keeps its best checkpoint so far.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy_opt.analysis.onnx_torch import initializer_tensors, run_graph
from deploy_opt.build.metrics import Metric, RunningMean
from deploy_opt.build.sources import Batch
from deploy_opt.config.qat import QATConfig
from deploy_opt.qat.losses import LABEL_WEIGHT, choose_loss, distill_loss, label_loss
from deploy_opt.qat.student import Student, run_student
from dopt_common.errors import NumericsError

log = logging.getLogger(__name__)
CURVE_SAMPLES = 256  # held-out samples scored at each evaluation point (the curve only; the gate uses ORT)


@dataclass(frozen=True)
class TrainingRun:
    """What the loop did: its loss curve, the held-out metric curve and the checkpoint it kept."""

    loss: str
    optimizer: str
    steps: int
    best_step: int
    stopped: str  # "steps" or "budget"
    seconds: float
    train_loss: tuple[tuple[int, float], ...]
    validation_loss: tuple[tuple[int, float], ...]
    validation_metric: tuple[tuple[int, float], ...]
    metric: tuple[tuple[int, float], ...]  # the fake-quantized graph's held-out metric (torch)

    def to_json(self) -> dict[str, Any]:
        """The build.json ``qat.training`` section."""
        return {
            "loss": self.loss, "optimizer": self.optimizer, "steps": self.steps, "best_step": self.best_step,
            "stopped": self.stopped, "seconds": round(self.seconds, 1),
            "train_loss": [[s, round(v, 6)] for s, v in self.train_loss],
            "validation_loss": [[s, round(v, 6)] for s, v in self.validation_loss],
            "validation_metric": [[s, round(v, 4)] for s, v in self.validation_metric],
            "metric": [[s, round(v, 4)] for s, v in self.metric],
        }  # fmt: skip


@dataclass(frozen=True)
class _Data:
    train: list[Batch]
    validation: list[Batch]
    curve: list[Batch]


def split_minibatches(batches: Sequence[Batch], size: int, validation: float, seed: int) -> tuple[list, list]:
    """Minibatches of at most ``size`` samples (never across source batches), shuffled; (train, validation)."""
    pieces = [b.take(range(i, min(i + size, b.size))) for b in batches for i in range(0, b.size, size)]
    order = np.random.default_rng(seed).permutation(len(pieces))
    pieces = [pieces[i] for i in order]
    if len(pieces) < 2:
        return pieces, pieces  # one minibatch: it is all there is to train and to choose on
    held = max(1, round(len(pieces) * validation))
    return pieces[held:], pieces[:held]


def train_student(
    student: Student, qat: QATConfig, batches: Sequence[Batch], evaluation: Sequence[Batch], metric: Metric,
    seed: int = 0, progress: bool = True,
) -> TrainingRun:  # fmt: skip
    """Fine-tune ``student`` in place; it ends holding its best checkpoint."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    train, validation = split_minibatches(batches, qat.batch_size, qat.validation, seed)
    data = _Data(train, validation, _curve_batches(evaluation))
    teacher_constants = initializer_tensors(student.model)
    teacher = _Teacher(student, teacher_constants)
    kind = choose_loss(qat.distill.loss, metric.name, teacher(train[0]))
    optimizer, name = _optimizer(student, qat)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / qat.steps)))
    history: dict[str, list[tuple[int, float]]] = {"train": [], "validation": [], "validation_metric": [],
                                                   "metric": []}  # fmt: skip
    judge = _Judge(student, data.validation, teacher, kind, qat, metric)
    best = (judge(history, 0), 0, student.snapshot())
    _score_curve(student, data.curve, teacher, metric, history["metric"], 0)
    start, stopped, step = time.perf_counter(), "steps", 0
    bar = tqdm(total=qat.steps, desc="qat", unit="step", disable=None if progress else True, leave=False)
    rng = np.random.default_rng(seed + 1)
    order: list[int] = []
    for step in range(1, qat.steps + 1):
        order = order or list(rng.permutation(len(train)))
        batch = train[order.pop()]
        loss = _loss(student, batch, teacher, kind, qat)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        history["train"].append((step, float(loss.detach())))
        bar.update(1)
        bar.set_postfix(loss=f"{history['train'][-1][1]:.4g}")
        over = time.perf_counter() - start > qat.budget_s
        if step % qat.evaluation_interval == 0 or step == qat.steps or over:
            value = judge(history, step)
            log.info("QAT step %d/%d: validation %s %.4g, loss %.4g", step, qat.steps, metric.name,
                     history["validation_metric"][-1][1], value[1])  # fmt: skip
            if value < best[0]:
                best = (value, step, student.snapshot())
            _score_curve(student, data.curve, teacher, metric, history["metric"], step)
        if over:
            stopped = "budget"
            log.warning("QAT stopped at step %d of %d: over quantization.qat.budget_s=%gs", step, qat.steps,
                        qat.budget_s)  # fmt: skip
            break
    bar.close()
    student.restore(best[2])
    log.info("QAT: %d steps, best checkpoint at step %d (%s, %s)", step, best[1], kind, name)
    return TrainingRun(kind, name, step, best[1], stopped, time.perf_counter() - start, *(
        tuple(history[k]) for k in ("train", "validation", "validation_metric", "metric")))  # fmt: skip


class _Teacher:
    """The FP32 graph's first output for a batch (original weights), cached for the batches seen again."""

    def __init__(self, student: Student, constants: dict[str, Any]) -> None:
        self.model, self.constants = student.model, constants
        self.cache: dict[int, Any] = {}

    def __call__(self, batch: Batch, keep: bool = False) -> Any:
        import torch

        if id(batch) in self.cache:
            return self.cache[id(batch)]
        with torch.no_grad():
            env = run_graph(self.model, batch.inputs, constants=self.constants)
            out = env[self.model.graph.output[0].name].detach()
        if keep:
            self.cache[id(batch)] = out
        return out


def _loss(student: Student, batch: Batch, teacher: _Teacher, kind: str, qat: QATConfig) -> Any:
    loss = _objective(run_student(student, batch.inputs)[0], batch, teacher(batch), kind, qat)
    if not bool(loss.isfinite()):
        raise NumericsError(
            f"QAT loss became {float(loss)}; fix: lower quantization.qat.lr (now {qat.lr}) or scale_lr "
            f"(now {qat.scale_lr})"
        )
    return loss


def _objective(out: Any, batch: Batch, reference: Any, kind: str, qat: QATConfig) -> Any:
    """The training objective: distillation, mixed with cross-entropy where the batch has class labels."""
    loss = distill_loss(kind, out, reference, qat.distill.temperature)
    labelled = label_loss(out, batch.label)
    if labelled is not None:
        loss = (1 - LABEL_WEIGHT) * loss + LABEL_WEIGHT * labelled
    return loss


@dataclass(frozen=True)
class _Judge:
    """Scores a checkpoint on the validation minibatches: (metric made lower-is-better, loss), to minimise."""

    student: Student
    batches: list[Batch]
    teacher: _Teacher
    kind: str
    qat: QATConfig
    metric: Metric

    def __call__(self, history: dict[str, list[tuple[int, float]]], step: int) -> tuple[float, float]:
        import torch

        losses, mean = [], RunningMean()
        with torch.no_grad():
            for batch in self.batches:
                out = run_student(self.student, batch.inputs)[0]
                losses.append(float(_objective(out, batch, self.teacher(batch, True), self.kind, self.qat)))
                target = batch.label if batch.label is not None else self.teacher(batch, True).numpy()
                mean.add(self.metric.score(out.numpy(), target))
        loss = float(np.mean(losses))
        history["validation"].append((step, loss))
        history["validation_metric"].append((step, mean.value))
        return (-mean.value if self.metric.higher_is_better else mean.value, loss)


def _curve_batches(evaluation: Sequence[Batch]) -> list[Batch]:
    out, total = [], 0
    for batch in evaluation:
        if total >= CURVE_SAMPLES:
            break
        out.append(batch.head(CURVE_SAMPLES - total))
        total += out[-1].size
    return out


def _score_curve(
    student: Student, batches: list[Batch], teacher: _Teacher, metric: Metric, curve: list, step: int
) -> None:
    """The fake-quantized graph's metric on the held-out curve samples (against labels, else the FP32 output)."""
    import torch

    if not batches:
        return
    mean = RunningMean()
    with torch.no_grad():
        for batch in batches:
            out = run_student(student, batch.inputs)[0].detach().numpy()
            target = batch.label if batch.label is not None else teacher(batch, keep=True).numpy()
            mean.add(metric.score(out, target))
    curve.append((step, mean.value))


def _optimizer(student: Student, qat: QATConfig) -> tuple[Any, str]:
    """AdamW over the weights (``lr``) and the log step sizes (``scale_lr``); fp32 or int8 state."""
    import torch

    groups = [{"params": list(student.weights.values()), "lr": qat.lr}]
    scales = [p for p in student.log_scales.values() if p.requires_grad]
    if scales:
        groups.append({"params": scales, "lr": qat.scale_lr})
    if qat.optimizer == "int8adamw":
        from deploy_opt.train.optimizers import Int8AdamW

        return Int8AdamW(groups, lr=qat.lr, weight_decay=0.0), "Int8AdamW (block-wise int8 state)"
    return torch.optim.AdamW(groups, lr=qat.lr, weight_decay=0.0), "AdamW (fp32 state)"
