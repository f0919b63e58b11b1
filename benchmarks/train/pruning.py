"""What the pruning benchmarks share: a build config's data, metric and model, and a pruned copy of the model.

``prune_variants.py`` and ``prune_vs_scratch.py`` both prune as the build's prune stage does (importance on the
training batches, the cut on a two-sample example) and score in torch on the evaluation set.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from deploy_opt.config.profiles import load_build_config
from deploy_opt.evaluation.metrics import resolve_metric
from deploy_opt.prune.distill import DistillData, reference_targets, run_model
from deploy_opt.prune.importance import choose_importance, clear_gradients, ordered_tensors
from deploy_opt.prune.structure import prune_structure
from deploy_opt.stages.inputs import load_inputs, training_batches


@dataclass(frozen=True)
class Setup:
    """One build config's pruning inputs: the config, input names, training and evaluation batches, the metric and
    the unpruned model (eval mode)."""

    config: Any
    names: list[str]
    train: list[Any]
    evaluation: list[Any]
    metric: Any
    original: Any

    def scored(self) -> tuple[Any, ...]:
        """``score_model``'s arguments after the model: evaluation data, the unpruned model's targets, metric, names."""
        return (self.evaluation, reference_targets(self.original, self.evaluation, self.names), self.metric, self.names)

    def data(self) -> DistillData:
        """The distillation data: the training batches, scored on the evaluation set."""
        return DistillData(self.names, self.train, self.evaluation, self.metric)


def load_setup(config_path: str, overrides: list[str], with_training_data: bool) -> Setup:
    """The config with ``overrides``; training batches are the calibration batches, plus the config's training
    data when ``with_training_data``."""
    config, _ = load_build_config(config_path, None, overrides)
    inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
    metric = resolve_metric(config.data.metric, config.base_dir)
    evaluation = inputs.evaluation(hold=True)
    names = [s.name for s in inputs.specs]
    train = list(inputs.calibration.batches)
    if with_training_data:
        train = [*train, *training_batches(config.data, config.base_dir, inputs.specs)]
    return Setup(config, names, train, evaluation, metric, inputs.torch_model.eval())


def pruned_copy(setup: Setup, trainable: bool) -> Any:
    """A copy of the unpruned model cut by the config's ``prune`` section (``trainable``: its parameters set to
    require gradients first), gradients cleared."""
    student = copy.deepcopy(setup.original)
    if trainable:
        for p in student.parameters():
            p.requires_grad_(True)
    forward = _Forward(setup.names)
    importance = choose_importance(setup.config.prune.method, student, setup.train, forward, 0)
    example = ordered_tensors(setup.train[0].head(2).inputs, setup.names)
    prune_structure(student, example, setup.config.prune, importance)
    clear_gradients(student)
    return student


@dataclass(frozen=True)
class _Forward:
    names: list[str]

    def __call__(self, model: Any, inputs: Any) -> Any:
        return run_model(model, inputs, self.names)
