"""The ONNX Runtime Q/DQ artifact: written FROM a scale file by ORT's own ``QDQQuantizer``, and read back.

Every scale and zero point is handed to ORT as a ``TensorQuantOverrides`` entry, so ORT inserts the Q/DQ
nodes (its fusion rules, its bias handling) but computes no parameter of its own. ``read_qdq_scales`` then
reads what the written model really carries, for a bit-exact comparison with the scale file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.scales.format import ScaleFile, TensorScale
from dopt_common.deps import require
from dopt_common.errors import ModelError, one_line
from dopt_common.names import named_counts
from exporters.onnx.io import save_onnx
from exporters.ort.graph import INITIALIZER_SUFFIX, OUTPUT_SUFFIX, keep_quantized, kept_nodes
from exporters.ort.overrides import ort_quant_overrides, overrides_data

log = logging.getLogger(__name__)
__all__ = ["INITIALIZER_SUFFIX", "OUTPUT_SUFFIX", "compare_scales", "read_qdq_scales", "write_ort_qdq"]
QTYPE_NAMES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT32: "int32"}


def _overrides(scales: ScaleFile) -> dict[str, list[dict]]:
    """TensorQuantOverrides that pin every activation and weight parameter to the scale file."""
    # ORT derives bias scales itself (input × weight); the read-back proves they match.
    return ort_quant_overrides(overrides_data(scales))


def write_ort_qdq(
    fp32_path: str | Path,
    scales: ScaleFile,
    out_path: str | Path,
    *,
    op_types: Iterable[str],
    exclude_nodes: Iterable[str] = (),
    external_data_mb: int = 1024,
    quantize_outputs: bool = True,
    int32_bias: bool = True,
) -> Path:
    """Write the Q/DQ model for ORT from ``scales`` with ORT's QDQQuantizer.

    ``int32_bias``: ORT's form, each quantized node's bias an int32 DequantizeLinear (ORT CPU's integer kernels
    fuse it). False is TensorRT's form: biases stay float, as TensorRT's parser refuses int32 Q/DQ and fuses a
    float bias itself; the scales are the same bits either way.
    """
    quant = require("onnxruntime.quantization", purpose="writing the ORT Q/DQ model")
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer, update_opset_version

    symmetric = scales.activations == "symmetric"
    act_type = onnx.TensorProto.INT8 if symmetric else onnx.TensorProto.UINT8
    model = load_model_with_shape_infer(Path(fp32_path))
    model = update_opset_version(model, quant.QuantType.QInt8)
    present = _tensor_names(model)
    # ORT wants a range per activation even when the override pins scale and zero point; a file imported from
    # another tool may carry only amax, which stands for the symmetric range.
    ranges = {
        name: TensorData(
            lowest=np.float32(t.range[0] if t.range else -(t.amax or 0.0)),
            highest=np.float32(t.range[1] if t.range else (t.amax or 0.0)),
        )
        for name, t in scales.tensors.items()
        if t.role == "activation" and name in present
    }
    overrides = {k: v for k, v in _overrides(scales).items() if k in present}
    quantizer = QDQQuantizer(
        model,
        True,  # per_channel
        False,  # reduce_range
        onnx.TensorProto.INT8,
        act_type,
        TensorsData(CalibrationMethod.MinMax, ranges),
        [],
        list(exclude_nodes),
        list(op_types),
        {
            "ActivationSymmetric": symmetric,
            "WeightSymmetric": True,
            "TensorQuantOverrides": overrides,
            # The scale file already widens a weight scale whose bias would overflow int32 (qparams.
            # widen_weights_for_bias); ORT must not widen it again behind the scale file's back.
            "QDQDisableWeightAdjustForInt32Bias": True,
            "QuantizeBias": int32_bias,
            # ORT's default: a quantized Relu or Clip after a quantized node is removed, its clip done by the
            # Q/DQ pair with the activation's own (finer) range. Variants of such a model cannot be derived by
            # dropping Q/DQ pairs (the clip would go with them), so the auto search writes them (search.py).
            "QDQKeepRemovableActivations": False,
            # Off: a tensor is quantized only as the input of a quantized node (the "inputs" placement below).
            "OpTypesToExcludeOutputQuantization": [] if quantize_outputs else list(op_types),
        },
    )
    with ort_logging_summarised():
        quantizer.quantize_model()
    quantizer.model.topological_sort()  # ORT appends Q/DQ nodes at the end; ONNX requires graph order
    written = quantizer.model.model
    if not quantize_outputs:
        # ORT hands every reader of a quantized tensor its dequantized value; here only the quantized nodes get
        # it, so a residual stream or LayerNorm input that also feeds a MatMul stays float, and an excluded
        # node's inputs are really float.
        kept = kept_nodes(written, op_types, exclude_nodes)
        written = keep_quantized(written, onnx.load(str(fp32_path)).graph.initializer, kept, "inputs")
    path = save_onnx(written, out_path, external_data_mb=external_data_mb)
    validate_qdq(path)
    return path


def validate_qdq(path: Path) -> None:
    """``onnx.checker`` and an ORT session on the written Q/DQ model, before anything is published.

    A failure names the node and the cause in full (ORT's own message, never cut).
    """
    from dopt_common.ort import create_session

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        reason = one_line(exc)
        raise ModelError(
            f"the Q/DQ model '{path.name}' is invalid ONNX: {reason}; fix: report it with the model's opset, or "
            "exclude the named node (quantization.exclude_nodes)"
        ) from exc
    create_session(path, threads=1)


@contextlib.contextmanager
def ort_logging_summarised() -> Iterator[None]:
    """ORT's quantizer logs through the root logger at INFO, once per tensor: hold those records, then log each
    distinct notice once, with its count, through this module's logger (warnings stay warnings)."""
    root = logging.getLogger()
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    handler, handlers, level = Hold(), root.handlers[:], root.level
    root.handlers, root.level = [handler], min(level or logging.WARNING, logging.INFO)
    try:
        yield
    finally:
        root.handlers, root.level = handlers, level
        counts: dict[tuple[int, str], int] = {}
        for record in held:
            key = (max(record.levelno, logging.DEBUG), str(record.msg).split("%")[0].split(" '")[0][:80])
            counts[key] = counts.get(key, 0) + 1
        for (levelno, text), count in counts.items():
            log.log(levelno if levelno >= logging.WARNING else logging.DEBUG, "ORT quantizer: %s (x%d)", text, count)


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    names = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(node.input)
        names.update(node.output)
    return names


def read_qdq_scales(path: str | Path, model: onnx.ModelProto | None = None) -> dict[str, TensorScale]:
    """The quantization parameters the Q/DQ model at ``path`` really carries, keyed by the original tensor name.

    ``model`` is that file already loaded, for a caller that reads it anyway.
    """
    model = model if model is not None else onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    found: dict[str, TensorScale] = {}
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.input[0] == "":
            continue
        source = node.input[0]
        if node.op_type == "QuantizeLinear":
            name, role = source.removesuffix(OUTPUT_SUFFIX), "activation"
        elif source in inits and inits[source].data_type in QTYPE_NAMES:
            name = source.removesuffix(INITIALIZER_SUFFIX)
            role = "bias" if inits[source].data_type == onnx.TensorProto.INT32 else "weight"
        else:
            continue  # the DQ half of an activation pair: its Q node was read already
        entry = _entry_from_node(node, inits, name, role)
        previous = found.get(name)
        if previous is not None and (previous.scale_bits, previous.zero_point) != (entry.scale_bits, entry.zero_point):
            raise ModelError(f"Q/DQ model '{path}': tensor '{name}' is quantized twice with different scales")
        found[name] = entry
    return found


def _entry_from_node(node: onnx.NodeProto, inits: dict, name: str, role: str) -> TensorScale:
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32).reshape(-1)
    if len(node.input) > 2 and node.input[2]:
        zp_init = inits[node.input[2]]
        zero = numpy_helper.to_array(zp_init).reshape(-1)
        dtype = QTYPE_NAMES.get(zp_init.data_type, str(zp_init.data_type))
    else:
        zero, dtype = np.zeros(scale.size, dtype=np.int64), "uint8"
    if role in ("weight", "bias"):
        dtype = QTYPE_NAMES.get(inits[node.input[0]].data_type, dtype)
    # Per-channel is the scale's rank, not its size: a weight with one output channel (YOLO's DFL conv) carries
    # a [1]-shaped scale with an axis, a per-tensor scale is a scalar.
    # ORT writes a one-channel bias's [1] scale without an axis attribute: a 1-D tensor has only axis 0.
    per_channel = len(inits[node.input[1]].dims) > 0 and (scale.size > 1 or role != "activation")
    data = inits.get(node.input[0])
    default = 0 if data is not None and len(data.dims) == 1 else 1
    axis = next((a.i for a in node.attribute if a.name == "axis"), default) if per_channel else None
    if axis is not None and axis < 0:
        axis += len(inits[node.input[0]].dims) if node.input[0] in inits else 0
    return TensorScale(
        name, role, dtype, tuple(float(s) for s in scale), tuple(int(z) for z in zero), axis, method="readback"
    )


