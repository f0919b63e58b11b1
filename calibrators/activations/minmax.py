"""Streaming min/max ranges: memory holds two floats per tensor, whatever the sample count."""

from __future__ import annotations

import numpy as np

from dopt_common.errors import CalibrationError, NumericsError


class MinMaxObserver:
    """Accumulates the running minimum and maximum of each named tensor."""

    method = "minmax"

    def __init__(self, magnitude: set[str] | frozenset[str] = frozenset()) -> None:
        self._low: dict[str, float] = {}
        self._high: dict[str, float] = {}
        # min |x| of these tensors: ORT's symmetric percentile bins |x| over [min |x|, max |x|].
        self._magnitude = set(magnitude)
        self.last = (0.0, 0.0)
        self._floor: dict[str, float] = {}

    def update(self, name: str, values: np.ndarray, where: str = "") -> None:
        """Fold one batch of a tensor into its range; NaN or Inf is an error naming the tensor."""
        if values.size == 0:
            return
        low, high = float(np.min(values)), float(np.max(values))
        self.last = (low, high)  # this batch's bounds, for subclasses that bin the same values
        if not (np.isfinite(low) and np.isfinite(high)):
            raise NumericsError(f"calibration: tensor '{name}' has NaN or Inf {where}; fix the model or the input data")
        self._low[name] = min(low, self._low.get(name, low))
        self._high[name] = max(high, self._high.get(name, high))
        if name in self._magnitude:
            floor = float(np.min(np.abs(values)))
            self._floor[name] = min(floor, self._floor.get(name, floor))

    def magnitude_floors(self) -> dict[str, float]:
        """min |x| of each tensor named at construction."""
        return dict(self._floor)

    def ranges(self) -> dict[str, tuple[float, float]]:
        """The (min, max) of every tensor seen."""
        if not self._low:
            raise CalibrationError("calibration saw no data; fix: data.calibration must yield at least one batch")
        return {name: (self._low[name], self._high[name]) for name in self._low}
