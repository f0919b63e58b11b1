"""TensorRT's operator restrictions: what each clause of onnx-tensorrt's "restrictions" column means for one node.

The clauses come from the operator table in ``deploy_opt/backend_tables/tensorrt_operators.csv``; an unknown clause is
reported as unchecked, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onnx import helper, numpy_helper


@dataclass(frozen=True)
class NodeFacts:
    """What a restriction check may look at: the node, its schema, the graph's constants and tensor ranks."""

    node: Any  # onnx.NodeProto
    schema: Any  # onnx.defs.OpSchema or None
    constants: Mapping[str, Any]  # tensor name -> onnx.TensorProto (initializers and Constant outputs)
    ranks: Mapping[str, int]

    def attribute(self, name: str, default: Any = None) -> Any:
        """The node's attribute value, else the schema's default, else ``default``."""
        for attr in self.node.attribute:
            if attr.name == name:
                value = helper.get_attribute_value(attr)
                return value.decode() if isinstance(value, bytes) else value
        if self.schema is not None and name in self.schema.attributes:
            proto = self.schema.attributes[name].default_value
            if proto.type:
                value = helper.get_attribute_value(proto)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def _tensor(self, formal: str, outputs: bool = False) -> str | None:
        params = (self.schema.outputs if outputs else self.schema.inputs) if self.schema is not None else []
        names = self.node.output if outputs else self.node.input
        for index, param in enumerate(params):
            if param.name == formal:
                return names[index] if index < len(names) and names[index] else None
        return None

    def input_is_constant(self, formal: str) -> bool | None:
        """True when input ``formal`` is absent or a constant, False when computed, None when unknown."""
        if self.schema is None:
            return None
        name = self._tensor(formal)
        return name is None or name in self.constants

    def input_all_zero(self, formal: str) -> bool | None:
        """True when input ``formal`` is absent or a constant of zeros; None when not a constant."""
        name = self._tensor(formal)
        if name is None:
            return True if self.schema is not None else None
        if name not in self.constants:
            return None
        return not numpy_helper.to_array(self.constants[name]).any()

    def output_used(self, formal: str) -> bool:
        """Whether the node produces output ``formal``."""
        return self._tensor(formal, outputs=True) is not None

    def input_rank(self) -> int | None:
        """Rank of the first input, where shape inference knows it."""
        return self.ranks.get(self.node.input[0]) if self.node.input else None


_CHOICES = {  # "Supported <phrase>: `a`, `b`" -> (attribute, ONNX default)
    "resize transformation modes": ("coordinate_transformation_mode", "half_pixel"),
    "resize modes": ("mode", "nearest"),
    "nearest modes": ("nearest_mode", "round_prefer_floor"),
    "aspect ratio policy": ("keep_aspect_ratio_policy", "stretch"),
}


def _check_clause(clause: str, facts: NodeFacts) -> bool | None:
    """True: satisfied; False: the restriction applies to this node; None: not checked."""
    if re.fullmatch(r"`\w+` value is ignored by TensorRT", clause):
        return True  # informational, not a limit
    if m := re.fullmatch(r"`(\w*zero_point)` must be (?:zero|0)", clause):
        return facts.input_all_zero(m[1])
    if m := re.fullmatch(r"`(\w+)` must be (?:an initializer|a constant tensor|a build-time constant)", clause):
        return facts.input_is_constant(m[1])
    if clause == "`dilations` must be empty or all ones":
        return all(d == 1 for d in facts.attribute("dilations", []) or [])
    if re.fullmatch(r"2D or 3D [Pp]ooling only", clause):
        rank = facts.input_rank()
        return None if rank is None else rank in (4, 5)
    if clause == "Input must be 4D input":
        rank = facts.input_rank()
        return None if rank is None else rank == 4
    if clause == "Antialiasing is not supported":
        return not facts.attribute("antialias", 0)
    if m := re.fullmatch(r"`(\w+)`(?: attribute)? must be (\d+)", clause):
        value = facts.attribute(m[1])
        return None if value is None or not isinstance(value, int) else value == int(m[2])
    if m := re.fullmatch(r"`(\w+)` is not supported", clause):
        return facts.attribute(m[1], "none") in ("none", "", 0)
    if m := re.fullmatch(r"`(\w+)` output tensor unsupported", clause):
        return not facts.output_used(m[1])
    if m := re.fullmatch(r"Only the first output `\w+` is supported", clause):
        return sum(1 for o in facts.node.output if o) <= 1
    if (m := re.fullmatch(r"Supported ([\w ]+): (.*)", clause)) and m[1] in _CHOICES:
        attribute, default = _CHOICES[m[1]]
        return facts.attribute(attribute, default) in re.findall(r"`(\w+)`", m[2])
    return None


def check_restrictions(text: str, facts: NodeFacts) -> tuple[str, list[str]]:
    """'none', 'satisfied', 'applies' or 'unchecked', with the clauses that apply (or, if none, went unchecked)."""
    clauses = [c.strip().rstrip(".") for c in re.split(r"<br\s*/?>|(?<=\.)\s+", text or "") if c.strip()]
    if not clauses:
        return "none", []
    verdicts = [(clause, _check_clause(clause, facts)) for clause in clauses]
    applies = [c for c, v in verdicts if v is False]
    if applies:
        return "applies", applies
    unchecked = [c for c, v in verdicts if v is None]
    return ("unchecked", unchecked) if unchecked else ("satisfied", [])
