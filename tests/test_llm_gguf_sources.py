"""GGUF sources of any quant type: tiny Llama GGUFs whose weights are stored as Q4_K, Q5_K, Q6_K, Q8_0 or a
Q4_K_M-like mix convert through deploy_opt's loader into exactly the gguf package's dequantization of the stored
bytes, and run; the report's model section names the source's tensor types and says what the reference is."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

import gguf  # noqa: E402
import tiny_llama  # noqa: E402
import torch  # noqa: E402

from exporters.gguf import unpermute_qk  # noqa: E402

HEADS, KV_HEADS, LAYERS = 4, 2, 2
# Where the fp16 super-block scales sit in a K-quant block (ggml-common.h): d and dmin first in Q4_K/Q5_K, d last
# in Q6_K. The other bytes (codes, 6-bit sub-scales and mins, int8 sub-scales) may be anything.
FP16_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
# A Q4_K_M as llama.cpp mixes it: Q4_K, with Q6_K for the output and the v and down projections.
MIXED_Q6_K = ("attn_v.weight", "ffn_down.weight")


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama at hidden 256 and intermediate 512, so every weight row holds whole 256-value super-blocks."""
    path = tmp_path_factory.mktemp("sources") / "tiny.gguf"
    return tiny_llama.make_tiny_llama_gguf(path, hidden=256, layers=LAYERS)


def _random_k_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks of ``qtype`` (gguf 0.19 cannot quantize K-quants) with small finite fp16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, qtype)]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset in FP16_OFFSETS[qtype]:
        scales = rng.uniform(1e-4, 1e-3, size=(rows, cols // block)).astype(np.float16)
        data[..., offset : offset + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


def _stored(qtype: str, name: str, values: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """(raw bytes or floats, ggml type) for one tensor of the file: norms stay F32, as llama.cpp keeps them."""
    if values.ndim == 1:
        return values, "F32"
    kind = qtype
    if qtype == "Q4_K_M":
        kind = "Q6_K" if name == "output.weight" or name.endswith(MIXED_Q6_K) else "Q4_K"
    if kind == "Q8_0":
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0), kind
    return _random_k_blocks(kind, *values.shape, rng), kind


def _write(out: Path, arch: str, tensors: list[tuple[str, np.ndarray, str]], fields: dict | None = None) -> Path:
    """A GGUF of ``tensors`` (name, floats or raw blocks, ggml type) with ``fields`` (name → a reader's field)."""
    writer = gguf.GGUFWriter(str(out), arch)
    for name, field in (fields or {}).items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for name, data, kind in tensors:
        if kind == "F32":
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_quant_gguf(source: Path, out: Path, qtype: str, seed: int = 0) -> Path:
    """``source``'s metadata with its weights stored as ``qtype`` (Q4_K_M: a mix of Q4_K and Q6_K)."""
    reader = gguf.GGUFReader(str(source))
    rng = np.random.default_rng(seed)
    tensors = [(t.name, *_stored(qtype, t.name, np.asarray(t.data, dtype=np.float32), rng)) for t in reader.tensors]
    return _write(out, "llama", tensors, dict(reader.fields))


def _expected_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as the gguf package dequantizes its stored bytes, under its Hugging Face name, q/k rows back in
    Hugging Face's order (llama.cpp permutes them for its rotary layout)."""
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS)
    hf_names = [f"model.layers.{i}.{part}.weight" for i in range(LAYERS) for part in _LAYER_PARTS]
    hf_names += ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    by_gguf = {table.get_name(name, try_suffixes=(".weight",)): name for name in hf_names}
    expected = {}
    for tensor in gguf.GGUFReader(str(path)).tensors:
        values = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            values = unpermute_qk(values, HEADS if "attn_q" in tensor.name else KV_HEADS)
        expected[by_gguf[tensor.name]] = values
    return expected


_LAYER_PARTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_K_M"])
def test_a_quantized_gguf_converts_to_the_gguf_packages_dequantization(
    f32_gguf: Path, tmp_path: Path, qtype: str
) -> None:
    from safetensors.numpy import load_file

    from deploy_opt.llm.gguf_header import gguf_tensor_types
    from deploy_opt.llm.gguf_model import gguf_to_hf_folder, load_model_folder

    source = write_quant_gguf(f32_gguf, tmp_path / f"tiny-{qtype}.gguf", qtype)
    kinds = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(source)).tensors)
    weights = {"Q4_K_M": {"Q4_K": 11, "Q6_K": 5}}.get(qtype, {qtype: 16})
    assert kinds == Counter({**weights, "F32": 5}) and gguf_tensor_types(source) == dict(kinds.most_common())
    folder = gguf_to_hf_folder(source, tmp_path / "converted")
    converted = load_file(str(folder / "model.safetensors"))
    expected = _expected_weights(source)
    assert sorted(converted) == sorted(expected)
    for name, values in expected.items():
        assert converted[name].dtype == np.float32
        np.testing.assert_array_equal(converted[name], values, err_msg=name)
    assert all(np.isfinite(v).all() and 0 < np.abs(v).max() < 10 for v in expected.values())  # sane random weights
    model, tokenizer = load_model_folder(folder)
    ids = torch.tensor([tokenizer("The list type is mutable.")["input_ids"]])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_the_report_names_a_gguf_sources_types_and_its_reference(tmp_path: Path, caplog) -> None:
    from deploy_opt.llm.gguf_model import model_reference

    source = tmp_path / "mixed.gguf"
    rng = np.random.default_rng(0)
    tensors = [(f"blk.{i}.attn_q.weight", _random_k_blocks("Q4_K", 2, 256, rng), "Q4_K") for i in range(3)]
    tensors += [("output.weight", _random_k_blocks("Q6_K", 2, 256, rng), "Q6_K")]
    tensors += [(f"blk.{i}.attn_norm.weight", np.ones(256), "F32") for i in range(2)]
    _write(source, "llama", tensors)
    with caplog.at_level("INFO", logger="deploy_opt.llm.gguf_model"):
        record = model_reference(source).to_json()
    assert record["tensor_types"] == {"Q4_K": 3, "F32": 2, "Q6_K": 1}
    line = "the Q4_K/F32/Q6_K GGUF dequantized to float32 by the gguf package; perplexities and increases are "
    assert record["reference"] == line + "relative to it, not to the original float model"
    assert [r.getMessage() for r in caplog.records] == [f"reference: {record['reference']}"]
    folder = model_reference(tmp_path).to_json()
    assert folder == {"reference": folder["reference"]} and "Hugging Face folder's weights in float32" in str(folder)
    _check_page(tmp_path, record)


def _check_page(folder: Path, model: dict) -> None:
    import html

    from deploy_opt.report.llm_train_pages import write_llm_page

    ppl = {"original": {"ppl": 10.0}, "quantized": {"ppl": 11.0}}
    report = {"name": "x", "perplexity": ppl, "model": {"source": "mixed.gguf", **model}}
    (folder / "quantize_report.json").write_text(json.dumps(report), encoding="utf-8")
    page = write_llm_page(folder).read_text(encoding="utf-8")
    assert html.escape(model["reference"]) in page and "Q4_K 3, F32 2, Q6_K 1" in page
