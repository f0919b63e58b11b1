"""Metrics: per-sample scores, averaged over the evaluation set.

Every built-in metric is in points: ``top1`` is accuracy in percent, ``cosine`` is the mean cosine
similarity × 100, so a drop of 1.0 is one percentage point (0.01 cosine) for both. ``mse`` is lower-is-better;
its drop is the increase in error. ``detection_f1`` is a YOLO detector's per-image F1 (× 100) against the reference
detections (``detection.py``). ``top5``, ``psnr`` (dB) and a CTC recogniser's ``char_accuracy`` and
``word_accuracy`` (points) are in ``sequence_metrics.py``, with their output contracts. A custom
``module:function`` metric takes ``(prediction, reference)`` arrays of one batch and returns per-sample scores
(or one float for the batch); higher is better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deploy_opt.data.labels import check_class_labels
from deploy_opt.data.sources import resolve_callable, user_code
from deploy_opt.evaluation.detection import detection_f1, detection_map50
from deploy_opt.evaluation.sequence_metrics import char_accuracy, perplexity, psnr, top5, word_accuracy
from dopt_common.errors import InputError

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def top1(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """100 where the arg-max class equals the label (or the reference's arg-max), else 0."""
    predicted = prediction.reshape(prediction.shape[0], -1).argmax(axis=1)
    if reference.ndim == prediction.ndim and reference.shape == prediction.shape:
        reference = reference.reshape(reference.shape[0], -1).argmax(axis=1)
    if reference.shape != predicted.shape:
        raise InputError(
            f"metric top1: labels have shape {reference.shape}, expected one class index per sample "
            f"({predicted.shape}); fix the data function or pick another metric"
        )
    check_class_labels(reference, "metric top1", classes=int(np.prod(prediction.shape[1:])))
    return (predicted == reference.astype(np.int64)).astype(np.float64) * 100.0


def cosine(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine similarity × 100 per sample, over the flattened output."""
    a = prediction.reshape(prediction.shape[0], -1).astype(np.float64)
    b = reference.reshape(reference.shape[0], -1).astype(np.float64)
    if a.shape != b.shape:
        raise InputError(f"metric cosine: output shape {a.shape} differs from reference shape {b.shape}")
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    same = np.all(a == b, axis=1)
    score = np.where(denom > 0, (a * b).sum(axis=1) / np.maximum(denom, 1e-300), 0.0)
    return np.where(same, 1.0, score) * 100.0


def mse(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Mean squared error per sample."""
    a = prediction.reshape(prediction.shape[0], -1).astype(np.float64)
    b = reference.reshape(reference.shape[0], -1).astype(np.float64)
    if a.shape != b.shape:
        raise InputError(f"metric mse: output shape {a.shape} differs from reference shape {b.shape}")
    return ((a - b) ** 2).mean(axis=1)


BUILTIN: dict[str, tuple[ScoreFn, bool]] = {
    "top1": (top1, True),
    "top5": (top5, True),
    "cosine": (cosine, True),
    "mse": (mse, False),
    "psnr": (psnr, True),
    "detection_f1": (detection_f1, True),
    "detection_map50": (detection_map50, True),
    "char_accuracy": (char_accuracy, True),
    "word_accuracy": (word_accuracy, True),
    "perplexity": (perplexity, False),
}


@dataclass(frozen=True)
class Metric:
    """A named scoring function and its direction."""

    name: str
    score: ScoreFn
    higher_is_better: bool

    def drop(self, baseline: float, candidate: float) -> float:
        """How much worse ``candidate`` is than ``baseline``, in metric points (positive = worse)."""
        return baseline - candidate if self.higher_is_better else candidate - baseline


def resolve_metric(name: str, base_dir: str | Path = ".") -> Metric:
    """A built-in metric by name, or a custom one from ``module:function``."""
    if name in BUILTIN:
        fn, higher = BUILTIN[name]
        return Metric(name, fn, higher)
    if ":" not in name:
        raise InputError(f"data.metric '{name}' is unknown; use one of {', '.join(BUILTIN)} or 'module:function'")
    fn = resolve_callable(name, base_dir, "data.metric")
    return Metric(name, _per_sample(fn, name), True)


def _per_sample(fn: Callable[..., object], name: str) -> ScoreFn:
    """The user's metric as per-sample scores; one that raises or returns no finite number is an InputError."""

    def score(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
        # The user's code: any failure, sys.exit() included, is bad input (exit 2), never an internal error.
        with user_code(f"data.metric '{name}'", error=InputError):
            returned = fn(prediction, reference)
        try:
            value = np.asarray(returned, dtype=np.float64)
        except (TypeError, ValueError):
            value = None
        if value is None or not np.isfinite(value).all():
            shown = repr(returned) if value is None else "NaN or Inf"
            raise InputError(
                f"data.metric '{name}' returned {shown[:80]}, not finite numbers; fix that function to return a "
                "number per batch or per sample"
            )
        return np.full(prediction.shape[0], float(value)) if value.ndim == 0 else value.reshape(-1)

    return score


class RunningMean:
    """Streaming mean of per-sample scores, so evaluation holds one batch at a time."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, scores: np.ndarray) -> None:
        """Add one batch of scores."""
        self.total += float(np.sum(scores))
        self.count += int(np.size(scores))

    @property
    def value(self) -> float:
        """The mean so far (NaN before any score)."""
        return self.total / self.count if self.count else float("nan")
