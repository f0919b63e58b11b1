"""How much each structure matters: L2 magnitude, or first-order Taylor with RMS gradients over real data.

``taylor`` scores a weight by |w| times the root mean square of its gradient over minibatches of the calibration
data (a Fisher-style estimate, so gradients of opposite sign do not cancel). The loss is cross-entropy where the
batch has class labels; otherwise a random projection of the output, r·f(x) with r ~ N(0, 1), whose gradient
measures how strongly the output moves with the weight. torch-pruning sums the scores over each group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from deploy_opt.data.sources import Batch
from deploy_opt.distill.losses import label_loss
from deploy_opt.prune.structure import torch_pruning

log = logging.getLogger(__name__)
MINIBATCH = 8
MAX_MINIBATCHES = 32


def choose_importance(
    method: str, model: Any, batches: Sequence[Batch], forward: Callable[[Any, dict], Any], seed: int
) -> Any:
    """torch-pruning's importance criterion for ``method``; ``taylor`` first leaves RMS gradients in ``.grad``."""
    tp = torch_pruning()
    if method == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2)
    count = rms_gradients(model, batches, forward, seed)
    log.info("prune: Taylor importance from %d minibatches of the calibration data", count)
    return tp.importance.GroupTaylorImportance()


def rms_gradients(model: Any, batches: Sequence[Batch], forward: Callable[[Any, dict], Any], seed: int) -> int:
    """Set every parameter's ``.grad`` to the RMS of its per-minibatch gradients; the minibatches used."""
    import torch

    pieces = [b.take(range(i, min(i + MINIBATCH, b.size))) for b in batches for i in range(0, b.size, MINIBATCH)]
    pieces = pieces[:MAX_MINIBATCHES]
    params = [p for p in model.parameters() if p.requires_grad]
    squares = [torch.zeros_like(p) for p in params]
    generator = torch.Generator().manual_seed(seed)
    for piece in pieces:
        model.zero_grad(set_to_none=True)
        out = forward(model, piece.inputs).float()
        loss = label_loss(out, piece.label)
        if loss is None:
            direction = torch.randn(out.shape, generator=generator, dtype=out.dtype)
            loss = (out * direction).sum() / out.shape[0]
        loss.backward()
        for square, p in zip(squares, params, strict=True):
            if p.grad is not None:
                square += p.grad.detach().pow(2)
    for square, p in zip(squares, params, strict=True):
        p.grad = (square / max(1, len(pieces))).sqrt()
    return len(pieces)


def clear_gradients(model: Any) -> None:
    """Drop the importance gradients (they must not leak into training)."""
    model.zero_grad(set_to_none=True)


def ordered_tensors(inputs: dict[str, np.ndarray], names: Sequence[str]) -> list[Any]:
    """The batch's arrays as torch tensors, in the model's declared input order."""
    import torch

    return [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names]
