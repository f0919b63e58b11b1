"""QAT's use of the distillation loop (``deploy_opt/distill/loop.py``): the fake-quantized graph is the student, the
FP32 graph with its original weights the teacher. Weights train at ``lr``, the log step sizes at ``scale_lr``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deploy_opt.config.qat import QATConfig
from deploy_opt.distill.loop import Lessons, LoopSettings, Trainee, TrainingRun, run_distillation, split_minibatches
from deploy_opt.onnx_torch import initializer_tensors, run_graph
from deploy_opt.qat.student import Student, run_student

__all__ = ["TrainingRun", "qat_settings", "split_minibatches", "train_student"]


def qat_settings(qat: QATConfig) -> LoopSettings:
    """The loop's settings from the ``quantization.qat`` section (``budget_s`` as the QAT stage set it: an
    automatic fine-tune's is bounded there, ``pipeline/qat.py``)."""
    return LoopSettings(
        "quantization.qat",
        qat.steps,
        qat.lr,
        qat.batch_size,
        qat.optimizer,
        qat.distill.loss,
        qat.distill.temperature,
        qat.budget_s,
        qat.evaluation_interval,
        qat.validation,
    )


def train_student(
    student: Student, qat: QATConfig, lessons: Lessons, seed: int = 0, progress: bool = True
) -> TrainingRun:
    """Fine-tune ``student`` in place; it ends holding its best checkpoint."""
    constants = initializer_tensors(student.model)
    first_output = student.model.graph.output[0].name

    def teacher(inputs: dict[str, np.ndarray]) -> Any:
        return run_graph(student.model, inputs, constants=constants)[first_output]

    groups = [{"params": list(student.weights.values()), "lr": qat.lr}]
    scales = [p for p in student.log_scales.values() if p.requires_grad]
    if scales:
        groups.append({"params": scales, "lr": qat.scale_lr})
    trainee = Trainee(
        lambda inputs: run_student(student, inputs)[0], teacher, groups, student.snapshot, student.restore
    )
    return run_distillation(trainee, qat_settings(qat), lessons, seed, progress)
