"""Metrics on top of arg-max decoding: top-5, PSNR, and CTC character/word accuracy.

Output contracts:
- ``top5``: class scores ``[batch, classes]`` (any trailing shape flattened); 100 where the label (or the
  reference's arg-max) is among the five highest scores.
- ``psnr``: any output; peak² over the mean squared error per sample, in dB (``numerics.power_db``), with ``peak`` the
  reference's largest absolute value (an image model's 1.0 or 255 in practice); 100 dB when the two are identical.
  Higher is better.
- ``char_accuracy`` / ``word_accuracy``: a CTC recogniser's ``[batch, time, classes]`` scores (class 0 is the
  blank, as PaddleOCR, CRNN and torchaudio's CTC use it); each row is greedy-decoded (arg-max, repeats merged,
  blanks dropped). The reference is the FP32 output decoded the same way, or labels ``[batch, length]`` of class
  indices padded with negatives. Character accuracy is ``100 × (1 - edit distance / reference length)`` (at
  least 0); word accuracy is 100 when the decoded sequence equals the reference, else 0.
"""

from __future__ import annotations

import numpy as np

from deploy_opt.data.labels import check_class_labels
from deploy_opt.evaluation.numerics import power_db
from dopt_common.errors import InputError

PSNR_IDENTICAL_DB = 100.0


def top5(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """100 where the label (or the reference's arg-max) is among the five highest scores, else 0."""
    scores = prediction.reshape(prediction.shape[0], -1)
    if reference.shape == prediction.shape:
        reference = reference.reshape(reference.shape[0], -1).argmax(axis=1)
    if reference.shape != (scores.shape[0],):
        raise InputError(f"metric top5: labels have shape {reference.shape}, expected one class index per sample")
    check_class_labels(reference, "metric top5", classes=scores.shape[1])
    best = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    return (best == reference.astype(np.int64)[:, None]).any(axis=1).astype(np.float64) * 100.0


def psnr(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Peak signal-to-noise ratio per sample, in dB (the peak is the reference's largest absolute value)."""
    a = prediction.reshape(prediction.shape[0], -1).astype(np.float64)
    b = reference.reshape(reference.shape[0], -1).astype(np.float64)
    if a.shape != b.shape:
        raise InputError(f"metric psnr: output shape {a.shape} differs from reference shape {b.shape}")
    error = ((a - b) ** 2).mean(axis=1)
    peak = np.abs(b).max(axis=1)
    return np.array(
        [min(power_db(float(p) ** 2, float(e)), PSNR_IDENTICAL_DB) for p, e in zip(peak, error, strict=True)]
    )


def ctc_decode(scores: np.ndarray) -> list[list[int]]:
    """Greedy CTC decoding of ``[batch, time, classes]``: arg-max, repeats merged, blanks (class 0) dropped."""
    if scores.ndim != 3:
        raise InputError(f"CTC metrics need [batch, time, classes] scores, got shape {list(scores.shape)}")
    best = scores.argmax(axis=2)
    decoded = []
    for row in best:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        decoded.append([int(c) for c in row[keep] if c != 0])
    return decoded


def _references(prediction: np.ndarray, reference: np.ndarray) -> list[list[int]]:
    if reference.shape == prediction.shape:
        return ctc_decode(reference)
    if reference.ndim == 2 and reference.shape[0] == prediction.shape[0] and reference.dtype.kind in "iu":
        return [[int(c) for c in row if c >= 0] for row in reference]
    raise InputError(
        f"CTC metrics: the reference has shape {list(reference.shape)}; expected the model's output shape "
        f"{list(prediction.shape)} or labels [batch, length] of class indices padded with -1"
    )


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two sequences."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def char_accuracy(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per sample, 100 × (1 - edit distance / reference length), at least 0 (100 when both are empty)."""
    pairs = zip(ctc_decode(prediction), _references(prediction, reference), strict=True)
    return np.array(
        [100.0 * max(0.0, 1.0 - edit_distance(p, r) / max(len(r), 1)) if p or r else 100.0 for p, r in pairs]
    )


def word_accuracy(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per sample, 100 when the decoded sequence equals the reference's, else 0."""
    pairs = zip(ctc_decode(prediction), _references(prediction, reference), strict=True)
    return np.array([100.0 if p == r else 0.0 for p, r in pairs])


def perplexity(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """A causal LM's per-sample perplexity of its own next tokens (lower is better).

    ``prediction``: logits ``[batch, sequence, vocab]``; ``reference``: the token ids ``[batch, sequence]`` with
    padding negative (a text source gives them as labels when ``data.metric`` is ``perplexity``). Position ``t``'s
    logits score token ``t + 1``.
    """
    if prediction.ndim != 3 or reference.shape != prediction.shape[:2]:
        raise InputError(
            f"metric perplexity: logits {list(prediction.shape)} and token ids {list(reference.shape)}; expected "
            "[batch, sequence, vocab] logits and [batch, sequence] ids (text data with metric perplexity gives them)"
        )
    logits = prediction[:, :-1].astype(np.float64)
    targets = reference[:, 1:].astype(np.int64)
    shifted = logits - logits.max(axis=2, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=2, keepdims=True))
    valid = targets >= 0
    picked = np.take_along_axis(log_probs, np.maximum(targets, 0)[..., None], axis=2)[..., 0]
    counts = np.maximum(valid.sum(axis=1), 1)
    return np.exp(-(picked * valid).sum(axis=1) / counts)
