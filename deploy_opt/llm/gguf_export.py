"""``quantize-llm --format gguf``: the W4 codes as a GGUF file llama.cpp and Ollama load, verified by reading it back.

- **Type, chosen to match the weights** (group 32, no act-order): symmetric 4-bit codes (zero point 8) are ``Q4_0``,
  asymmetric ones ``Q4_1`` (``m = -zero * scale``); ``Q8_0`` is the 8-bit symmetric type (no method here writes
  8-bit codes yet).
- **The in-memory model is the file's model:** before the checks run, each quantized Linear is set to exactly what
  its GGUF blocks decode to (fp16 ``d`` and ``m``), so the perplexity and stability measured are the file's.
- **Metadata and the other tensors** (embeddings, norms) come from the source GGUF byte for byte
  (``exporters.gguf.write_gguf``). A Hugging Face folder (``hf_gguf.WRITTEN``; byte-level BPE tokenizer) is
  first written as an F32 GGUF source the way llama.cpp's ``convert_hf_to_gguf.py`` lays one out (``hf_gguf.py``).
- **Read back once** with the gguf package's own dequantizer: every tensor is compared with the in-memory weight
  (q/k rows put back from llama.cpp's rotary order) and then copied into the model, so the checks measure the
  file; then, if ``llama-cpp-python`` is installed, llama.cpp loads the file and answers.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calibrators.groupwise.rtn import QuantizedWeight
from deploy_opt.llm.architectures import norm_offset, qk_heads
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

GGUF_GROUP = 32
GGUF_NAME = "model.gguf"
MAX_PPL_GAP = 0.01  # the file, as a user's reader loads it, against the in-process model: relative perplexity
READ_BACK_WINDOWS = 4  # evaluation windows the file is scored on


def gguf_type(weight: QuantizedWeight) -> str:
    """Q4_0 or Q4_1 for these codes; ConfigError naming what GGUF cannot hold."""
    if weight.group_size != GGUF_GROUP or weight.act_order:
        raise ConfigError(
            f"GGUF blocks are 32 consecutive weights: the codes have group {weight.group_size}"
            f"{' with act-order' if weight.act_order else ''}; fix: --group-size 32 --no-desc-act"
        )
    if weight.bits != 4:
        raise ConfigError(f"GGUF export writes 4-bit codes here, got {weight.bits}-bit")
    return "Q4_0" if weight.sym and bool((weight.zeros == 8).all()) else "Q4_1"


def block_params(weight: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(codes [out, in] uint8, d [out, blocks] fp16, m [out, blocks] fp16 or zeros, type)."""
    qtype = gguf_type(weight)
    codes = weight.qweight.to(torch.uint8).cpu().numpy()
    d = weight.scales.t().contiguous().cpu().numpy().astype(np.float16)
    m = (-(weight.zeros.float() * weight.scales.float())).t().contiguous().cpu().numpy().astype(np.float16)
    return codes, d, (m if qtype == "Q4_1" else np.zeros_like(d)), qtype


def decoded_weight(weight: QuantizedWeight) -> torch.Tensor:
    """The float32 weight [out, in] that the GGUF blocks of these codes decode to (fp16 ``d`` and ``m``)."""
    codes, d, m, qtype = block_params(weight)
    q = codes.astype(np.float32).reshape(codes.shape[0], -1, GGUF_GROUP)
    d32, m32 = d.astype(np.float32)[..., None], m.astype(np.float32)[..., None]
    values = (q - 8.0) * d32 if qtype == "Q4_0" else q * d32 + m32
    return torch.from_numpy(values.reshape(codes.shape))


def match_gguf_weights(model: torch.nn.Module, weights: dict[str, QuantizedWeight]) -> None:
    """Set each quantized Linear of ``model`` to exactly its GGUF decoding (checked before any long step)."""
    for name, weight in weights.items():
        module = model.get_submodule(name.removesuffix(".weight"))
        module.weight.data.copy_(decoded_weight(weight))


def export_gguf(
    model: torch.nn.Module, weights: dict[str, QuantizedWeight], source: Path, out_dir: Path, tokenizer: Any = None
) -> dict[str, Any]:
    """Write ``out_dir/model.gguf`` from the source GGUF and the codes, read it back into ``model`` (which then
    holds what the file decodes to), and report. A Hugging Face folder source is first written as an F32 GGUF
    from ``model`` and ``tokenizer`` (``hf_gguf.py``), whose metadata the file then carries."""
    if source.suffix == ".gguf":
        return _export(model, weights, source, out_dir)
    from deploy_opt.llm.hf_gguf import write_hf_gguf
    from dopt_common.files import scratch_dir

    if tokenizer is None:
        raise ConfigError(f"--format gguf from the folder '{source}' needs its tokenizer; fix: add tokenizer.json")
    with scratch_dir("deploy_opt.gguf.") as tmp:
        f32 = write_hf_gguf(model, tokenizer, Path(tmp) / "source.f32.gguf", name=source.name)
        return {**_export(model, weights, f32, out_dir), "source": "written from the Hugging Face folder"}


