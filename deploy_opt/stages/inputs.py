"""The load stage: the torch model (if any), the input specs, the calibration sample and the evaluation head."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.build import BuildConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.labels import CLASS_METRICS, output_classes
from deploy_opt.data.sources import Batch, iter_batches, load_torch_model
from deploy_opt.stages.calibration_set import CalibrationSet, choose_calibration, evaluation_ids, refuse_overlap
from deploy_opt.stages.export import input_specs_from_onnx
from deploy_opt.stages.hf_model import load_hf_model
from dopt_common.errors import InputError
from exporters.onnx.checks import check_onnx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildInputs:
    """What every later stage reads: the model source, the calibration sample and the evaluation stream."""

    torch_model: Any
    specs: tuple[InputSpec, ...]
    calibration: CalibrationSet
    head: tuple[Batch, ...]  # the first evaluation batches: parity, benchmark and fixed comparison samples
    rest: Iterator[Batch]  # the remaining evaluation batches, streamed (a validation set may not fit in memory)

    def evaluation(self, hold: bool) -> list[Batch] | Iterator[Batch]:
        """The whole evaluation set: held as a list when a stage revisits it, else streamed once."""
        return [*self.head, *self.rest] if hold else itertools.chain(self.head, self.rest)


def load_inputs(config: BuildConfig) -> BuildInputs:
    """Load the model source and choose the calibration sample; refuse any overlap with the evaluation data."""
    base, model = config.base_dir, config.model
    torch_model = load_torch_model(model.factory, model.checkpoint, base) if model.factory else None
    if model.hf is not None:
        torch_model = load_hf_model(config)
    # a class metric's labels are checked against the ONNX file's class count before any model runs
    wanted = model.onnx and (not model.inputs or config.data.metric in CLASS_METRICS)
    onnx_model = check_onnx(Path(base) / str(model.onnx)) if wanted else None
    specs = model.inputs or input_specs_from_onnx(onnx_model)
    calibration = choose_calibration(config, specs)
    classes = None if onnx_model is None else output_classes(onnx_model)
    refuse_overlap(calibration, evaluation_ids(config, specs, classes))
    stream = iter_batches(config.data.evaluation, specs, config.data, base, "data.evaluation", config.data.eval_samples)
    head = tuple(itertools.islice(stream, max(1, config.export.parity_batches)))
    if not head:
        raise InputError(f"data.evaluation '{config.data.evaluation}' yielded no samples; fix the data function")
    return BuildInputs(torch_model, tuple(specs), calibration, head, stream)


def training_batches(config: BuildConfig, specs: tuple[InputSpec, ...]) -> list[Batch]:
    """``data.train``'s batches (extra training data for QAT and distillation), validated against the specs."""
    ref = config.data.train
    if ref is None:
        return []
    batches = list(iter_batches(ref, specs, config.data, config.base_dir, "data.train"))
    log.info("%d extra training samples from data.train", sum(b.size for b in batches))
    return batches
