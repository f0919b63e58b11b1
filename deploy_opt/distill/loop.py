"""The distillation loop shared by QAT and pruning: pull a student towards its teacher, keep the best checkpoint.

The training batches (the calibration sample, plus ``data.train`` when given) are cut into minibatches. A share of
them (``validation``) is held out of the updates: the checkpoint with the best metric on it wins (against the
labels, else the teacher's output; ties go to the lower loss), step 0 (the start) included, so a run that only
gets worse keeps its start. The build's evaluation set is scored every ``interval`` steps for the report's curve,
never used to choose. A run over ``budget_s`` stops there and keeps its best checkpoint so far.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy_opt.data.sources import Batch
from deploy_opt.distill.losses import LABEL_WEIGHT, choose_loss, distill_loss, label_loss
from deploy_opt.evaluation.metrics import Metric, RunningMean
from dopt_common.errors import NumericsError

log = logging.getLogger(__name__)
CURVE_SAMPLES = 256  # held-out samples scored at each evaluation point (the curve only; the gate uses ORT)


@dataclass(frozen=True)
class LoopSettings:
    """What the loop reads from its config section (``quantization.qat`` or ``prune.distill``)."""

    section: str  # the config section, named in errors and logs
    steps: int
    lr: float
    batch_size: int
    optimizer: str
    loss: str
    temperature: float
    budget_s: float
    interval: int
    validation: float


@dataclass(frozen=True)
class Trainee:
    """A student being distilled: how to run it and its teacher, what to train, and its checkpoints.

    ``groups``: optimizer parameter groups (a group without ``lr`` gets the settings' lr). ``extra_loss``: called
    right after each student forward, for a term that forward prepared (hidden-state matching); None for none.
    """

    forward: Callable[[dict[str, np.ndarray]], Any]
    teacher: Callable[[dict[str, np.ndarray]], Any]
    groups: list[dict[str, Any]]
    snapshot: Callable[[], Any]
    restore: Callable[[Any], None]
    extra_loss: Callable[[], Any] | None = None


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
    metric: tuple[tuple[int, float], ...]  # the student's metric on the evaluation samples (the curve)

    def to_json(self) -> dict[str, Any]:
        """The build.json ``training`` section."""
        return {
            "loss": self.loss,
            "optimizer": self.optimizer,
            "steps": self.steps,
            "best_step": self.best_step,
            "stopped": self.stopped,
            "seconds": round(self.seconds, 1),
            "train_loss": [[s, round(v, 6)] for s, v in self.train_loss],
            "validation_loss": [[s, round(v, 6)] for s, v in self.validation_loss],
            "validation_metric": [[s, round(v, 4)] for s, v in self.validation_metric],
            "metric": [[s, round(v, 4)] for s, v in self.metric],
        }


def split_minibatches(batches: Sequence[Batch], size: int, validation: float, seed: int) -> tuple[list, list]:
    """Minibatches of at most ``size`` samples (never across source batches), shuffled; (train, validation)."""
    pieces = [b.take(range(i, min(i + size, b.size))) for b in batches for i in range(0, b.size, size)]
    order = np.random.default_rng(seed).permutation(len(pieces))
    pieces = [pieces[i] for i in order]
    if len(pieces) < 2:
        return pieces, pieces  # one minibatch: it is all there is to train and to choose on
    held = max(1, round(len(pieces) * validation))
    return pieces[held:], pieces[:held]


class _Teacher:
    """The teacher's first output for a batch, cached for the batches seen again (validation, curve)."""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], Any]) -> None:
        self.run, self.cache = run, {}

    def __call__(self, batch: Batch, keep: bool = False) -> Any:
        import torch

        if id(batch) in self.cache:
            return self.cache[id(batch)]
        with torch.no_grad():
            out = self.run(batch.inputs).detach()
        if keep:
            self.cache[id(batch)] = out
        return out


@dataclass(frozen=True)
class Lessons:
    """What a student is taught on (``batches``), and the evaluation batches and metric its curve and best
    checkpoint are judged on."""

    batches: Sequence[Batch]
    evaluation: Sequence[Batch]
    metric: Metric


def run_distillation(
    trainee: Trainee, settings: LoopSettings, lessons: Lessons, seed: int = 0, progress: bool = True
) -> TrainingRun:
    """Train ``trainee`` in place; it ends holding its best checkpoint."""
    import torch
    from tqdm import tqdm

    batches, evaluation, metric = lessons.batches, lessons.evaluation, lessons.metric
    torch.manual_seed(seed)
    train, validation = split_minibatches(batches, settings.batch_size, settings.validation, seed)
    teacher = _Teacher(trainee.teacher)
    kind = choose_loss(settings.loss, metric.name, teacher(train[0]))
    optimizer, name = _optimizer(trainee.groups, settings)
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / settings.steps)))
    history: dict[str, list[tuple[int, float]]] = {
        k: [] for k in ("train", "validation", "validation_metric", "metric")
    }
    judge = _Judge(trainee, validation, teacher, kind, settings, metric)
    curve = curve_batches(evaluation)
    best = (judge(history, 0), 0, trainee.snapshot())
    _score_curve(trainee, curve, teacher, metric, history["metric"], 0)
    start, stopped, step, order = time.perf_counter(), "steps", 0, []
    bar = tqdm(
        total=settings.steps, desc=settings.section, unit="step", disable=None if progress else True, leave=False
    )
    rng = np.random.default_rng(seed + 1)
    for step in range(1, settings.steps + 1):
        order = order or list(rng.permutation(len(train)))
        batch = train[order.pop()]
        loss = _loss(trainee, batch, teacher(batch), kind, settings)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        decay.step()
        history["train"].append((step, float(loss.detach())))
        bar.update(1)
        bar.set_postfix(loss=f"{history['train'][-1][1]:.4g}")
        over = time.perf_counter() - start > settings.budget_s
        if step % settings.interval == 0 or step == settings.steps or over:
            value = judge(history, step)
            log.info(
                "%s step %d/%d: validation %s %.4g, loss %.4g",
                settings.section,
                step,
                settings.steps,
                metric.name,
                history["validation_metric"][-1][1],
                value[1],
            )
            if value < best[0]:
                best = (value, step, trainee.snapshot())
            _score_curve(trainee, curve, teacher, metric, history["metric"], step)
        if over:
            stopped = "budget"
            log.warning(
                "%s stopped at step %d of %d: over %s.budget_s=%gs",
                settings.section,
                step,
                settings.steps,
                settings.section,
                settings.budget_s,
            )
            break
    bar.close()
    trainee.restore(best[2])
    log.info("%s: %d steps, best checkpoint at step %d (%s, %s)", settings.section, step, best[1], kind, name)
    return TrainingRun(
        kind,
        name,
        step,
        best[1],
        stopped,
        time.perf_counter() - start,
        *(tuple(history[k]) for k in ("train", "validation", "validation_metric", "metric")),
    )


