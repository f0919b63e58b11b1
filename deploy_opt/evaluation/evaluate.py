"""Run every backend over the evaluation set in one pass and score it with the metric."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.metrics import Metric, RunningMean
from dopt_common.errors import NumericsError

log = logging.getLogger(__name__)
Runner = Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class Evaluation:
    """The metric per backend over the same samples, and each backend's per-sample scores in sample order (for
    paired intervals and for scoring the decision and judged parts of a split evaluation apart)."""

    metric: str
    higher_is_better: bool
    values: dict[str, float]
    samples: int
    reference: str
    per_sample: dict[str, np.ndarray] = field(default_factory=dict)


def torch_runner(model: object, input_names: Sequence[str]) -> Runner:
    """Call a torch module with inputs in declaration order; outputs come back as numpy arrays."""
    import torch

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = model(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in input_names))
        if isinstance(out, dict):
            out = list(out.values())
        if isinstance(out, torch.Tensor):
            out = [out]
        return [o.detach().cpu().numpy() for o in out]

    return run


def session_runner(session: object) -> Runner:
    """Call an ORT session with every output."""

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(None, feed)

    return run


def evaluate(
    runners: dict[str, Runner],
    batches: Iterable[Batch],
    metric: Metric,
    reference: str,
    progress: bool = True,
) -> Evaluation:
    """Score each runner's first output against the label, or against ``reference``'s output when unlabelled."""
    from tqdm import tqdm

    means = {name: RunningMean() for name in runners}
    scores: dict[str, list[np.ndarray]] = {name: [] for name in runners}
    samples = 0
    for index, batch in enumerate(
        tqdm(batches, desc="evaluate", unit="batch", disable=None if progress else True, leave=False)
    ):
        outputs = {}
        for name, run in runners.items():
            out = np.asarray(run(batch.inputs)[0])
            if out.dtype.kind == "f" and not np.all(np.isfinite(out)):
                raise NumericsError(
                    f"{name} output has NaN or Inf on evaluation batch {index}; fix: check the model and the "
                    "input ranges (for INT8: the calibration data)"
                )
            outputs[name] = out
        target = batch.label if batch.label is not None else outputs[reference]
        for name, out in outputs.items():
            batch_scores = np.asarray(metric.score(out, target), dtype=np.float64).ravel()
            means[name].add(batch_scores)
            scores[name].append(batch_scores)
        samples += batch.size
    values = {name: mean.value for name, mean in means.items()}
    log.info("evaluation on %d samples: %s", samples, ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
    per_sample = {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in scores.items()}
    return Evaluation(metric.name, metric.higher_is_better, values, samples, reference, per_sample)
