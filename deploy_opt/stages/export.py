"""Stage: the FP32 ONNX model, exported from torch or brought as a file, simplified and checked."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx.version_converter

from deploy_opt.config.build import ExportConfig, RuntimeConfig
from deploy_opt.config.model import DTYPES, InputSpec, ModelConfig
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.evaluate import session_runner, torch_runner
from deploy_opt.report.model_sections import ExportInfo
from dopt_common.errors import InputError, ModelError, one_line
from exporters.onnx.checks import check_onnx, check_parity, simplify_onnx
from exporters.onnx.export import export_onnx
from exporters.onnx.io import default_opset, save_onnx
from exporters.onnx.module_names import module_paths, record_module_paths
from exporters.onnx.normalize import (
    constants_to_initializers,
    fold_weight_chains,
    modernise_ir,
    name_dimensions,
    unshare_biases,
)

log = logging.getLogger(__name__)
MIN_QDQ_OPSET = 13
ONNX_DTYPES = {onnx.helper.tensor_dtype_to_np_dtype(t).name: t for t in (1, 10, 7, 6, 9)}


@dataclass(frozen=True)
class Fp32Model:
    """The checked FP32 ONNX file and how it was made."""

    path: Path
    inputs: tuple[InputSpec, ...]
    info: ExportInfo


def input_specs_from_onnx(model: onnx.ModelProto) -> tuple[InputSpec, ...]:
    """Input declarations read from an ONNX graph (dim_param names become dynamic dims)."""
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        shape = tuple(
            d.dim_param or (d.dim_value if d.dim_value > 0 else f"dim{i}") for i, d in enumerate(tensor.shape.dim)
        )
        if dtype not in DTYPES:
            raise InputError(f"ONNX input '{value.name}' has dtype {dtype}; supported: {', '.join(DTYPES)}")
        specs.append(InputSpec(value.name, shape, dtype))
    return tuple(specs)


def check_declared_inputs(declared: tuple[InputSpec, ...], actual: tuple[InputSpec, ...], path: Path | str) -> None:
    """Declared model.inputs must name the ONNX inputs with the same dtype and rank."""
    by_name = {s.name: s for s in actual}
    if sorted(by_name) != sorted(s.name for s in declared):
        raise InputError(
            f"model.inputs {[s.name for s in declared]} do not match the inputs of '{path}': {sorted(by_name)}"
        )
    for spec in declared:
        real = by_name[spec.name]
        if real.dtype != spec.dtype or len(real.shape) != len(spec.shape):
            raise InputError(
                f"model.inputs '{spec.name}' is declared {spec.dtype}{list(spec.shape)}, but '{path}' has "
                f"{real.dtype}{list(real.shape)}; fix model.inputs"
            )


def prepare_fp32(
    export: ExportConfig,
    model: ModelConfig,
    runtime: RuntimeConfig,
    base_dir: str,
    torch_model: Any,
    example: Batch,
    parity_batches: list[Batch],
    stage: Path,
) -> Fp32Model:
    """Export (or copy), simplify, check and parity-test the FP32 model into ``stage/model.onnx``.

    ``base_dir``: the config's folder, which ``model``'s relative paths start from."""
    out = stage / "model.onnx"
    raw = stage / ".raw.onnx"
    info: dict[str, Any] = {}
    if model.onnx:
        info.update(import_onnx((Path(base_dir) / model.onnx).resolve(), raw, export).to_json())
    else:
        specs = model.inputs
        names = [s.name for s in specs]
        out_names = list(model.outputs) or _default_output_names(torch_model, example, names)
        export_onnx(
            torch_model,
            [_to_tensor(example.inputs[n]) for n in names],
            raw,
            input_names=names,
            output_names=out_names,
            dynamic_axes={s.name: s.dynamic_axes for s in specs}
            | {o: {0: "batch"} for o in out_names if specs[0].dynamic_axes.get(0)},
            exporter=export.exporter,
            opset=export.resolved_opset,
            external_data_mb=export.external_data_mb,
        )
        source = model.factory or f"{model.hf} ({model.task})"
        info.update(source=source, exporter=export.exporter, opset=export.resolved_opset)
    modules = module_paths(onnx.load(str(raw), load_external_data=False))  # the simplifier drops node metadata
    if export.simplify:
        info["simplifier"] = simplify_onnx(raw, out, export.external_data_mb)
    else:
        save_onnx(onnx.load(str(raw)), out, export.external_data_mb)
        info["simplifier"] = "off"
    for leftover in stage.glob(".raw.onnx*"):
        leftover.unlink()
    proto = check_onnx(out)
    changes = {"biases_unshared": unshare_biases(proto), "dimensions_named": name_dimensions(proto)}
    # Surviving nodes keep the export's scopes; nodes the simplifier made are named from their parameters.
    kept = {n.name for n in proto.graph.node}
    modules = {**module_paths(proto), **{k: v for k, v in modules.items() if k in kept}}
    if modules:  # model.onnx carries its node → module map, for the sensitivity report and report.html
        record_module_paths(proto, modules)
    if any(changes.values()) or modules:
        save_onnx(proto, out, export.external_data_mb)
        info.update({k: v for k, v in changes.items() if v})
    inputs = input_specs_from_onnx(proto)
    if model.inputs:
        named = Path(model.onnx) if model.onnx else f"the export of {model.factory or model.hf}"
        check_declared_inputs(model.inputs, inputs, named)  # the user's file, never the staging copy
        inputs = model.inputs
    info["opset"] = default_opset(proto)
    info["nodes"] = len(proto.graph.node)
    # ONNX node name → the PyTorch module it came from (name scopes, TorchScript-style names, parameter names).
    info["module_names"] = modules
    if torch_model is not None:
        info["parity"] = _torch_parity(export, runtime, torch_model, [s.name for s in inputs], out, parity_batches)
    else:
        info["parity"] = _import_parity(
            export, (Path(base_dir) / str(model.onnx)).resolve(), runtime, out, parity_batches
        )
    return Fp32Model(out, inputs, ExportInfo.from_json(info))


def _torch_parity(
    export: ExportConfig, runtime: RuntimeConfig, torch_model: Any, names: list[str], out: Path, batches: list[Batch]
) -> dict[str, Any]:
    """The exported model on ORT against the torch model it came from."""
    return _parity(export, runtime, torch_runner(torch_model, names), out, batches)


def _import_parity(
    export: ExportConfig, source: Path, runtime: RuntimeConfig, out: Path, parity_batches: list[Batch]
) -> dict[str, Any]:
    """The imported model (opset-converted, simplified, normalised) against the user's file, both on ORT."""
    from dopt_common.ort import create_session

    original = session_runner(create_session(source, threads=runtime.threads))
    return _parity(export, runtime, original, out, parity_batches, "the original model.onnx on ONNX Runtime")