def _loss(trainee: Trainee, batch: Batch, reference: Any, kind: str, settings: LoopSettings) -> Any:
    loss = _objective(trainee, batch, reference, kind, settings)[0]
    if not bool(loss.isfinite()):
        raise NumericsError(
            f"{settings.section} loss became {float(loss)}; fix: lower {settings.section}.lr (now {settings.lr})"
        )
    return loss


def _objective(trainee: Trainee, batch: Batch, reference: Any, kind: str, settings: LoopSettings) -> tuple:
    """(the training objective, the student's output): distillation, with cross-entropy where there are labels."""
    out = trainee.forward(batch.inputs)
    loss = distill_loss(kind, out, reference, settings.temperature)
    labelled = label_loss(out, batch.label)
    if labelled is not None:
        loss = (1 - LABEL_WEIGHT) * loss + LABEL_WEIGHT * labelled
    if trainee.extra_loss is not None:
        loss = loss + trainee.extra_loss()
    return loss, out


@dataclass(frozen=True)
class _Judge:
    """Scores a checkpoint on the validation minibatches: (metric made lower-is-better, loss), to minimise."""

    trainee: Trainee
    batches: list[Batch]
    teacher: _Teacher
    kind: str
    settings: LoopSettings
    metric: Metric

    def __call__(self, history: dict[str, list[tuple[int, float]]], step: int) -> tuple[float, float]:
        import torch

        losses, mean = [], RunningMean()
        with torch.no_grad():
            for batch in self.batches:
                reference = self.teacher(batch, True)
                loss, out = _objective(self.trainee, batch, reference, self.kind, self.settings)
                losses.append(float(loss))
                mean.add(self.metric.score(out.numpy(), batch.label if batch.label is not None else reference.numpy()))
        loss = float(np.mean(losses))
        history["validation"].append((step, loss))
        history["validation_metric"].append((step, mean.value))
        return (-mean.value if self.metric.higher_is_better else mean.value, loss)


def curve_batches(evaluation: Sequence[Batch]) -> list[Batch]:
    """The first ``CURVE_SAMPLES`` samples of the evaluation set."""
    out, total = [], 0
    for batch in evaluation:
        if total >= CURVE_SAMPLES:
            break
        out.append(batch.head(CURVE_SAMPLES - total))
        total += out[-1].size
    return out


def _score_curve(
    trainee: Trainee, batches: list[Batch], teacher: _Teacher, metric: Metric, curve: list, step: int
) -> None:
    """The student's metric on the evaluation curve samples (against labels, else the teacher's output)."""
    import torch

    if not batches:
        return
    mean = RunningMean()
    with torch.no_grad():
        for batch in batches:
            out = trainee.forward(batch.inputs).detach().numpy()
            target = batch.label if batch.label is not None else teacher(batch, keep=True).numpy()
            mean.add(metric.score(out, target))
    curve.append((step, mean.value))


def _optimizer(groups: list[dict[str, Any]], settings: LoopSettings) -> tuple[Any, str]:
    """AdamW over the groups; fp32 or deploy_opt's block-wise int8 state."""
    import torch

    if settings.optimizer == "int8adamw":
        from deploy_opt.train.optimizers import Int8AdamW

        return Int8AdamW(groups, lr=settings.lr, weight_decay=0.0), "Int8AdamW (block-wise int8 state)"
    return torch.optim.AdamW(groups, lr=settings.lr, weight_decay=0.0), "AdamW (fp32 state)"
