"""The range method per tensor, chosen by the output error it causes (``calibration.method: auto``).

A clipping range (entropy, mse) trades the rare large value for finer steps where the mass is. Whether the trade
pays depends on what the model does downstream: clipping the outliers of a residual stream or of an attention
score moves the output far more than their share of the local error says. So each candidate range is judged by
its quantization noise *carried to the model output*: for the FP32 activations of a few calibration samples,
``e_m = DQ(Q(x; range_m)) - x`` at the tensor, and ``||J e_m||²`` by Hutchinson's estimator as in
:mod:`deploy_opt.analysis.sensitivity.noise` (one backward per probe gives ``Jᵀ v`` at every tensor at once).
The method with the least propagated noise wins; on a tensor where clipping hurts, that is min/max.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from calibrators.qparams import activation_scale
from deploy_opt.analysis.sensitivity.noise import probe
from deploy_opt.onnx_torch import initializer_tensors, run_graph, unsupported_ops
from dopt_common.deps import require

log = logging.getLogger(__name__)


def propagated_range_noise(
    model: onnx.ModelProto,
    candidates: Mapping[str, Mapping[Any, tuple[float, float]]],
    scheme: str | Callable[[Any], str],
    feeds: Iterable[dict[str, np.ndarray]],
    probes: int = 4,
    seed: int = 0,
    metric: str = "",
    values: float | None = None,
) -> dict[str, dict[str, float]] | None:
    """Per tensor and method, the output noise power (relative to the output's) of quantizing with that range.

    ``candidates`` maps tensor → candidate → (low, high); ``scheme`` is the activation scheme of every
    candidate, or a function from a candidate to its scheme (one pass for both schemes: the forward and the
    probes' backward passes are shared). None when the torch evaluator lacks an operator.
    ``metric`` decides how output noise is weighed (``noise.probe``). ``values`` bounds the pass: after the first
    sample it runs the most samples, a power of two, whose tapped activation values fit (``samples_within``). A
    count of values, not a time, so that the samples, and so the ranges, do not depend on the machine's load.
    """
    torch = require("torch", purpose="choosing range methods by propagated error")
    missing = unsupported_ops(model)
    if missing:
        log.warning("calibration auto: the torch evaluator lacks %s; ranges chosen locally", ", ".join(missing))
        return None
    scheme_of = scheme if callable(scheme) else (lambda _key: scheme)
    fake = {t: {m: _fake_quant(t, r, scheme_of(m)) for m, r in by.items()} for t, by in candidates.items()}
    constants = initializer_tensors(model)
    output = model.graph.output[0].name
    generator = torch.Generator().manual_seed(seed)
    totals = {t: np.zeros(len(by)) for t, by in candidates.items()}
    draws, feeds, limit = 0, list(feeds), None
    with torch.enable_grad():
        for index, feed in enumerate(feeds):
            if limit is not None and index >= limit:
                break
            tap = _TensorTaps(set(candidates))
            y = run_graph(model, feed, tap, constants)[output].float()
            names = list(tap.leaves)
            for _ in range(probes):
                v = probe(y, generator, metric)
                grads = torch.autograd.grad(
                    (v * y).sum(), [tap.leaves[t] for t in names], retain_graph=True, allow_unused=True
                )
                for name, grad in zip(names, grads, strict=True):
                    if grad is not None:  # one matrix-vector product: every candidate's Jᵀv·e at once
                        # the noise rows are made per probe, not kept: six per tensor of a large detector's
                        # activations would need several times the memory of the activations themselves
                        noise = _noise_rows(tap.values[name], fake[name].values())
                        dots = torch.mv(noise, grad.detach().reshape(-1).float())
                        totals[name] += dots.double().numpy() ** 2
                draws += 1
            if values is not None and limit is None:
                size = sum(int(v.numel()) for v in tap.values.values())
                limit = samples_within(values, size, len(feeds))
                if limit < len(feeds):
                    log.info(
                        "calibration auto: %d of %d samples fit its %.3g activation values (%.3g a sample)",
                        limit,
                        len(feeds),
                        values,
                        size,
                    )
    return {
        t: {m: float(total) / max(draws, 1) for m, total in zip(by, totals[t], strict=True)}
        for t, by in candidates.items()
    }


def samples_within(allowed: float, per_sample: float, available: int) -> int:
    """The most samples, a power of two (at least one, at most ``available``), whose cost fits ``allowed``.

    On a PicoDet layout detector at 800x608 one sample (a forward and four backward probes through the torch
    evaluator over 525 tapped tensors) cost 18 s, and sixteen of them 292 s of a 240 s search budget.
    """
    count = 1
    while count * 2 <= available and count * 2 * per_sample <= allowed:
        count *= 2
    return min(count, max(available, 1))


def _noise_rows(x: Any, fns: Iterable[Any]) -> Any:
    """``DQ(Q(x)) - x`` for each candidate's fake quantization, a row each (float32, flattened)."""
    import torch

    flat = x.detach().reshape(-1).float()
    return torch.stack([fn(flat) - flat for fn in fns])


def _fake_quant(name: str, bounds: tuple[float, float], scheme: str) -> Any:
    """x → DQ(Q(x)) with the parameters ``activation_scale`` gives this range (those the scale file would hold)."""
    import torch

    entry = activation_scale(name, bounds[0], bounds[1], scheme, "candidate")
    scale, zero = float(entry.scale[0]), int(entry.zero_point[0])
    low, high = (-128, 127) if entry.dtype == "int8" else (0, 255)

    def apply(x: Any) -> Any:  # ATen's fused fake quantization: round half to even, as torch.round
        with torch.no_grad():
            return torch.fake_quantize_per_tensor_affine(x, scale, zero, low, high)

    return apply


class _TensorTaps:
    """The ``run_graph`` hook: a zero tap on every output tensor that is a candidate, and its FP32 value."""

    def __init__(self, wanted: set[str]) -> None:
        self.wanted = wanted
        self.values: dict[str, Any] = {}
        self.leaves: dict[str, Any] = {}

    def __call__(self, node: onnx.NodeProto, inputs: list[Any], outputs: list[Any]) -> list[Any] | None:
        import torch

        hits = [i for i, name in enumerate(node.output) if name in self.wanted and outputs[i].is_floating_point()]
        if not hits:
            return None
        replaced = list(outputs)
        for i in hits:
            name = node.output[i]
            self.values[name] = outputs[i].detach()
            self.leaves[name] = torch.zeros_like(outputs[i], requires_grad=True)
            replaced[i] = outputs[i] + self.leaves[name]
        return replaced


def pick_methods(noise: Mapping[str, Mapping[str, float]], prefer: str = "minmax") -> dict[str, str]:
    """Per tensor, the method with the least propagated noise; ``prefer`` wins ties within 1%."""
    chosen = {}
    for tensor, by in noise.items():
        best = min(by, key=lambda m: by[m])
        if prefer in by and by[prefer] <= by[best] * 1.01:
            best = prefer
        chosen[tensor] = best
    return chosen
