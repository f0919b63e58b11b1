"""torch → ONNX with dynamic axes, through the dynamo exporter (default) or TorchScript."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import onnx

from dopt_common.errors import ExportError, one_line
from dopt_common.files import scratch_dir
from exporters.onnx.io import save_onnx

log = logging.getLogger(__name__)


def export_onnx(
    model: Any,
    example: Sequence[Any],
    path: str | Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    exporter: Literal["dynamo", "torchscript"] = "dynamo",
    opset: int = 18,
    external_data_mb: int = 1024,
) -> Path:
    """Export ``model`` called on ``example`` tensors to ``path`` and return it."""
    import torch

    # torch's exporter logs every skipped torchvision op at WARNING; keep the user's log readable.
    exporter_log = logging.getLogger("torch.onnx")
    previous_level = exporter_log.level
    exporter_log.setLevel(max(logging.ERROR, log.getEffectiveLevel()))
    with scratch_dir("deploy_opt.export.") as tmp:
        raw = Path(tmp) / "raw.onnx"
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    model,
                    tuple(example),
                    str(raw),
                    input_names=list(input_names),
                    output_names=list(output_names) or None,
                    **_dynamic(dynamic_axes, input_names, exporter),
                    opset_version=opset,
                    dynamo=exporter == "dynamo",
                    external_data=True,
                    **({"verbose": False} if exporter == "dynamo" else {}),
                )
        except Exception as exc:  # exporters raise a zoo of types; the message is what matters
            first = one_line(exc) or type(exc).__name__
            other = "torchscript" if exporter == "dynamo" else "dynamo"
            raise ExportError(
                f"torch.onnx.export ({exporter}, opset {opset}) failed: {first}; fix: try export.exporter={other}"
            ) from exc
        finally:
            exporter_log.setLevel(previous_level)
        proto = onnx.load(str(raw))
        _check_unique_names(proto, exporter)
        if exporter == "dynamo":
            _rename_dims(proto, dynamic_axes)
    log.info("exported %s with the %s exporter at opset %d", path, exporter, opset)
    return save_onnx(proto, path, external_data_mb=external_data_mb)


def _dynamic(axes: Mapping[str, Mapping[int, str]], inputs: Sequence[str], exporter: str) -> dict[str, Any]:
    """The dynamic axes as each exporter takes them: TorchScript by name; dynamo as ``dynamic_shapes`` in input
    order (its own conversion from names fails on models whose inputs share a dimension, e.g. a transformer's
    sequence axis across input_ids and attention_mask)."""
    if exporter != "dynamo":
        return {"dynamic_axes": {k: dict(v) for k, v in axes.items()}}
    from torch.export import Dim

    shapes = tuple({axis: Dim.DYNAMIC for axis in axes.get(name, {})} or None for name in inputs)
    return {"dynamic_shapes": shapes}


def _rename_dims(proto: onnx.ModelProto, axes: Mapping[str, Mapping[int, str]]) -> None:
    """Give the dims dynamo named itself (s0, s43, ...) the names ``axes`` declares, everywhere in the graph."""
    names: dict[str, str] = {}
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis, wanted in axes.get(value.name, {}).items():
            if axis < len(dims) and dims[axis].dim_param:
                names.setdefault(dims[axis].dim_param, wanted)
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]


def _check_unique_names(proto: onnx.ModelProto, exporter: str) -> None:
    """Each tensor name must be defined once (SSA); dynamo can clash an output name with an internal one."""
    defined = [i.name for i in proto.graph.input] + [i.name for i in proto.graph.initializer]
    defined += [o for node in proto.graph.node for o in node.output if o]
    seen: set[str] = set()
    for name in defined:
        if name in seen:
            raise ExportError(
                f"the {exporter} export defines tensor '{name}' twice (an output name clashes with an internal "
                "name, e.g. 'embedding'); fix: rename it in model.outputs"
            )
        seen.add(name)
