"""Layer-wise onloading: a decoder model read from its safetensors shards one layer at a time.

``open_folder`` reads config.json and the shard index; ``load_skeleton`` builds the model on the meta device and
materialises only what lives outside the decoder layers (embeddings, final norm, lm_head, rotary tables), in
float32 on the compute device. ``layer_source`` then hands the engine (``quantize_engine.LayerSource``) decoder
layer i read from the shards in float32, whatever dtype they are stored in, and returns it to the meta device once
it is done. Peak memory is one float32 layer, the resident modules and the activations, whatever the depth.

``checkpoint_source`` reads the layers back from a written gptq/awq checkpoint (dequantized), so the quantized
model's perplexity is measured on the file itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from calibrators.groupwise.rtn import QuantizedWeight
from deploy_opt.llm.layer_walk import advance, catch_layer_inputs, decoder_layers
from deploy_opt.llm.quantize_engine import LayerSource, layer_prefix
from dopt_common.deps import require
from dopt_common.errors import CheckpointError, ModelError
from dopt_common.files import regular_input
from dopt_common.weights import SAFETENSORS_HEADER_CAP, open_safetensors
from exporters.shards import INDEX_FILE, SINGLE_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardedFolder:
    """A Hugging Face folder's tensors: which shard holds each name."""

    folder: Path
    files: Mapping[str, Path]

    @property
    def total_bytes(self) -> int:
        """Bytes of the shards on disk (the stored dtype's size)."""
        return sum(path.stat().st_size for path in set(self.files.values()))

    def read(self, names: list[str], device: str, dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
        """The named tensors on ``device``; floating ones cast to ``dtype`` (None: as stored)."""
        out: dict[str, torch.Tensor] = {}
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        for path, group in by_file.items():
            with open_safetensors(path) as handle:
                for name in group:
                    tensor = handle.get_tensor(name)
                    if dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    out[name] = tensor.to(device)
        return out

    def under(self, prefix: str) -> list[str]:
        """Names that start with ``prefix``, sorted."""
        return sorted(name for name in self.files if name.startswith(prefix))


def open_folder(folder: str | Path) -> ShardedFolder:
    """The shard map of a folder with ``model.safetensors`` or ``model.safetensors.index.json``, or ModelError."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        regular_input(index, "safetensors index", max_bytes=SAFETENSORS_HEADER_CAP)  # no FIFO, device or giant
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict):
                raise ValueError(f"weight_map is a {type(weight_map).__name__}, not an object")
            outside = [f for f in weight_map.values() if not isinstance(f, str) or Path(f).name != f or f in ("", "..")]
            if outside:
                raise ValueError(f"it names shard {str(outside[0])[:80]!r}, not a file in the folder")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"'{index}' is not a safetensors index ({exc}); fix: re-save the model") from exc
        return ShardedFolder(folder, {name: folder / file for name, file in weight_map.items()})
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise ModelError(
            f"'{folder}' has no {SINGLE_FILE} or {INDEX_FILE}; layer-wise onloading reads safetensors; fix: re-save "
            "the model with save_pretrained(folder, safe_serialization=True), or set model.onload: memory"
        )
    with open_safetensors(single) as handle:
        return ShardedFolder(folder, {name: single for name in handle.keys()})  # noqa: SIM118


def _init_buffers(model: Any, module: torch.nn.Module, name: str, device: str) -> None:
    """Fill ``module``'s computed buffers (Gemma's embedding scale) with the model's own weight init, which skips
    the loaded parameters (transformers' ``_is_hf_initialized`` flag)."""
    meta = [key for key, buffer in module._buffers.items() if buffer is not None and buffer.is_meta]
    for key in meta:  # NaN until the init fills it, so a buffer the init does not know is caught below
        buffer = module._buffers[key]
        module._buffers[key] = (
            torch.full_like(buffer, float("nan"), device=device)
            if buffer.is_floating_point()
            else torch.zeros_like(buffer, device=device)
        )
    params = [p for p in module.parameters(recurse=False) if not getattr(p, "_is_hf_initialized", False)]
    for param in params:
        param._is_hf_initialized = True
    try:
        if hasattr(model, "_init_weights"):
            model._init_weights(module)
    finally:
        for param in params:
            del param._is_hf_initialized
    unset = [key for key in meta if module._buffers[key].is_floating_point() and module._buffers[key].isnan().any()]
    if unset:
        raise ModelError(f"cannot rebuild {type(module).__name__} ({name}) buffers {unset} off the meta device")


def _rebuild_buffers(model: torch.nn.Module, prefix: str, device: str) -> None:
    """Recreate the buffers outside the layers that are computed, not stored (rotary tables, Gemma's embed scale)."""
    for name, module in list(model.named_modules()):
        if name.startswith(f"{prefix}.") or not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        try:
            fresh = type(module)(config=model.config).to(device)
        except TypeError:  # not built from the config alone (Gemma's scaled embedding): keep it, fill its buffers
            _init_buffers(model, module, name, device)
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, fresh)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def map_large_allocations() -> None:
    """Make glibc serve every allocation of 1 MiB or more by mmap, so a freed layer goes back to the system.

    By default glibc raises its mmap threshold after the first large free, and later layer-sized tensors come
    from the heap, whose freed space the process keeps: on a 4-layer 2048-wide Llama that held peak RSS at
    2.17 GB instead of 1.86 GB. No-op where the C library is not glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except OSError:
        pass


def load_skeleton(folder: ShardedFolder, device: str = "cpu") -> Any:
    """The model with its decoder layers on the meta device and everything else read in float32 on ``device``."""
    map_large_allocations()
    transformers = require("transformers", purpose="layer-wise onloading", extra="llm")
    config = transformers.AutoConfig.from_pretrained(folder.folder, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    prefix = layer_prefix(model)
    rest = [name for name in folder.files if not name.startswith(f"{prefix}.")]
    model.load_state_dict(folder.read(rest, device), strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    _rebuild_buffers(model, prefix, device)
    if (folder.folder / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder.folder)
    missing = [n for n, p in model.named_parameters() if p.is_meta and not n.startswith(f"{prefix}.")]
    if missing:
        raise ModelError(f"'{folder.folder}' does not hold {missing[:5]}; fix: pass a complete model folder")
    return model.eval()


def _fill(layer: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> torch.nn.Module:
    result = layer.load_state_dict(state, strict=False, assign=True)
    missing = [n for n, p in layer.named_parameters() if p.is_meta]
    if missing or result.unexpected_keys:
        raise ModelError(
            f"{where} does not fill its layer: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    return layer


def _unload(layer: torch.nn.Module) -> None:
    layer.to_empty(device="meta")


def layer_source(
    folder: ShardedFolder,
    model: Any,
    device: str = "cpu",
    on_done: Callable[[int, torch.nn.Module, dict[str, QuantizedWeight]], None] | None = None,
) -> LayerSource:
    """Decoder layers read one at a time from ``folder`` in float32; ``on_done`` sees each finished layer."""
    layers, prefix = decoder_layers(model), layer_prefix(model)

    def load(index: int) -> torch.nn.Module:
        start = f"{prefix}.{index}."
        state = {name[len(start) :]: t for name, t in folder.read(folder.under(start), device).items()}
        return _fill(layers[index], state, f"'{folder.folder}' layer {index}")

    def release(index: int, layer: torch.nn.Module, codes: dict[str, QuantizedWeight]) -> None:
        if on_done is not None:
            on_done(index, layer, codes)
        _unload(layer)

    return LayerSource(load=load, release=release, keep_codes=False)


def _dequantized(tensors: dict[str, torch.Tensor], qconfig: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A checkpoint layer's tensors with each Linear's packed codes replaced by its float32 weight."""
    from exporters.lmdeploy import unpack_awq, unpack_gptq

    out = {k: v for k, v in tensors.items() if not k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    for key in [k for k in tensors if k.endswith(".qweight")]:
        base = key[: -len(".qweight")]
        parts = {
            s: tensors[f"{base}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx") if f"{base}.{s}" in tensors
        }
        group = int(qconfig["group_size"])
        qw: QuantizedWeight = (
            unpack_gptq(parts, bits=int(qconfig["bits"]), group_size=group, sym=bool(qconfig.get("sym", True)))
            if qconfig["quant_method"] == "gptq"
            else unpack_awq(parts, group_size=group)
        )
        out[f"{base}.weight"] = qw.dequantize()
    return out


def checkpoint_source(checkpoint: ShardedFolder, model: Any, device: str = "cpu") -> LayerSource:
    """Decoder layers read back from a gptq/awq checkpoint, dequantized to float32 (what the file serves)."""
    try:
        qconfig = json.loads((checkpoint.folder / "config.json").read_text(encoding="utf-8"))["quantization_config"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"'{checkpoint.folder}' has no quantization_config ({exc})") from exc
    layers, prefix = decoder_layers(model), layer_prefix(model)

    def load(index: int) -> torch.nn.Module:
        start = f"{prefix}.{index}."
        stored = checkpoint.read(checkpoint.under(start), "cpu", dtype=None)
        state = {name[len(start) :]: t.float().to(device) for name, t in _dequantized(stored, qconfig).items()}
        return _fill(layers[index], state, f"checkpoint '{checkpoint.folder}' layer {index}")

    return LayerSource(load=load, release=lambda index, layer, codes: _unload(layer), keep_codes=False)


@torch.no_grad()
def streamed_perplexity(model: Any, source: LayerSource, tokenizer: Any, docs: Any, window: Any) -> dict[str, Any]:
    """``checks.perplexity`` with one decoder layer resident at a time: every window advances through layer i (with
    the arguments the model gives layer i) before layer i + 1 is read. Same windows, same scoring (no simulated KV
    cache: that needs the cached path)."""
    from deploy_opt.llm.checks import perplexity_record, plan_windows, window_nll

    plan = plan_windows(tokenizer, docs, window)
    device = model.get_input_embeddings().weight.device
    chunks = [torch.tensor([plan.window(n)], dtype=torch.long, device=device) for n in range(len(plan.spans))]
    inputs = catch_layer_inputs(model, chunks)
    for index in range(len(decoder_layers(model))):
        layer = source.load(index)
        advance(layer, index, inputs)
        source.release(index, layer, {})
    norm, head = getattr(model.model, "norm", None), model.get_output_embeddings()
    if norm is None or head is None:
        raise ModelError(f"{type(model).__name__} has no model.norm and lm_head; streamed perplexity needs both")
    nll_sum, scored, per_window = 0.0, 0, []
    for number, (hidden, chunk, span) in enumerate(zip(inputs.hidden, chunks, plan.spans, strict=True)):
        nll, count = window_nll(head(norm(hidden)), chunk, span, number)
        nll_sum, scored = nll_sum + nll, scored + count
        per_window.append((nll, count))
    return perplexity_record(plan, window, nll_sum, scored, per_window)


def quantize_streamed(
    folder: ShardedFolder,
    model: Any,
    samples: list[torch.Tensor],
    settings: Any,
    writer: Any,
    *,
    device: str = "cpu",
    progress: bool = True,
) -> Any:
    """Run the engine on ``folder``'s layers one at a time, each written by ``writer`` (``CheckpointWriter``)
    as soon as its codes are final; the caller finishes the writer with the skeleton ``model``."""
    from deploy_opt.llm.quantize_engine import quantize_model

    prefix = layer_prefix(model)

    def write(index: int, layer: torch.nn.Module, codes: dict[str, QuantizedWeight]) -> None:
        writer.add_layer(f"{prefix}.{index}", layer, codes)

    source = layer_source(folder, model, device, on_done=write)
    return quantize_model(model, samples, settings, progress=progress, source=source)
