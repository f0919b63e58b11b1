"""Choosing the calibration samples: stratified over labels (or a user key), seeded, disjoint from evaluation.

The calibration source is read twice at most, never held whole: a first pass records each sample's stratum and
id, the sampler picks ``calibration.samples`` of them, and a second pass keeps only those rows (skipped when the
whole source fits in the sample budget). A data function must therefore yield the same samples when called
again; a changed id on the second pass is an error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibrators.sampling import Selection, check_disjoint, stratified_sample
from deploy_opt.config.build import CalibrationConfig
from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.sources import Batch, call_user, iter_batches, resolve_callable, sample_ids, select_rows
from dopt_common.errors import CalibrationError

log = logging.getLogger(__name__)
KeyFn = Callable[[dict[str, np.ndarray], Any], Hashable]


@dataclass(frozen=True)
class CalibrationSet:
    """The chosen calibration batches and how they were chosen."""

    batches: list[Batch]
    selection: Selection
    stratify: str
    candidates: int

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "stratify": self.stratify,
            "candidates": self.candidates,
            "chosen": len(self.selection.indices),
            "per_stratum": self.selection.counts,
            "available_per_stratum": self.selection.available,
            "sample_hash": self.selection.sample_hash,
            "warnings": list(self.selection.warnings),
        }


def _key_function(cal: CalibrationConfig, base_dir: str, label: np.ndarray | None) -> tuple[str, KeyFn]:
    """What a sample's stratum is: its label, nothing, or a user function of (inputs, label).

    ``auto`` stratifies by the label only when it is one class per sample (integer, boolean or string). A
    sequence label (a text line's characters) or a float target has no classes to balance, so it means none.
    """
    stratify = cal.stratify
    has_labels = label is not None
    if stratify == "auto":
        is_class = label is not None and label.ndim == 1 and label.dtype.kind in "iubUSO"
        stratify = "label" if is_class else "none"
    if stratify == "none":
        return stratify, lambda inputs, label: "all"
    if stratify == "label":
        if not has_labels:
            raise CalibrationError(
                "calibration.stratify is 'label' but data.calibration yields no labels; fix: use "
                "stratify: none, a 'module:function' key, or return labels"
            )
        return stratify, _label_key
    func = resolve_callable(stratify, base_dir, "calibration.stratify")
    return stratify, func


def _label_key(inputs: dict[str, np.ndarray], label: Any) -> Hashable:
    value = np.asarray(label)
    if value.ndim != 0:
        raise CalibrationError(
            f"calibration.stratify 'label' needs one class per sample, got labels of shape {value.shape}; fix: "
            "use stratify: none or a 'module:function' key"
        )
    return value.item()


def _stratum_keys(batch: Batch, key_fn: KeyFn, stratify: str) -> list[Hashable]:
    """The stratum of each sample of a batch; a failing user key function names itself."""
    if stratify.startswith("data.strata") and batch.strata is not None:
        return list(batch.strata)
    keys = []
    for i in range(batch.size):
        inputs = {k: v[i] for k, v in batch.inputs.items()}
        label = None if batch.label is None else batch.label[i]
        keys.append(call_user(functools.partial(key_fn, inputs, label), f"calibration.stratify '{stratify}'"))
    return keys


def choose_calibration(
    cal: CalibrationConfig, data: DataConfig, base_dir: str, specs: tuple[InputSpec, ...]
) -> CalibrationSet:
    """Read the calibration source and pick a stratified, seeded sample of ``calibration.samples``; ``base_dir``:
    the config's folder, which ``data``'s relative paths start from."""
    ref = data.calibration
    keys: list[Hashable] = []
    ids: list[str] = []
    kept: list[Batch] | None = []
    stratify, key_fn = "", None
    for batch in iter_batches(ref, specs, data, base_dir, "data.calibration"):
        if key_fn is None and batch.strata is not None and cal.stratify == "auto":
            stratify, key_fn = f"data.strata '{data.strata}'", _label_key  # the named column's values
        if key_fn is None:
            stratify, key_fn = _key_function(cal, base_dir, batch.label)
        keys.extend(_stratum_keys(batch, key_fn, stratify))
        ids.extend(sample_ids(batch))
        if kept is not None:
            kept.append(batch)
            if len(ids) > cal.samples:
                kept = None  # too big to hold: the second pass keeps only the chosen rows
    if not ids:
        raise CalibrationError(f"calibration data is empty: data.calibration '{ref}' yielded no samples; fix it")
    selection = stratified_sample(
        keys, cal.samples, ids=ids, mode=cal.mode, min_per_stratum=cal.min_per_stratum, seed=cal.seed
    )
    if kept is not None:
        batches = select_rows(kept, set(selection.indices))
    else:
        batches = _second_pass(data, base_dir, specs, selection, ids)
    log.info(
        "calibration: %d of %d samples, stratified by %s: %s",
        len(selection.indices),
        len(ids),
        stratify,
        selection.counts,
    )
    return CalibrationSet(batches, selection, stratify, len(ids))


def _second_pass(
    data: DataConfig, base_dir: str, specs: tuple[InputSpec, ...], selection: Selection, ids: list[str]
) -> list[Batch]:
    """Read the source again, keeping the chosen rows; they must be the samples the first pass saw."""
    source = iter_batches(data.calibration, specs, data, base_dir, "data.calibration")
    batches = select_rows(source, set(selection.indices))
    if [i for b in batches for i in sample_ids(b)] != [ids[i] for i in selection.indices]:
        raise CalibrationError(
            f"data.calibration '{data.calibration}' yielded different samples when called again; "
            "fix: make it deterministic (fixed order, no random augmentation)"
        )
    return batches


def evaluation_ids(
    data: DataConfig, base_dir: str, specs: tuple[InputSpec, ...], classes: int | None = None
) -> list[str]:
    """The id of every evaluation sample (one light pass over the evaluation source, no inference); with the
    model's ``classes`` known, a class metric's labels past them are refused here, before any model runs."""
    ref = data.evaluation
    batches = iter_batches(ref, specs, data, base_dir, "data.evaluation", data.eval_samples, classes)
    return [i for b in batches for i in sample_ids(b)]


def refuse_overlap(calibration: CalibrationSet, evaluation: list[str]) -> None:
    """Calibrating on evaluation samples hides accuracy loss: refuse it."""
    check_disjoint((i for b in calibration.batches for i in sample_ids(b)), evaluation)