def _parity(
    export: ExportConfig,
    runtime: RuntimeConfig,
    reference: Any,
    out: Path,
    batches: list[Batch],
    named: str | None = None,
) -> dict[str, Any]:
    """build.json's ``export.parity``: ``out`` on ORT against the ``reference`` runner (``named``: what it is,
    written first, when it is not the torch model)."""
    parity = check_parity(
        reference,
        out,
        (b.inputs for b in batches),
        atol=export.parity_atol,
        rtol=export.parity_rtol,
        threads=runtime.threads,
    )
    return ({"reference": named} if named else {}) | {
        "max_abs": parity.max_abs,
        "max_rel": parity.max_rel,
        "tolerance": parity.tolerance,
        "samples": parity.samples,
    }


@dataclass(frozen=True)
class OnnxImport:
    """The user's ONNX file as read (opset, IR version, producer) and what was changed to make it quantizable."""

    source: str
    original: dict[str, Any]  # opset, ir_version, producer
    changes: dict[str, Any]  # only what changed: opset_converted, ir_changed, constants_to_initializers, ...

    def to_json(self) -> dict[str, Any]:
        """The first entries of build.json's ``export`` section."""
        return {"source": self.source, "exporter": "none (model.onnx)", "original": self.original, **self.changes}


def import_onnx(source: Path, raw: Path, export: ExportConfig) -> OnnxImport:
    """Check the user's file and make it quantizable into ``raw``; returns what changed, for ``build.json``.

    The opset is raised to 13 when older, the IR version to what that opset needs, and weights held by
    ``Constant`` nodes or computed from constants become initializers (the writer quantizes only those as
    weights). The simplifier and a parity run against ``source`` follow in ``prepare_fp32``.
    """
    model = check_onnx(source)
    original = {"opset": default_opset(model), "ir_version": model.ir_version, "producer": _producer(model)}
    model, converted = upgrade_opset(model)
    changes = {
        "opset_converted": converted,
        "ir_changed": modernise_ir(model),
        "constants_to_initializers": constants_to_initializers(model),
        "weights_folded": fold_weight_chains(model),
    }
    save_onnx(model, raw, export.external_data_mb)
    return OnnxImport(str(source), original, {k: v for k, v in changes.items() if v})


def _producer(model: onnx.ModelProto) -> str:
    return f"{model.producer_name} {model.producer_version}".strip() or "unknown"


def upgrade_opset(model: onnx.ModelProto, minimum: int = MIN_QDQ_OPSET) -> tuple[onnx.ModelProto, str | None]:
    """``model`` at ``minimum`` opset or newer, and what was converted (None when nothing was).

    Per-channel DequantizeLinear (its ``axis``) needs opset 13: an older file from another framework is converted
    with onnx's version converter first.
    """
    version = default_opset(model) or minimum
    if version >= minimum:
        return model, None
    try:
        converted = onnx.version_converter.convert_version(model, minimum)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError with its reason
        raise ModelError(
            f"model.onnx is opset {version} and onnx's version converter cannot raise it to {minimum} "
            f"(per-channel INT8 needs it): {one_line(exc)}; fix: re-export at opset {minimum}+"
        ) from exc
    log.info("model.onnx: opset %d converted to %d (per-channel Q/DQ needs %d)", version, minimum, minimum)
    return converted, f"{version} -> {minimum}: per-channel Q/DQ needs opset {minimum}"


def _to_tensor(array: Any) -> Any:
    import torch

    return torch.from_numpy(array.copy())


def _default_output_names(model: Any, example: Batch, names: list[str]) -> list[str]:
    outputs = torch_runner(model, names)(example.inputs)
    return ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
