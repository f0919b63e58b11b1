"""Speed-aware placement: where a node is kept in float decides what it costs.

In ONNX Runtime's Q/DQ graphs an edge between an INT8 node and a float one is a QuantizeLinear or a
DequantizeLinear at run time, and it ends the INT8 node's fusion with that neighbour. So an INT8 node left
alone between float ones, an island, converts each of its inputs and its output, and saves only its own
multiply-accumulates. The same holds for a run of INT8 nodes: it converts only at its ends. ``Islands.fill``
keeps in float the INT8 regions beside the fallback's float nodes whose saving does not pay for their
conversions, so float regions come out contiguous instead of alternating with short INT8 runs.

``CONVERSION_MACS`` is measured, not tuned: ``python benchmarks/int8/conversion_cost.py`` times a Q→DQ pair against a
chain of 3×3 convolutions in float and fused INT8 on ORT's CPU provider, and prints how many MACs' INT8 saving
one element's conversion costs. Intel Xeon with AVX-512 VNNI: 24-27 on one thread (0.16-0.19 ns an element, 6-8 ps
saved a MAC; 16-64 channels), 38 on two threads at batch 8. Between the two, 32.
"""

from __future__ import annotations

import math
from collections import defaultdict

import onnx

from deploy_opt.autotune.intensity import reduction_lengths, tensor_shapes

CONVERSION_MACS = 32
# Ops ORT runs on the integers of their input, or folds into the Q after them: they pass INT8 along without a
# conversion, so the neighbour of a node is found through them.
PASS_THROUGH = frozenset(
    ("Relu", "Clip", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "MaxPool", "Identity")
)


class Islands:
    """One model's producers, consumers and element counts, for finding its INT8 regions and their boundaries."""

    def __init__(self, model: onnx.ModelProto, op_types: tuple[str, ...]) -> None:
        self.nodes = {node.name: node for node in model.graph.node}
        self.quantizable = [node.name for node in model.graph.node if node.op_type in op_types and node.name]
        self.kinds = set(self.quantizable)
        self.weights = {init.name for init in model.graph.initializer}
        self.producer = {out: node for node in model.graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in model.graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        shapes = tensor_shapes(model)
        self.sizes = {name: math.prod(max(d, 1) for d in dims) for name, dims in shapes.items()}
        self.lengths = reduction_lengths(model, op_types, shapes)

    def fill(self, excluded: tuple[str, ...]) -> tuple[str, ...]:
        """The quantizable nodes to keep in float beside ``excluded``: each INT8 region next to an excluded node
        whose multiply-accumulates save less than converting its boundary costs. In graph order; ``excluded``
        itself is not repeated.

        A region is a set of INT8 nodes linked without a conversion (directly or through pass-through ops). One
        that touches no excluded node is left alone: its boundary is the model's own, not the fallback's doing.
        """
        floating = set(excluded)
        added: set[str] = set()
        seen: set[str] = set()
        for name in self.quantizable:
            if name in floating or name in seen:
                continue
            region, touches = self._region(name, floating)
            seen |= region
            if touches and not self._pays(region):
                added |= region
        return tuple(name for name in self.quantizable if name in added)

    def _region(self, start: str, floating: set[str]) -> tuple[set[str], bool]:
        """The INT8 nodes linked to ``start``, and whether any of them borders a node in ``floating``."""
        region, frontier, touches = {start}, [start], False
        while frontier:
            node = self.nodes[frontier.pop()]
            for neighbour in self._neighbours(node):
                if neighbour is None or neighbour.name not in self.kinds:
                    continue
                if neighbour.name in floating:
                    touches = True
                elif neighbour.name not in region:
                    region.add(neighbour.name)
                    frontier.append(neighbour.name)
        return region, touches

    def _pays(self, region: set[str]) -> bool:
        """Whether INT8 saves more in ``region`` than converting the activations that cross its boundary costs."""
        saved = converted = 0
        for name in region:
            node = self.nodes[name]
            saved += self.lengths.get(name, 0) * sum(self.sizes.get(t, 0) for t in node.output)
            for tensor in (t for t in node.input if t and t not in self.weights):
                up = self._up(tensor)
                converted += 0 if up is not None and up.name in region else self.sizes.get(tensor, 0)
            for tensor in node.output:
                downs = self._down(tensor)
                crossing = not downs or any(d.name not in region for d in downs)
                converted += self.sizes.get(tensor, 0) if crossing else 0
        return saved > CONVERSION_MACS * converted

    def _neighbours(self, node: onnx.NodeProto) -> list[onnx.NodeProto | None]:
        ups = [self._up(t) for t in node.input if t and t not in self.weights]
        return ups + [n for t in node.output for n in self._down(t)]

    def _up(self, tensor: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        while node is not None and node.op_type in PASS_THROUGH and node.name not in self.kinds and node.input:
            node = self.producer.get(node.input[0])
        return node

    def _down(self, tensor: str) -> list[onnx.NodeProto]:
        found, frontier = [], list(self.consumers.get(tensor, []))
        while frontier:
            node = frontier.pop()
            if node.op_type in PASS_THROUGH and node.name not in self.kinds:
                frontier.extend(c for out in node.output for c in self.consumers.get(out, []))
            else:
                found.append(node)
        return found