@dataclass(frozen=True)
class ScaleDiff:
    """Where an artifact and the scale file disagree."""

    drifted: tuple[str, ...]
    missing_in_artifact: tuple[str, ...]
    missing_in_file: tuple[str, ...]
    first: str = ""  # the first drifted tensor, declared against written, with the likely cause

    @property
    def ok(self) -> bool:
        """True when the artifact carries exactly the scale file."""
        return not (self.drifted or self.missing_in_artifact or self.missing_in_file)

    def summary(self) -> str:
        """One line naming the first offending tensors."""
        parts = named_counts(
            (
                ("drifted", self.drifted),
                ("missing from artifact", self.missing_in_artifact),
                ("missing from scales.json", self.missing_in_file),
            )
        )
        return "; ".join(parts + ([self.first] if self.first else [])) or "all equal"


def compare_scales(expected: Mapping[str, TensorScale], actual: Mapping[str, TensorScale]) -> ScaleDiff:
    """Compare bit for bit: scale bits, zero points, dtype and axis."""
    drifted = [
        name
        for name in sorted(set(expected) & set(actual))
        if (expected[name].scale_bits, expected[name].zero_point, expected[name].dtype, expected[name].axis)
        != (actual[name].scale_bits, actual[name].zero_point, actual[name].dtype, actual[name].axis)
    ]
    first = explain_drift(expected[drifted[0]], actual[drifted[0]]) if drifted else ""
    return ScaleDiff(
        tuple(drifted),
        tuple(sorted(set(expected) - set(actual))),
        tuple(sorted(set(actual) - set(expected))),
        first,
    )


