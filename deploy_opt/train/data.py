"""The data contract of the training loop: what a ``data: "module:function"`` reference returns.

The function is called as ``fn(batch_size=..., seed=...)`` and returns a :class:`TrainData`:

- ``train(epoch)`` returns that epoch's batches. It must be deterministic in ``(seed, epoch)`` (shuffle with a
  ``torch.Generator`` seeded from both, never with the global RNG): resuming skips the batches already seen in
  the interrupted epoch and must get the same ones back.
- ``evaluation`` is an iterable of batches (a list, or a function returning a fresh iterable).
- A batch is ``(inputs, target)``. ``inputs`` is a tensor (``model(inputs)``), a tuple (``model(*inputs)``) or a
  dict (``model(**inputs)``); ``target`` is whatever ``loss`` and ``metric`` take.
- ``loss(output, target)`` returns a scalar tensor; ``metric(output, target)`` returns a float averaged over
  the batch (e.g. accuracy), weighted by ``len(target)`` over the evaluation set.
- ``logits(output)`` (optional) returns the output's logits, classes on the last dim: Sophia's Gauss-Newton-Bartlett
  Hessian estimator samples labels from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from deploy_opt.data.sources import call_user, resolve_callable
from dopt_common.errors import SourceError

Batch = tuple[Any, Any]


@dataclass(frozen=True)
class TrainData:
    """Training batches per epoch, evaluation batches, the loss and an optional metric."""

    train: Callable[[int], Iterable[Batch]]
    evaluation: Iterable[Batch] | Callable[[], Iterable[Batch]]
    loss: Callable[[Any, Any], torch.Tensor]
    metric: Callable[[Any, Any], float] | None = None
    metric_name: str = "metric"
    # Where the model's output keeps its logits ([..., classes]), for Sophia's Gauss-Newton-Bartlett estimator;
    # None: Sophia falls back to the Hutchinson estimator.
    logits: Callable[[Any], torch.Tensor] | None = None

    def evaluation_batches(self) -> Iterable[Batch]:
        """A fresh iterable over the evaluation batches."""
        return self.evaluation() if callable(self.evaluation) else self.evaluation


def load_train_data(ref: str, batch_size: int, seed: int, base_dir: str = ".") -> TrainData:
    """Resolve ``module:function`` and call it; the result must be a TrainData."""
    func = resolve_callable(ref, base_dir, what="data")
    data = call_user(lambda: func(batch_size=batch_size, seed=seed), f"data function '{ref}'")
    if not isinstance(data, TrainData):
        raise SourceError(
            f"data function '{ref}' returned {type(data).__name__}; it must return "
            "deploy_opt.train.data.TrainData(train=..., evaluation=..., loss=...)"
        )
    return data


def run_model(model: torch.nn.Module, inputs: Any) -> Any:
    """Call the model the way the batch's inputs ask: tensor, positional tuple or keyword dict."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def batch_size_of(target: Any, inputs: Any) -> int:
    """The number of samples in a batch (for weighting the evaluation mean)."""
    for item in (target, inputs):
        if isinstance(item, torch.Tensor) and item.ndim > 0:
            return int(item.shape[0])
        if isinstance(item, dict) and item:
            return batch_size_of(next(iter(item.values())), None)
        if isinstance(item, (tuple, list)) and item:
            return batch_size_of(item[0], None) if isinstance(item[0], torch.Tensor) else len(item)
    return 1


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TrainData) -> dict[str, float]:
    """Mean loss (and metric) over the evaluation batches, weighted by batch size; the model is left in train mode."""
    model.eval()
    total = loss_sum = metric_sum = 0.0
    try:
        for inputs, target in data.evaluation_batches():
            n = batch_size_of(target, inputs)
            output = run_model(model, inputs)
            loss_sum += float(data.loss(output, target)) * n
            if data.metric is not None:
                metric_sum += float(data.metric(output, target)) * n
            total += n
    finally:
        model.train()
    if total == 0:
        raise SourceError("the data's evaluation batches are empty; fix: return at least one (inputs, target) batch")
    result = {"eval_loss": loss_sum / total}
    if data.metric is not None:
        result[f"eval_{data.metric_name}"] = metric_sum / total
    return result
