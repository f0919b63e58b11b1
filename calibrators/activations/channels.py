"""Streaming per-channel max |x| over the last axis: memory holds K floats per tensor, whatever the sample count."""

from __future__ import annotations

import numpy as np

from dopt_common.errors import CalibrationError, NumericsError


class ChannelAbsMaxObserver:
    """Accumulates the running max |x| of each channel (last axis) of each named tensor."""

    method = "channel-absmax"

    def __init__(self) -> None:
        self._absmax: dict[str, np.ndarray] = {}

    def update(self, name: str, values: np.ndarray, where: str = "") -> None:
        """Fold one batch of a tensor into its per-channel max |x|; NaN or Inf is an error naming the tensor."""
        if values.size == 0:
            return
        channels = values.shape[-1] if values.ndim else 1
        batch = np.abs(np.asarray(values).reshape(-1, channels)).max(axis=0).astype(np.float32)
        if not np.isfinite(batch).all():
            raise NumericsError(f"calibration: tensor '{name}' has NaN or Inf {where}; fix the model or the input data")
        seen = self._absmax.get(name)
        if seen is None:
            self._absmax[name] = batch
        elif seen.shape != batch.shape:
            raise CalibrationError(
                f"calibration: tensor '{name}' has {channels} channels {where} but {seen.shape[0]} before; "
                "its last axis must be fixed"
            )
        else:
            np.maximum(seen, batch, out=seen)

    def absmax(self) -> dict[str, np.ndarray]:
        """The per-channel max |x| (shape [K], float32) of every tensor seen."""
        if not self._absmax:
            raise CalibrationError("calibration saw no data; fix: data.calibration must yield at least one batch")
        return {name: value.copy() for name, value in self._absmax.items()}
