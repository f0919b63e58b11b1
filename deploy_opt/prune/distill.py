"""Distil the pruned student from the unpruned teacher: outputs, and optionally block outputs (hidden states).

Hidden states are read from the model's repeated blocks (the longest ``ModuleList``/``Sequential`` of one block
class: transformer layers, residual stages). Where pruning narrowed a block's output, a learned linear projection
maps the student's channels onto the teacher's; it trains with the student and is discarded. The hidden term is a
training-only term: the best checkpoint is chosen on the output metric alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy_opt.config.prune import PruneDistillConfig
from deploy_opt.data.sources import Batch
from deploy_opt.distill.loop import Lessons, LoopSettings, Trainee, TrainingRun, run_distillation
from deploy_opt.evaluation.metrics import Metric, RunningMean
from deploy_opt.prune.importance import ordered_tensors

log = logging.getLogger(__name__)


def first_output(result: Any) -> Any:
    """A model's first output tensor (from a tensor, a tuple/list or a dict)."""
    if isinstance(result, dict):
        result = next(iter(result.values()))
    while isinstance(result, (tuple, list)):
        result = result[0]
    return result


def run_model(model: Any, inputs: dict, names: Sequence[str]) -> Any:
    """The model's first output for a batch of named arrays."""
    return first_output(model(*ordered_tensors(inputs, names)))


def reference_targets(original: Any, batches: Sequence[Batch], names: Sequence[str]) -> list[Any]:
    """What each batch is scored against: its labels, else the original model's output (computed once)."""
    import torch

    with torch.no_grad():
        return [b.label if b.label is not None else run_model(original, b.inputs, names).numpy() for b in batches]


def score_model(
    model: Any, batches: Sequence[Batch], targets: Sequence[Any], metric: Metric, names: Sequence[str]
) -> float | None:
    """The metric of ``model`` over ``batches`` against :func:`reference_targets`; None without batches."""
    import torch

    mean = RunningMean()
    with torch.no_grad():
        for batch, target in zip(batches, targets, strict=True):
            mean.add(metric.score(run_model(model, batch.inputs, names).numpy(), target))
    return mean.value if batches else None


def find_blocks(model: Any) -> list[str]:
    """Names of the modules in the model's longest run of same-class blocks (empty when there is none)."""
    import torch

    best: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module) >= 2:
            kinds = {type(child) for child in module}
            if len(kinds) == 1 and len(module) > len(best):
                best = [f"{name}.{i}" if name else str(i) for i in range(len(module))]
    return best


class _Hidden:
    """Captures block outputs of teacher and student; the projected, normalised MSE between them."""

    def __init__(self, student: Any, teacher: Any, blocks: list[str], sample: Any) -> None:
        import torch

        self.captured: dict[str, dict[str, Any]] = {"student": {}, "teacher": {}}
        self.handles = []
        for role, model in (("student", student), ("teacher", teacher)):
            modules = dict(model.named_modules())
            self.handles += [modules[b].register_forward_hook(self._hook(role, b)) for b in blocks]
        with torch.no_grad():
            student(*sample), teacher(*sample)
        self.projections = torch.nn.ModuleDict()
        for index, block in enumerate(blocks):
            s, t = self.captured["student"][block], self.captured["teacher"][block]
            axis = -1 if s.dim() == 3 else 1
            if s.shape[axis] != t.shape[axis]:
                self.projections[str(index)] = torch.nn.Linear(s.shape[axis], t.shape[axis], bias=False)
        self.blocks = blocks

    def _hook(self, role: str, block: str) -> Any:
        def capture(_module: Any, _inputs: Any, output: Any) -> None:
            self.captured[role][block] = first_output(output)

        return capture

    def loss(self) -> Any:
        import torch

        if not torch.is_grad_enabled():  # validation: the checkpoint is chosen on the output alone
            return torch.zeros(())
        terms = []
        for index, block in enumerate(self.blocks):
            s, t = self.captured["student"][block].float(), self.captured["teacher"][block].float().detach()
            projection = self.projections[str(index)] if str(index) in self.projections else None
            if projection is not None:
                s = projection(s) if s.dim() == 3 else projection(s.movedim(1, -1)).movedim(-1, 1)
            terms.append((s - t).pow(2).mean() / t.pow(2).mean().clamp_min(1e-8))
        return torch.stack(terms).mean()


@dataclass(frozen=True)
class DistillData:
    """What distillation reads: the model's input names (in forward order), the training batches, and the
    evaluation batches and metric its curve and best checkpoint are judged on."""

    names: Sequence[str]
    batches: Sequence[Batch]
    evaluation: Sequence[Batch]
    metric: Metric


def distill_student(
    student: Any,
    teacher: Any,
    distill: PruneDistillConfig,
    data: DistillData,
    seed: int = 0,
    progress: bool = True,
    fresh: bool = False,
) -> TrainingRun:
    """Train ``student`` in place towards ``teacher``; it ends holding its best checkpoint.

    The student trains in eval mode (no dropout; batch-norm statistics stay the trained ones), except a ``fresh``
    (randomly initialised) student, whose batch norms must learn their statistics.
    """
    import torch

    names, batches = data.names, data.batches
    student.train(fresh), teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    blocks = find_blocks(student) if distill.hidden else []
    if distill.hidden and not blocks:
        log.warning("prune.distill.hidden: no repeated blocks found; distilling the outputs only")
    hidden = _Hidden(student, teacher, blocks, ordered_tensors(batches[0].head(2).inputs, names)) if blocks else None
    params = [p for p in student.parameters() if p.requires_grad]
    groups = [{"params": params}]
    if hidden is not None and len(hidden.projections):
        groups.append({"params": list(hidden.projections.parameters()), "lr": 1e-3})
    extra = None if hidden is None else (lambda: distill.hidden_weight * hidden.loss())

    def snapshot() -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in student.state_dict().items()}

    def teacher_output(inputs: dict) -> Any:
        with torch.no_grad():
            return run_model(teacher, inputs, names)

    trainee = Trainee(
        lambda inputs: run_model(student, inputs, names),
        teacher_output,
        groups,
        snapshot,
        student.load_state_dict,
        extra,
    )
    lr = distill.lr if distill.lr != "auto" else (1e-4 if _has_layer_norm(student) else 1e-3)
    settings = LoopSettings(
        "prune.distill",
        distill.steps,
        lr,
        distill.batch_size,
        distill.optimizer,
        distill.loss,
        distill.temperature,
        distill.budget_s,
        distill.evaluation_interval,
        distill.validation,
    )
    try:
        return run_distillation(trainee, settings, Lessons(batches, data.evaluation, data.metric), seed, progress)
    finally:
        for handle in hidden.handles if hidden is not None else ():
            handle.remove()


def _has_layer_norm(model: Any) -> bool:
    import torch

    return any(isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) for m in model.modules())
