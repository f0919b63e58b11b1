"""The load stage: the torch model (if any), the input specs, the calibration sample and the evaluation head."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.build import CalibrationConfig, ExportConfig
from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec, ModelConfig
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


def load_inputs(
    model: ModelConfig, data: DataConfig, calibration_cfg: CalibrationConfig, export: ExportConfig, base: str
) -> BuildInputs:
    """Load the model source and choose the calibration sample; refuse any overlap with the evaluation data.

    ``base``: the config's folder, which relative paths start from."""
    torch_model = load_torch_model(model.factory, model.checkpoint, base) if model.factory else None
    if model.hf is not None:
        torch_model = load_hf_model(model, base)
    # a class metric's labels are checked against the ONNX file's class count before any model runs
    wanted = model.onnx and (not model.inputs or data.metric in CLASS_METRICS)
    onnx_model = check_onnx(Path(base) / str(model.onnx)) if wanted else None
    specs = model.inputs or input_specs_from_onnx(onnx_model)
    calibration = choose_calibration(calibration_cfg, data, base, specs)
    classes = None if onnx_model is None else output_classes(onnx_model)
    refuse_overlap(calibration, evaluation_ids(data, base, specs, classes))
    stream = iter_batches(data.evaluation, specs, data, base, "data.evaluation", data.eval_samples)
    head = tuple(itertools.islice(stream, max(1, export.parity_batches)))
    if not head:
        raise InputError(f"data.evaluation '{data.evaluation}' yielded no samples; fix the data function")
    return BuildInputs(torch_model, tuple(specs), calibration, head, stream)


def training_batches(data: DataConfig, base_dir: str, specs: tuple[InputSpec, ...]) -> list[Batch]:
    """``data.train``'s batches (extra training data for QAT and distillation), validated against the specs."""
    ref = data.train
    if ref is None:
        return []
    batches = list(iter_batches(ref, specs, data, base_dir, "data.train"))
    log.info("%d extra training samples from data.train", sum(b.size for b in batches))
    return batches
