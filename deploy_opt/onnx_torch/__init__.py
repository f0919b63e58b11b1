"""Run an ONNX graph with torch tensors, so autograd can see through it.

The sensitivity proxy needs the gradient of the model's output with respect to every quantized node's output.
ONNX Runtime has no backward pass for inference graphs, so this evaluates the graph node by node with torch ops
(eager, CPU, in the graph's own dtypes), following ONNX semantics for opsets 7 to the latest: the operators that
the dynamo and TorchScript exporters emit for CNNs and transformers, and those of the ONNX model zoo.

Operators without a gradient (shape arithmetic, comparisons, masks, Cast to integers, NonZero...) still run, with
exact values; autograd simply does not track their int and bool results. An operator, or an operator setting,
outside what the evaluator implements is named up front by :func:`unsupported_ops`, and raises
:class:`UnsupportedOpError` in :func:`run_node`; the caller falls back to what it can do without gradients.
"""

from __future__ import annotations

from deploy_opt.onnx_torch._common import UnsupportedOpError, to_tensor
from deploy_opt.onnx_torch.graph import (
    InputHook,
    NodeHook,
    initializer_tensors,
    model_opset,
    run_graph,
    run_node,
    supported_ops,
    unsupported_ops,
)

__all__ = [
    "InputHook",
    "NodeHook",
    "UnsupportedOpError",
    "initializer_tensors",
    "model_opset",
    "run_graph",
    "run_node",
    "supported_ops",
    "to_tensor",
    "unsupported_ops",
]
