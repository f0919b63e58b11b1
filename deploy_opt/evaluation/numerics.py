"""SQNR, noise in dB and cosine: one definition and one convention for every report.

- :func:`power_db` is the definition: ``10·log10(signal power / noise power)``, in dB, higher is better.
- **No noise is +inf**, never a large finite number from a floor: identical tensors rank as the least sensitive,
  and ``10 ** (-db / 10)`` turns them back into zero noise.
- **JSON has no infinity** (records are written with ``allow_nan=False``): a record stores :func:`json_db`,
  which writes +inf (and NaN) as ``null``, read as "no error measured".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TINY_POWER = 1e-30  # a signal of zero power: the SQNR of any noise against it is then very low, not undefined


def power_db(signal: float, noise: float) -> float:
    """``10·log10(signal / noise)`` from accumulated powers; +inf when there is no noise."""
    if noise <= 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, TINY_POWER) / noise)


def noise_db(relative_noise: float) -> float:
    """A noise power relative to its signal (noise / signal) as an SQNR in dB; +inf for zero noise."""
    return power_db(1.0, relative_noise)


def relative_noise(db: float | None) -> float:
    """The inverse of :func:`noise_db`: an SQNR back to noise power relative to the signal (0 for None or inf)."""
    return 0.0 if db is None or math.isinf(db) else 10.0 ** (-db / 10.0)


def sqnr_db(reference: Any, test: Any) -> float:
    """The SQNR of ``test`` against ``reference`` (arrays of one size, compared in float64); +inf when equal."""
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(test, dtype=np.float64).ravel()
    return power_db(float(a @ a), float((a - b) @ (a - b)))


def cosine_similarity(reference: Any, test: Any) -> float:
    """Cosine similarity of two flattened arrays; 1.0 when both are all zeros, 0.0 when only one is."""
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(test, dtype=np.float64).ravel()
    norms = math.sqrt(float(a @ a) * float(b @ b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(a @ b) / norms


def json_db(value: float | None, digits: int | None = 4) -> float | None:
    """A dB figure as a JSON record stores it: ``None`` for +inf (no noise), NaN or None, else rounded to
    ``digits`` (``None``: exact, for a figure others are derived from)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value) if digits is None else round(float(value), digits)
