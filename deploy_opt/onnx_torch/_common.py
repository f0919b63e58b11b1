"""What every part of the torch evaluator shares: the error, an operator's spec, tensors, attributes, axes.

torch is imported inside functions here: this module loads with the package, which the core imports without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from dopt_common.errors import DeployOptError

# ml_dtypes arrays (what onnx.numpy_helper gives for these types) that torch.from_numpy cannot take:
# viewed bit for bit as an unsigned integer array, then as the torch type of the same width.
_BIT_VIEWS = {
    "bfloat16": (np.uint16, "bfloat16"),
    "float8_e4m3fn": (np.uint8, "float8_e4m3fn"),
    "float8_e4m3fnuz": (np.uint8, "float8_e4m3fnuz"),
    "float8_e5m2": (np.uint8, "float8_e5m2"),
    "float8_e5m2fnuz": (np.uint8, "float8_e5m2fnuz"),
}
# Sub-byte integer types arrive unpacked, one value a byte.
_WIDENED = {"int4": np.int8, "uint4": np.uint8, "int2": np.int8, "uint2": np.uint8}
# ONNX element type → torch dtype name, for Cast and the dtype attributes.
_TORCH_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}
_INT, _FLOAT, _INTS, _STRING = (
    onnx.AttributeProto.INT,
    onnx.AttributeProto.FLOAT,
    onnx.AttributeProto.INTS,
    onnx.AttributeProto.STRING,
)
Check = Callable[[dict[str, Any], int], str | None]


class UnsupportedOpError(DeployOptError):
    """The graph holds an operator (or an operator setting) this evaluator does not implement."""


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How to run one operator type.

    ``fn`` takes the node's inputs positionally and its attributes as keywords. ``keywords`` names the inputs
    after the first that older opsets gave as attributes (``axes``, ``pads``, ...): they are passed as keywords
    of the same name, so one signature serves every opset. With ``context``, ``fn`` also receives ``_opset``
    (the default domain's version) and ``_outputs`` (how many outputs the node has). ``check`` looks at the
    attributes and the output count and names a setting ``fn`` cannot run (None when it can).
    """

    fn: Callable[..., Any]
    keywords: tuple[str, ...] = ()
    context: bool = False
    check: Check | None = None


def one_of(name: str, default: Any, allowed: tuple[Any, ...]) -> Check:
    """A check: attribute ``name`` (``default`` when absent) is one of ``allowed``."""

    def check(attrs: dict[str, Any], outputs: int) -> str | None:
        value = attrs.get(name, default)
        return None if value in allowed else f"{name}={value}"

    return check


def dtype_attr(name: str) -> Check:
    """A check: attribute ``name``, when set (non-zero), is an element type torch holds."""

    def check(attrs: dict[str, Any], outputs: int) -> str | None:
        value = attrs.get(name, 0)
        return None if not value or known_dtype(value) else f"{name}={type_name(value)}"

    return check


def all_of(*checks: Check) -> Check:
    """A check that reports the first failing one of ``checks``."""

    def check(attrs: dict[str, Any], outputs: int) -> str | None:
        return next((reason for c in checks if (reason := c(attrs, outputs))), None)

    return check


def torch_dtype(onnx_type: int) -> Any:
    """The torch dtype of an ONNX element type (UnsupportedOpError for string, complex and 4-bit types)."""
    name = _TORCH_DTYPES.get(onnx_type)
    if name is None:
        raise UnsupportedOpError(f"element type {type_name(onnx_type)} in torch")
    return _torch_attr(name)


def type_name(onnx_type: int) -> str:
    """An ONNX element type's name, e.g. ``STRING``."""
    return onnx.helper.tensor_dtype_to_string(onnx_type).removeprefix("TensorProto.")


def known_dtype(onnx_type: int) -> bool:
    """True when :func:`torch_dtype` can map ``onnx_type``."""
    return onnx_type in _TORCH_DTYPES


@functools.cache
def _torch_attr(name: str) -> Any:
    import torch

    return getattr(torch, name)


def to_tensor(array: np.ndarray) -> Any:
    """A torch tensor of a numpy array, with its dtype and shape (0-d stays 0-d); shares memory when it can."""
    import torch

    array = np.asarray(array)
    if array.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4...) that torch.from_numpy cannot take
        return _from_ml_dtypes(array)
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = array.copy(order="C")
    return torch.from_numpy(array)


def _from_ml_dtypes(array: np.ndarray) -> Any:
    import torch

    name = array.dtype.name
    if name in _BIT_VIEWS:
        bits, torch_name = _BIT_VIEWS[name]
        return torch.from_numpy(np.array(array, order="C").view(bits)).view(_torch_attr(torch_name))
    if name in _WIDENED:
        return torch.from_numpy(array.astype(_WIDENED[name]))
    raise UnsupportedOpError(f"tensors of type {name} in torch")


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name; strings are decoded, tensors and graphs stay protos."""
    out: dict[str, Any] = {}
    for attr in node.attribute:  # the common kinds inline: this runs for every node of every run
        kind = attr.type
        if kind == _INT:
            out[attr.name] = attr.i
        elif kind == _FLOAT:
            out[attr.name] = attr.f
        elif kind == _INTS:
            out[attr.name] = list(attr.ints)
        elif kind == _STRING:
            out[attr.name] = attr.s.decode()
        else:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode() for v in value]
            out[attr.name] = value
    return out


def ints(value: Any) -> list[int]:
    """A tensor, list or number of integers as a Python list."""
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        return [int(v) for v in value]
    return [int(v) for v in value.reshape(-1).tolist()]


def axes_of(value: Any, rank: int) -> list[int]:
    """Axes (tensor, list or int; negatives count from the end) as non-negative ints."""
    return [a % rank if rank else 0 for a in ints(value)]


def scalar(value: Any) -> Any:
    """A one-element tensor as a Python number (numbers pass through)."""
    return value.reshape(-1)[0].item() if hasattr(value, "reshape") else value
