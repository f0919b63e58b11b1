"""The one swappable W4A16 engine: GPTQ, AWQ or RTN over a Hugging Face decoder model, layer by layer.

Why our own engine: it is deploy_opt's implementation of the published algorithms in plain torch
(``calibrators/groupwise/``: ``gptq.py``, ``awq.py``, ``rtn.py``), so it installs with nothing
extra and runs on a CPU. llm-compressor pins transformers 5.17 and its AWQ fails on CPU in ``pin_memory``;
auto-gptq is archived and AutoAWQ deprecated; gptqmodel installs only with ``--no-deps``. Everything the rest
of deploy_opt needs goes through ``quantize_model`` and ``EngineResult``, so a library engine can replace this
module alone. ``benchmarks/llm/gptq_crosscheck.py`` checks the GPTQ core against llm-compressor's on a real layer.

The walk is GPTQ's sequential one (llm-compressor's "sequential pipeline"): catch the inputs of layer 0 and the
keyword arguments the model passes each layer (position embeddings and attention mask, built per layer type:
``llm/layer_walk.py``); then for each decoder layer run the float layer over every sample with hooks that
accumulate each Linear's input Gram matrix H, quantize the layer's Linears from H, write the dequantized weights
back in place, and run the now-quantized layer again to make the next layer's inputs, so later layers calibrate on
the errors of earlier ones.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from calibrators.groupwise.gptq import HessianAccumulator, gptq_quantize
from calibrators.groupwise.rtn import (
    QuantizedWeight,
    check_bits,
    check_group_size,
    output_error,
    rtn_quantize,
    weight_error,
)
from deploy_opt.llm.layer_walk import advance, catch_layer_inputs, decoder_layers
from dopt_common.errors import ConfigError, InputError

log = logging.getLogger(__name__)
METHODS = ("gptq", "awq", "awq-gptq", "rtn")
RTN_ERROR_SAMPLES = 8  # RTN rounds from the weights alone; these samples only measure its output error


@dataclass(frozen=True)
class LinearRecord:
    """What quantizing one Linear did: relative errors on its weight and on its calibration outputs."""

    name: str
    shape: tuple[int, int]
    method: str
    weight_error: float  # ||W - Wq|| / ||W||
    output_error: float  # ||X(W - Wq)ᵀ||² / ||XWᵀ||² over the calibration tokens
    seconds: float


@dataclass(frozen=True)
class EngineResult:
    """Per-Linear records and quantized weights of one run; the model now holds the dequantized weights."""

    method: str
    bits: int
    group_size: int
    desc_act: bool
    sym: bool
    records: tuple[LinearRecord, ...]
    weights: Mapping[str, QuantizedWeight]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (weights left out)."""
        return {
            "method": self.method,
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "seconds": round(self.seconds, 3),
            "layers": [
                {
                    "name": r.name,
                    "shape": list(r.shape),
                    "weight_error": r.weight_error,
                    "output_error": r.output_error,
                    "seconds": round(r.seconds, 4),
                }
                for r in self.records
            ],
        }


def is_kept(name: str, keep: Iterable[str]) -> bool:
    """True when a ``keep`` pattern is a substring of ``name`` or matches it as a glob."""
    return any(pattern in name or fnmatch.fnmatchcase(name, pattern) for pattern in keep)


def layer_prefix(model: torch.nn.Module) -> str:
    """The state-dict prefix of the decoder layers: ``model.layers`` for Llama-family models."""
    layers = decoder_layers(model)
    return next(name for name, module in model.named_modules() if module is layers)


def target_linears(model: torch.nn.Module, keep: Sequence[str]) -> dict[str, torch.nn.Linear]:
    """Every Linear inside the decoder layers whose name matches no ``keep`` pattern, by full name."""
    layers, prefix = decoder_layers(model), layer_prefix(model)
    return {
        f"{prefix}.{name}": module
        for name, module in layers.named_modules()
        if isinstance(module, torch.nn.Linear) and not is_kept(f"{prefix}.{name}", keep)
    }


def check_targets(targets: Mapping[str, torch.nn.Linear], group_size: int) -> None:
    """Refuse, before any work, a group size that does not divide some Linear's input features."""
    for name, module in targets.items():
        check_group_size(name, module.in_features, group_size)


