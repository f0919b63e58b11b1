"""How sure a number is: paired bootstrap intervals for the accuracy drop and the speedup, the metric's
resolution, and the seeded split of the evaluation data into a decision part and a judged part.

A search that chose among trials on some samples reports a number biased in its own favour on those samples;
the gate judges on samples nothing was tuned on. A drop measured on 8 samples, or a speedup timed while the
machine was busy, is shown with the interval that says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_ROUNDS = 1000
# Below this many scored samples an accuracy drop is not judged: one sample moves a top-1 by 100 points.
MIN_JUDGED_SAMPLES = 8
# A speedup interval wider than this share of its point estimate is timing noise, not a measurement.
NOISY_WIDTH = 0.25


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% bootstrap interval."""

    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        """Plain data for build.json."""
        return {"value": self.value, "ci95_low": self.low, "ci95_high": self.high}

    @property
    def relative_width(self) -> float:
        """(high - low) / |value|; infinite for a zero value."""
        return (self.high - self.low) / abs(self.value) if self.value else math.inf

    def text(self, spec: str = ".3f", suffix: str = "") -> str:
        """``1.234 (95% CI 1.100-1.300)``."""
        return f"{self.value:{spec}}{suffix} (95% CI {self.low:{spec}}-{self.high:{spec}}{suffix})"


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def drop_interval(
    baseline: np.ndarray, candidate: np.ndarray, higher_is_better: bool, seed: int = 0, rounds: int = BOOTSTRAP_ROUNDS
) -> Interval:
    """The drop (baseline mean - candidate mean, sign by direction) with a paired bootstrap 95% interval: the
    same resampled samples score both models, so what the samples share cancels."""
    a, b = np.asarray(baseline, dtype=np.float64).ravel(), np.asarray(candidate, dtype=np.float64).ravel()
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired scores differ in count ({a.size} vs {b.size}) or are empty")
    sign = 1.0 if higher_is_better else -1.0
    diff = sign * (a - b)
    picks = np.random.default_rng(seed).integers(0, diff.size, size=(rounds, diff.size))
    low, high = _percentiles(diff[picks].mean(axis=1))
    return Interval(float(diff.mean()), low, high)


def perplexity_increase_interval(
    original: Sequence[Sequence[float]],
    quantized: Sequence[Sequence[float]],
    seed: int = 0,
    rounds: int = BOOTSTRAP_ROUNDS,
) -> Interval:
    """The relative perplexity increase, quantized over original, with a paired bootstrap 95% interval over the
    evaluation windows: each window is ``(summed NLL, scored tokens)``, the same windows in both lists, and a
    resample scores both models on the same windows (what a window's text does to both cancels)."""
    a, b = np.asarray(original, dtype=np.float64), np.asarray(quantized, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] != 2 or a.shape[0] == 0:
        raise ValueError(f"per-window scores differ in shape ({a.shape} vs {b.shape}) or are empty")
    if not np.array_equal(a[:, 1], b[:, 1]):
        raise ValueError("the two models were scored on different windows (token counts differ)")
    picks = np.random.default_rng(seed).integers(0, a.shape[0], size=(rounds, a.shape[0]))
    tokens = a[:, 1][picks].sum(axis=1)
    gaps = (b[:, 0][picks].sum(axis=1) - a[:, 0][picks].sum(axis=1)) / tokens
    low, high = _percentiles(np.expm1(gaps))
    value = math.expm1((b[:, 0].sum() - a[:, 0].sum()) / a[:, 1].sum())
    return Interval(float(value), low, high)


def standard_error(drops: np.ndarray) -> float:
    """The standard error of a mean drop from its per-sample values (0 for fewer than two samples)."""
    return float(np.std(drops, ddof=1) / np.sqrt(drops.size)) if drops.size > 1 else 0.0


def speedup_interval(
    fp32_ms: Sequence[float], int8_ms: Sequence[float], seed: int = 0, rounds: int = BOOTSTRAP_ROUNDS
) -> Interval:
    """FP32 median / INT8 median with a 95% interval from resampling the interleaved rounds as pairs."""
    a, b = np.asarray(fp32_ms, dtype=np.float64), np.asarray(int8_ms, dtype=np.float64)
    count = min(a.size, b.size)
    a, b = a[:count], b[:count]
    picks = np.random.default_rng(seed).integers(0, count, size=(rounds, count))
    ratios = np.median(a[picks], axis=1) / np.median(b[picks], axis=1)
    low, high = _percentiles(ratios)
    return Interval(float(np.median(a) / np.median(b)), low, high)


def resolution(scores: Sequence[np.ndarray], right_or_wrong: bool = False) -> float | None:
    """How far one sample moves the mean, when scores are discrete (two values, e.g. top-1's 0 and 100):
    (max - min) / samples. None for a continuous score (cosine, F1 per image), where no single step exists.
    ``right_or_wrong``: the metric scores 0 or 100 per sample (top1), even where every sample scored alike."""
    flat = np.concatenate([np.asarray(s, dtype=np.float64).ravel() for s in scores]) if scores else np.zeros(0)
    distinct = np.unique(flat)
    count = max(np.asarray(scores[0]).size, 1) if scores else 1
    if right_or_wrong:
        return 100.0 / count
    return float(distinct.max() - distinct.min()) / count if distinct.size == 2 else None


def split_indices(total: int, seed: int) -> tuple[set[int], set[int]]:
    """A seeded half of ``total`` samples to decide on and the other half to judge on (the judged half gets the
    odd one). Fewer than two samples cannot be split: all of them are judged and none decide."""
    if total < 2:
        return set(), set(range(total))
    order = np.random.default_rng(seed).permutation(total)
    return set(order[: total // 2].tolist()), set(order[total // 2 :].tolist())