def explain_drift(declared: TensorScale, written: TensorScale) -> str:
    """One tensor's declared and written parameters side by side, and what most likely made them differ."""

    def shown(t: TensorScale) -> str:
        scales = ", ".join(t.scale_bits[:3]) + (" …" if len(t.scale) > 3 else "")
        zeros = ", ".join(str(z) for z in t.zero_point[:3]) + (" …" if len(t.zero_point) > 3 else "")
        return f"{t.dtype} scale [{scales}] ({len(t.scale)}) zero point [{zeros}] axis {t.axis}"

    if declared.dtype != written.dtype:
        cause = "the writer chose another integer type (check quantization.activations against the targets)"
    elif declared.axis != written.axis:
        cause = "per-channel against per-tensor: a weight with one output channel, or a writer that dropped the axis"
    elif len(declared.scale) != len(written.scale):
        cause = "the channel count differs: the weight was reshaped or shared by nodes with other axes"
    elif declared.zero_point != written.zero_point:
        cause = "the zero point was recomputed by the writer (a range or scheme override it did not take)"
    else:
        cause = "the scale was recomputed by the writer (an override it ignored, or a weight it re-scaled for bias)"
    return f"'{declared.name}' ({declared.role}): declared {shown(declared)}; written {shown(written)}; likely: {cause}"