def _check_samples(samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Samples as [1, seq] int64 tensors, or InputError."""
    if not samples:
        raise InputError("no calibration samples; fix: pass at least one [1, seq] tensor of token ids")
    checked = []
    for index, sample in enumerate(samples):
        if not isinstance(sample, torch.Tensor) or sample.dtype.is_floating_point or sample.dim() != 2:
            raise InputError(f"calibration sample {index} must be a [1, seq] tensor of token ids")
        if sample.shape[0] != 1 or sample.shape[1] == 0:
            raise InputError(f"calibration sample {index} has shape {tuple(sample.shape)}; expected [1, seq]")
        checked.append(sample.long())
    return checked


def _collect_stats(
    layer: torch.nn.Module, names: Mapping[str, str], inputs: list[tuple[torch.Tensor, dict]]
) -> tuple[dict[str, HessianAccumulator], dict[str, str]]:
    """Input statistics per Linear (local name → accumulator) and which Linears share one input (name → leader)."""
    stats: dict[str, HessianAccumulator] = {}
    leader: dict[str, str] = {}
    # id of an input tensor of the current sample → (first Linear that read it, the tensor). Holding the tensor
    # keeps its id from being reused by a later input within the sample.
    seen: dict[int, tuple[str, torch.Tensor]] = {}

    def make_hook(local: str):
        def hook(module, args, output):
            x = args[0]
            if local not in leader:
                leader[local] = seen.setdefault(id(x), (local, x))[0]
            if leader[local] == local:
                stats.setdefault(local, HessianAccumulator(x.shape[-1])).add(x)

        return hook

    handles = [layer.get_submodule(local).register_forward_hook(make_hook(local)) for local in names]
    try:
        for hidden, kwargs in inputs:
            seen.clear()
            layer(hidden, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return stats, leader


@dataclass(frozen=True)
class EngineSettings:
    """How the engine quantizes: the method, the code width and group, and what it leaves float.

    ``sym=None`` takes the method's usual choice: symmetric for gptq and rtn, asymmetric for awq (AutoAWQ).
    ``desc_act`` and ``static_groups`` only apply to gptq (see ``calibrators/groupwise/gptq.py``: with static groups
    the act-order stays inside the algorithm and the checkpoint has sequential g_idx). Modules whose name matches a
    ``keep`` pattern are left as they are.
    """

    method: str = "gptq"  # "gptq" | "awq" | "rtn"
    bits: int = 4
    group_size: int = 128
    desc_act: bool = True
    sym: bool | None = None
    keep: tuple[str, ...] = ("embed_tokens", "lm_head")
    percdamp: float = 0.01
    static_groups: bool = False

    @property
    def symmetric(self) -> bool:
        """``sym``, or the method's usual choice when it is None."""
        return (not self.method.startswith("awq")) if self.sym is None else self.sym


def _round_linear(layer: torch.nn.Module, local: str, stats: Any, rounding: EngineSettings) -> tuple:
    """(float reference, codes, Hessian, seconds) of one Linear rounded by GPTQ or RTN."""
    start = time.perf_counter()
    # The live weight itself (no copy: neither method writes to it, and _apply_codes measures before replacing it).
    reference = layer.get_submodule(local).weight.detach().float()
    hessian = stats.hessian()
    if rounding.method == "gptq":
        codes = gptq_quantize(
            reference,
            hessian,
            bits=rounding.bits,
            group_size=rounding.group_size,
            sym=rounding.symmetric,
            desc_act=rounding.desc_act,
            percdamp=rounding.percdamp,
            static_groups=rounding.static_groups,
        )
    else:
        codes = rtn_quantize(reference, rounding.bits, rounding.group_size, rounding.symmetric)
    return reference, codes, hessian, time.perf_counter() - start


def _apply_codes(
    layer: torch.nn.Module, names: dict[str, str], done: dict[str, tuple], weights: dict, method: str
) -> list[LinearRecord]:
    """Write each Linear's dequantized weight back, keep its codes in ``weights``, and record its errors."""
    records = []
    for local in list(done):
        reference, codes, hessian, seconds = done.pop(local)  # each Linear's copies go as soon as it is done
        approx = codes.dequantize()
        record = LinearRecord(
            name=names[local],
            shape=tuple(reference.shape),
            method=method,
            weight_error=weight_error(reference, approx),
            output_error=output_error(reference, approx, hessian),
            seconds=seconds,
        )
        layer.get_submodule(local).weight.copy_(approx)  # after measuring: reference may be this very weight
        weights[names[local]] = codes
        records.append(record)
    return records


@dataclass(frozen=True)
class LayerSource:
    """Where the walk's decoder layers come from, and what happens to each once its codes are final.

    ``load(i)`` returns decoder layer i in float32 on the compute device; ``release(i, layer, weights)`` gets the
    finished layer (dequantized weights in place) and its codes. ``keep_codes`` False: the result's ``weights``
    stays empty (the release wrote them; a model larger than memory cannot hold them all).
    """

    load: Callable[[int], torch.nn.Module]
    release: Callable[[int, torch.nn.Module, dict[str, QuantizedWeight]], None]
    keep_codes: bool = True


def resident_layers(model: torch.nn.Module) -> LayerSource:
    """The model's own layers (the whole model is in memory)."""
    layers = decoder_layers(model)
    return LayerSource(load=lambda index: layers[index], release=lambda index, layer, weights: None)


def _prepare(model: torch.nn.Module, source: LayerSource | None) -> LayerSource:
    """The in-memory model cast to float32 once, or the given source (which loads float32 layers itself)."""
    model.eval()
    if source is not None:
        return source
    if any(p.dtype != torch.float32 for p in model.parameters()):
        log.info("casting the model to float32 for quantization")
        model.float()
    return resident_layers(model)


def _quantize_layer(
    layer: torch.nn.Module, names: dict[str, str], inputs: list[tuple], settings: EngineSettings, codes: dict
) -> list[LinearRecord]:
    """Quantize one layer's target Linears in place (their codes into ``codes``); their records.

    GPTQ and RTN round one Linear at a time and replace its weight at once (every Hessian was collected on the
    float layer first), so only one Linear's copies are alive; AWQ rescales across Linears and rounds them after.
    """
    stats, leader = _collect_stats(layer, names, inputs)
    if settings.method in ("awq", "awq-gptq"):
        from deploy_opt.llm.awq_layer import quantize_awq_layer

        done = quantize_awq_layer(
            layer,
            names,
            stats,
            leader,
            bits=settings.bits,
            group_size=settings.group_size,
            sym=settings.symmetric,
            rounding="gptq" if settings.method == "awq-gptq" else "rtn",
            percdamp=settings.percdamp,
        )
        return _apply_codes(layer, names, done, codes, settings.method)
    records = []
    for local in names:
        done = {local: _round_linear(layer, local, stats[leader[local]], settings)}
        records += _apply_codes(layer, names, done, codes, settings.method)
    return records


@torch.no_grad()
def quantize_model(
    model: torch.nn.Module,
    samples: Sequence[torch.Tensor],
    settings: EngineSettings = EngineSettings(),
    *,
    progress: bool = True,
    source: LayerSource | None = None,
) -> EngineResult:
    """Quantize every decoder-layer Linear of ``model`` in place (dequantized float32 weights) and return codes.

    ``source`` None: the whole model is in memory (cast to float32 first). A ``LayerSource`` (``llm/onload.py``)
    brings one layer at a time onto the compute device instead. RTN reads no statistics to round, so it walks
    only the first ``RTN_ERROR_SAMPLES`` samples, for its output-error records. Norms are never quantized (awq
    rescales them); see ``EngineSettings`` for the choices.
    """
    method, bits, group_size = settings.method, settings.bits, settings.group_size
    if method not in METHODS:
        raise ConfigError(f"method '{method}' is not an engine method; use one of {', '.join(METHODS)}")
    check_bits(bits)
    samples = _check_samples(samples)
    if method == "rtn":
        samples = samples[:RTN_ERROR_SAMPLES]
    targets = target_linears(model, settings.keep)
    check_targets(targets, group_size)
    from tqdm.auto import tqdm

    source = _prepare(model, source)
    started = time.perf_counter()
    layers, prefix = decoder_layers(model), layer_prefix(model)
    inputs = catch_layer_inputs(model, samples)
    records: list[LinearRecord] = []
    weights: dict[str, QuantizedWeight] = {}
    for index in tqdm(range(len(layers)), desc=f"{method} layers", disable=not progress):
        layer = source.load(index)
        names = {
            local: f"{prefix}.{index}.{local}"
            for local, _ in layer.named_modules()
            if f"{prefix}.{index}.{local}" in targets
        }
        codes: dict[str, QuantizedWeight] = {}
        if names:
            records += _quantize_layer(layer, names, inputs.of_layer(index), settings, codes)
        if index + 1 < len(layers):
            advance(layer, index, inputs)
        source.release(index, layer, codes)
        if source.keep_codes:
            weights.update(codes)
    seconds = time.perf_counter() - started
    log.info("%s: %d Linears quantized in %.1f s", method, len(records), seconds)
    return EngineResult(
        method=method,
        bits=bits,
        group_size=group_size,
        desc_act=settings.desc_act and method == "gptq",
        sym=settings.symmetric,
        records=tuple(records),
        weights=weights,
        seconds=seconds,
    )
