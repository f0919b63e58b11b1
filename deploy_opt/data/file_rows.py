"""What a file source yields: (inputs, label) items, optionally with each sample's stratum, and dtype casting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy_opt.config.model import InputSpec
from dopt_common.errors import InputError

Item = tuple[dict[str, np.ndarray], np.ndarray | None]


@dataclass(frozen=True)
class StratifiedItem:
    """An item and each of its samples' stratum (the ``data.strata`` column), for the calibration sampler."""

    item: Item
    strata: list[Any]


def cast_array(array: np.ndarray, spec: InputSpec, file: str, what: str) -> np.ndarray:
    """``array`` as the declared dtype when it is of the same kind (float64 → float32), else an InputError."""
    wanted = np.dtype(spec.dtype)
    if array.dtype == wanted:
        return array
    if array.dtype.kind == wanted.kind or (array.dtype.kind in "iu" and wanted.kind in "iu"):
        return array.astype(wanted)
    raise InputError(
        f"{what} '{file}': array '{spec.name}' has dtype {array.dtype}, the model takes {spec.dtype}; fix: save it "
        f"as {spec.dtype}"
    )