def _export(model: torch.nn.Module, weights: dict[str, QuantizedWeight], source: Path, out_dir: Path) -> dict[str, Any]:
    from exporters.gguf import pack_q4_0, pack_q4_1, permute_qk, read_gguf, write_gguf

    arch, names = _gguf_names(source, weights)
    heads = _head_counts(model)
    floats, float_names = changed_floats(model, source, set(weights), arch, heads)
    packed: dict[str, Any] = dict(floats)
    for hf_name, weight in weights.items():
        codes, d, m, qtype = block_params(weight)
        gguf_name = names[hf_name]
        n_head = qk_heads(arch, gguf_name, heads)
        if n_head is not None:
            codes, d, m = (permute_qk(a, n_head) for a in (codes, d, m))
        packed[gguf_name] = pack_q4_0(codes, d) if qtype == "Q4_0" else pack_q4_1(codes, d, m)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / GGUF_NAME
    written = write_gguf(source, path, packed)
    check = read_back(model, read_gguf(path), {**names, **float_names}, arch, heads)
    log.info(
        "wrote %s (%.1f MB, %s): read back %s",
        path.name,
        written["bytes"] / 1e6,
        ", ".join(written["types"]),
        "exactly" if check["exact"] else f"with max |diff| {check['max_abs_diff']:.3g}",
    )
    return {"file": GGUF_NAME, **written, "read_back": check, "llama_cpp": llama_cpp_check(path)}


def _gguf_names(source: Path, weights: dict[str, QuantizedWeight]) -> tuple[str, dict[str, str]]:
    """The architecture and each quantized Linear's GGUF tensor name (gguf's own HF → GGUF name map)."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in by_name:
        raise ConfigError(f"GGUF architecture {arch!r} is unknown to the gguf package; fix: update gguf")
    table = gguf.get_tensor_name_map(by_name[arch], blocks)
    names = {}
    for hf_name in weights:
        mapped = table.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ConfigError(f"no GGUF tensor name for {hf_name} in a {arch} model; fix: use the lmdeploy format")
        names[hf_name] = mapped if mapped.endswith(".weight") else mapped + ".weight"
    return arch, names


def changed_floats(
    model: torch.nn.Module, source: Path, quantized: set[str], arch: str, heads: tuple[int, int]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The model's other tensors that differ from the source GGUF's (AWQ folds its scales into the norms), as F32
    arrays in GGUF row order and convention (Gemma's norms as ``1 + w``) by GGUF name; and every other mapped
    tensor's name, for the read-back check. The source is compared as transformers reads it (``1 + w`` less 1)."""
    import gguf

    from exporters.gguf import permute_qk, read_gguf

    stored = read_gguf(source)
    table = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch], len(stored))
    changed, names = {}, {}
    for name, tensor in model.state_dict().items():
        module = name.removesuffix(".weight").removesuffix(".bias")
        if module in quantized:
            continue
        mapped = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None or mapped not in stored:
            continue  # e.g. a tied lm_head: the file has token_embd only
        names[module + ".weight" if name.endswith(".weight") else name] = mapped
        values = tensor.detach().float().cpu().numpy()
        n_head = qk_heads(arch, mapped, heads)
        if n_head is not None:
            values = permute_qk(values, n_head)
        offset, source = np.float32(norm_offset(arch, name)), stored[mapped].reshape(values.shape)
        # unchanged: the source as transformers reads it (a GGUF source), or the model as llama.cpp stores it (one
        # written from a folder); ``w`` and ``1 + w`` do not round-trip in float32 both ways
        if not (np.array_equal(source - offset, values) or np.array_equal(source, values + offset)):
            changed[mapped] = values + offset
    if changed:
        log.info(
            "%d unquantized tensors differ from the source GGUF (e.g. AWQ's folded norms): written as F32", len(changed)
        )
    return changed, names


def _head_counts(model: torch.nn.Module) -> tuple[int, int]:
    config = model.config
    heads = int(config.num_attention_heads)
    return heads, int(getattr(config, "num_key_value_heads", None) or heads)


def read_back(
    model: torch.nn.Module, tensors: dict[str, np.ndarray], names: dict[str, str], arch: str, heads: tuple[int, int]
) -> dict[str, Any]:
    """Compare every tensor of the file (dequantized by the gguf package, less llama.cpp's norm offset) with the
    model's weight, then put the file's values into the model, so the checks that follow measure the file."""
    from exporters.gguf import unpermute_qk

    worst, inexact = 0.0, []
    params = dict(model.named_parameters())
    for hf_name, gguf_name in names.items():
        param = params[hf_name if hf_name in params else hf_name.removesuffix(".weight") + ".weight"]
        values = tensors[gguf_name].reshape(param.shape)
        n_head = qk_heads(arch, gguf_name, heads)
        if n_head is not None:
            values = unpermute_qk(values, n_head)
        stored, offset = np.asarray(values, dtype=np.float32), np.float32(norm_offset(arch, hf_name))
        ours = param.detach().float().cpu().numpy()
        # float32 ``w`` and ``1 + w`` do not round-trip both ways: a norm is as written if the file holds the
        # model's ``1 + w`` (a folder source) or reads back as its ``w`` (a GGUF source, as transformers loaded it)
        diff = 0.0 if np.array_equal(stored, ours + offset) else float(np.abs(stored - offset - ours).max())
        worst = max(worst, diff)
        if diff:
            inexact.append(hf_name)
        param.data.copy_(torch.from_numpy(stored - offset))  # what transformers' reader loads
    return {
        "tensors_checked": len(names),
        "exact": not inexact,
        "max_abs_diff": worst,
        "inexact": inexact[:10],
        "reader": "gguf.quants.dequantize",
    }


