"""Distillation losses: the student's output pulled towards the FP32 graph's own output (no labels needed).

``kl`` treats the last axis as class scores. An output that already is a probability distribution (a model that
ends in Softmax, such as PaddleOCR's recogniser) is compared as probabilities, not softened again. Labels join
the loss (cross-entropy, weight ``LABEL_WEIGHT``) only where they are class indices of the output's last axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABEL_WEIGHT = 0.5
_EPS = 1e-8


def choose_loss(configured: str, metric: str, teacher: Any) -> str:
    """The loss for ``auto``: kl for class scores and probabilities, cosine for embeddings, else mse."""
    if configured != "auto":
        return configured
    if metric == "top1" or is_distribution(teacher):
        return "kl"
    return "cosine" if metric == "cosine" else "mse"


def is_distribution(output: Any) -> bool:
    """Whether ``output``'s last axis already holds probabilities (non-negative, summing to 1)."""
    import torch

    if output.dim() == 0 or output.shape[-1] < 2 or not output.is_floating_point():
        return False
    if bool((output < 0).any()):
        return False
    return bool(torch.allclose(output.sum(dim=-1), torch.ones((), dtype=output.dtype), atol=1e-3))


def distill_loss(kind: str, student: Any, teacher: Any, temperature: float = 1.0) -> Any:
    """One scalar: how far ``student`` is from ``teacher`` (both the graph's first output, batch first)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 (torch's own convention)

    student, teacher = student.float(), teacher.float().detach()
    if kind == "mse":
        return F.mse_loss(student, teacher) / teacher.pow(2).mean().clamp_min(_EPS)
    if kind == "cosine":
        flat_s, flat_t = student.reshape(student.shape[0], -1), teacher.reshape(teacher.shape[0], -1)
        return (1.0 - F.cosine_similarity(flat_s, flat_t, dim=1, eps=_EPS)).mean()
    if kind != "kl":
        raise ValueError(f"unknown distillation loss {kind!r}")
    if is_distribution(teacher):
        log_s = torch.log(student.clamp_min(_EPS) / student.clamp_min(_EPS).sum(-1, keepdim=True))
        log_t = torch.log(teacher.clamp_min(_EPS))
    else:
        log_s = F.log_softmax(student / temperature, dim=-1)
        log_t = F.log_softmax(teacher / temperature, dim=-1)
    per_row = (log_t.exp() * (log_t - log_s)).sum(-1)
    return per_row.mean() * temperature**2


def label_loss(student: Any, label: np.ndarray | None) -> Any | None:
    """Cross-entropy to integer class labels, or None where the labels are not class indices of the output."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    if label is None or student.dim() != 2 or label.ndim != 1 or label.dtype.kind not in "iu":
        return None
    if label.shape[0] != student.shape[0] or label.min() < 0 or label.max() >= student.shape[1]:
        return None
    if is_distribution(student.detach()):
        return F.nll_loss(torch.log(student.float().clamp_min(_EPS)), torch.from_numpy(label.astype(np.int64)))
    return F.cross_entropy(student.float(), torch.from_numpy(label.astype(np.int64)))
