"""The linearised sensitivity proxy: each node's own quantization noise, carried to the model output.

A node's local noise is what quantizing only its inputs (with the deployed scales) adds to its output:
``e = f(DQ(Q(x)), DQ(W)) - f(x, W)``, evaluated on the FP32 model's activations. How much of that reaches
the output depends on everything downstream: noise on a value projection passes straight through, noise on a
query is squashed by the softmax. To first order the output moves by ``J e``, where ``J`` is the Jacobian of
the output with respect to the node's output. ``||J e||²`` for every node comes from a few backward passes
(Hutchinson's estimator: for probes ``v`` with ``E[v vᵀ] = I``, ``E[(vᵀ J e)²] = ||J e||²``): one backward
per probe gives ``Jᵀ v`` for all nodes at once, and each node then needs one dot product with its ``e``.

Samples run one at a time, so every sample and probe is an independent draw. For the cosine metric the probes
are projected orthogonal to the output (only that part of the noise moves the angle). The result is the
predicted noise power relative to the output's power, ``||P J e||² / ||y||²``; for cosine × 100 the predicted
drop is 50 times that (:func:`predicted_drop`). The graph runs in torch (:mod:`deploy_opt.onnx_torch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import onnx

from deploy_opt.analysis.sensitivity.variants import QuantizedNode
from deploy_opt.data.sources import Batch, single_rows
from deploy_opt.onnx_torch import initializer_tensors, model_opset, run_graph, run_node, unsupported_ops
from dopt_common.deps import require

log = logging.getLogger(__name__)


def _local_input_fns(qdq: onnx.ModelProto, nodes: list[QuantizedNode]) -> dict[str, dict[int, Callable]]:
    """Per node and input position, a function from the FP32 input tensor to its quantized-dequantized value."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    by_name = {n.name: n for n in qdq.graph.node}
    constants = initializer_tensors(qdq)

    def dq_of(dq: onnx.NodeProto) -> Callable:
        params = [constants[name] if name else None for name in dq.input[1:]]
        fixed = run_node(dq, [constants[dq.input[0]], *params])[0] if dq.input[0] in constants else None
        if fixed is not None:
            return lambda _x: fixed

        quant = producer[dq.input[0]]
        qparams = [constants[name] if name else None for name in quant.input[1:]]

        def fake_quant(x: Any) -> Any:
            return run_node(dq, [run_node(quant, [x, *qparams])[0], *params])[0]

        return fake_quant

    fns: dict[str, dict[int, Callable]] = {}
    for node in nodes:
        proto = by_name[node.name]
        fns[node.name] = {q.index: dq_of(producer[proto.input[q.index]]) for q in node.inputs}
    return fns


def propagated_noise(
    fp32: onnx.ModelProto,
    qdq: onnx.ModelProto,
    nodes: list[QuantizedNode],
    batches: list[Batch],
    metric: str,
    probes: int = 4,
    seed: int = 0,
) -> dict[str, float] | None:
    """Per node, the output noise power (relative to the output's) that its quantization alone predicts.

    None when the graph holds an operator the torch evaluator cannot run (the caller keeps its other proxies).
    """
    torch = require("torch", purpose="the linearised sensitivity proxy")
    missing = unsupported_ops(fp32) or unsupported_ops(qdq)
    if missing:
        log.warning("linearised proxy skipped: the torch evaluator does not implement %s", ", ".join(missing))
        return None
    wanted = {n.name for n in nodes}
    if not wanted:  # nothing quantized (FP32 ships): no node has noise to propagate
        return {}
    local_fns = _local_input_fns(qdq, nodes)
    constants = initializer_tensors(fp32)
    output = fp32.graph.output[0].name
    generator = torch.Generator().manual_seed(seed)
    totals = dict.fromkeys(wanted, 0.0)
    draws = 0
    with torch.enable_grad():
        for feeds in single_rows(batches):
            tap = _Taps(wanted, local_fns, model_opset(fp32))
            y = run_graph(fp32, feeds, tap, constants)[output].float()
            names = [n for n in tap.leaves if n in tap.noise]
            if not names:
                continue
            for _ in range(probes):
                v = probe(y, generator, metric)
                leaves = [tap.leaves[n] for n in names]
                grads = torch.autograd.grad((v * y).sum(), leaves, retain_graph=True, allow_unused=True)
                for name, grad in zip(names, grads, strict=True):
                    if grad is not None:
                        # float32 product, float64 sum: the conversions of both tensors cost more than the backward
                        totals[name] += float((grad * tap.noise[name]).sum(dtype=torch.float64)) ** 2
                draws += 1
    return {name: total / max(draws, 1) for name, total in totals.items()}