def read_back_meaning(model: Any, tokenizer: Any, path: Path, docs: Any, window: Any) -> dict[str, Any]:
    """Load the written file the way a user would (transformers' GGUF loader), score the last few evaluation
    windows with it and with the in-process model, and judge the gap (over ``MAX_PPL_GAP`` fails). The record
    names the tensors that differ the most between the file as loaded and the in-process model."""
    import dataclasses

    from deploy_opt.llm.checks import perplexity
    from deploy_opt.llm.gguf_model import load_gguf_model

    budget = READ_BACK_WINDOWS * window.max_seq_len
    few = dataclasses.replace(window, max_tokens=min(window.max_tokens or budget, budget), kv_bits=None)
    loaded, reader = load_gguf_model(path)
    loaded.to(model.get_input_embeddings().weight.device)
    file_ppl, live = _scored(loaded, tokenizer, docs, few), perplexity(model, tokenizer, docs, few)
    live_ppl = float(live["ppl"])
    worst = differing_tensors(loaded, model)
    del loaded
    finite = math.isfinite(file_ppl)  # JSON has no inf: a file whose logits are not finite records None
    gap = abs(file_ppl / live_ppl - 1) if finite else math.inf
    record = {
        "reader": reader,
        "windows": live["windows"],
        "tokens": live["tokens"],
        "max_seq_len": few.max_seq_len,
        "ppl_file": file_ppl if finite else None,
        "ppl_in_process": live_ppl,
        "gap": gap if finite else None,
        "max_gap": MAX_PPL_GAP,
        "passed": gap <= MAX_PPL_GAP,
        "differing_tensors": worst,
    }
    names = ", ".join(f"{t['name']} (max |diff| {t['max_abs_diff']:.3g})" for t in worst) or "none"
    if record["passed"]:
        log.info("%s reads %s back with perplexity %.4g (in process %.4g)", reader, path.name, file_ppl, live_ppl)
    else:
        log.error(
            "%s reads %s back with perplexity %.4g, the in-process model scores %.4g (gap %.2g > %.0f%%); the "
            "tensors that differ the most: %s",
            reader,
            path.name,
            file_ppl,
            live_ppl,
            gap,
            100 * MAX_PPL_GAP,
            names,
        )
    return record


def _scored(model: Any, tokenizer: Any, docs: Any, window: Any) -> float:
    """Perplexity, or inf where the logits are not finite (a broken file must be judged, not crash the run)."""
    from deploy_opt.llm.checks import perplexity
    from dopt_common.errors import NumericsError

    try:
        return float(perplexity(model, tokenizer, docs, window)["ppl"])
    except NumericsError:
        return math.inf


def differing_tensors(loaded: torch.nn.Module, model: torch.nn.Module, top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` tensors of ``loaded`` that differ the most from ``model``'s (relative to their largest value)."""
    reference = model.state_dict()
    found = []
    for name, tensor in loaded.state_dict().items():
        if name not in reference or reference[name].shape != tensor.shape:
            continue
        ours = reference[name].detach().float().cpu()
        diff = float((tensor.detach().float().cpu() - ours).abs().max())
        if diff > 0:
            found.append({"name": name, "max_abs_diff": diff, "relative": diff / max(float(ours.abs().max()), 1e-12)})
    return sorted(found, key=lambda t: -t["relative"])[:top]


def llama_cpp_check(path: Path, prompt: str = "The capital of France is") -> dict[str, Any]:
    """Load the file with llama.cpp (llama-cpp-python) and complete a prompt; says so when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return {
            "loaded": False,
            "reason": "llama-cpp-python is not installed (pip install llama-cpp-python builds llama.cpp from source)",
        }
    try:
        llm = Llama(model_path=str(path), n_ctx=256, verbose=False, n_threads=2)
        text = llm(prompt, max_tokens=8, temperature=0.0)["choices"][0]["text"]
    except (ValueError, RuntimeError) as exc:
        return {"loaded": False, "reason": f"llama.cpp refused the file: {exc}"}
    log.info("llama.cpp loads %s and completes %r with %r", path.name, prompt, text)
    return {"loaded": True, "prompt": prompt, "completion": text}