def probe(y: Any, generator: Any, metric: str) -> Any:
    """A random probe ``v`` for Hutchinson's estimator, scaled so that ``E[(vᵀ δy)²]`` is the relative noise.

    Relative to the output's power per sample; for cosine, only the part orthogonal to the output (the part that
    moves the angle). An output with a channel axis and more (``[batch, channels, positions…]``: a detector's
    rows of box coordinates and class scores, a map per class) is judged per channel instead: the mean over
    channels of each channel's noise power relative to its own. Otherwise a detector's box coordinates, in
    pixels, would outweigh the class scores whose threshold decides what is detected.
    """
    import torch

    flat = y.detach().reshape(y.shape[0], -1)
    z = torch.randn(flat.shape, generator=generator, dtype=flat.dtype)
    if metric not in ("cosine", "mse") and y.ndim >= 3 and y.shape[1] > 1:
        per_channel = y.detach().reshape(y.shape[0], y.shape[1], -1)
        rms = per_channel.pow(2).mean(dim=2, keepdim=True).sqrt().clamp_min(1e-12)
        scale = 1.0 / (rms * (per_channel.shape[1] * per_channel.shape[2]) ** 0.5)
        return (z.reshape(per_channel.shape) * scale).reshape(y.shape)
    norm = flat.norm(dim=1, keepdim=True).clamp_min(1e-30)
    if metric == "cosine":
        unit = flat / norm
        z = z - (z * unit).sum(dim=1, keepdim=True) * unit
    return (z / norm).reshape(y.shape)


class _Taps:
    """The ``run_graph`` hook: at each analyzed node, its local noise and a zero tap on its output.

    The gradient with respect to a tap added to the output is the gradient with respect to the output, and the
    output keeps its link to the taps upstream (detaching it instead would cut their paths to the model output).
    """

    def __init__(self, wanted: set[str], local_fns: dict[str, dict[int, Callable]], opset: int | None = None) -> None:
        self.wanted, self.local_fns, self.opset = wanted, local_fns, opset
        self.noise: dict[str, Any] = {}
        self.leaves: dict[str, Any] = {}

    def __call__(self, node: onnx.NodeProto, inputs: list[Any], outputs: list[Any]) -> list[Any] | None:
        import torch

        if node.name not in self.wanted:
            return None
        with torch.no_grad():
            fns = self.local_fns[node.name]
            quantized = [fns[i](x) if i in fns else x for i, x in enumerate(inputs)]
            self.noise[node.name] = run_node(node, quantized, self.opset)[0] - outputs[0]
        self.leaves[node.name] = torch.zeros_like(outputs[0], requires_grad=True)
        return [outputs[0] + self.leaves[node.name], *outputs[1:]]


def predicted_drop(metric: str, relative_noise: float) -> float | None:
    """The metric drop a relative output noise power predicts, where the metric has a closed form.

    cosine × 100: ``cos θ ≈ 1 - θ²/2`` and ``θ² = ||P⊥ δy||² / ||y||²``, so the drop is ``50 θ²``.
    """
    return 50.0 * relative_noise if metric == "cosine" else None
