"""``quantize-llm --format gguf``: ggml's block packing against the gguf package's own dequantizer, llama.cpp's q/k
row order against transformers', and the whole export on a tiny GGUF Llama: it reads back exactly, reloads as the
same model, and llama.cpp loads it when llama-cpp-python is installed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

import gguf  # noqa: E402
import tiny_llama  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from deploy_opt.llm.config import load_llm_config  # noqa: E402
from deploy_opt.llm.pipeline import run_quantize_llm  # noqa: E402
from dopt_common.errors import ConfigError  # noqa: E402
from exporters.gguf import pack_q4_0, pack_q4_1, pack_q8_0, permute_qk, tensor_types, unpermute_qk  # noqa: E402

RNG = np.random.default_rng(0)


def _dequantize(packed) -> np.ndarray:
    qtype = getattr(gguf.GGMLQuantizationType, packed.qtype)
    return np.asarray(gguf.quants.dequantize(packed.data, qtype), dtype=np.float32)


def test_q4_0_q4_1_and_q8_0_blocks_decode_as_ggml_defines_them() -> None:
    codes = RNG.integers(0, 16, size=(6, 64))
    d = RNG.uniform(0.01, 0.1, size=(6, 2)).astype(np.float16)
    m = RNG.uniform(-0.5, 0.5, size=(6, 2)).astype(np.float16)
    per_value = np.repeat(d.astype(np.float32), 32, axis=1)
    assert np.array_equal(_dequantize(pack_q4_0(codes, d)), (codes - 8) * per_value)
    expected = codes * per_value + np.repeat(m.astype(np.float32), 32, axis=1)
    assert np.array_equal(_dequantize(pack_q4_1(codes, d, m)), expected.astype(np.float32))
    signed = RNG.integers(-127, 128, size=(6, 64))
    assert np.array_equal(_dequantize(pack_q8_0(signed, d)), signed * per_value)
    assert pack_q4_0(codes, d).data.shape == (6, 2 * 18) and pack_q4_1(codes, d, m).data.shape == (6, 2 * 20)
    with pytest.raises(ValueError, match="blocks of 32"):
        pack_q4_0(codes[:, :48], d)


def test_qk_rows_follow_llama_cpp_and_transformers_reads_them_back() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = RNG.normal(size=(48, 5)).astype(np.float32)
    permuted = permute_qk(rows, 4)
    assert not np.array_equal(permuted, rows) and np.array_equal(unpermute_qk(permuted, 4), rows)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 4})
    assert np.array_equal(processor._reverse_permute_weights(permuted, 4, 4), rows)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.make_tiny_llama_gguf(tmp_path_factory.mktemp("tiny_gguf") / "tiny.gguf")


def _config(source: Path, method: str = "auto", **quant):
    return load_llm_config(
        None,
        {
            "model": {"path": str(source)},
            "quantization": {"method": method, "format": "gguf", **quant},
            "calibration": {"samples": 32, "max_seq_len": 64},
            "checks": {"eval_tokens": 256, "eval_seq_len": 64, "generations": 2, "max_new_tokens": 16},
            "gate": {"max_ppl_increase": "50%"},
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize(("method", "qtype"), [("auto", "Q4_0"), ("awq", "Q4_1")])
def test_gguf_export_reads_back_exactly_and_reloads_as_the_same_model(
    tiny_gguf: Path, tmp_path: Path, monkeypatch, method: str, qtype: str
) -> None:
    monkeypatch.setenv("DEPLOY_OPT_CACHE", str(tmp_path / "cache"))
    result = run_quantize_llm(_config(tiny_gguf, method), tmp_path / "reports", progress=False)
    report = json.loads((result.out_dir / "quantize_report.json").read_text())
    assert result.out_dir.name == f"tiny-{'gptq' if method == 'auto' else 'awq'}-g32"
    record = report["quantization"]["gguf"]
    assert report["checkpoint"]["format"] == "gguf" and record["types"] == [qtype]
    assert report["model"]["tensor_types"] == {"F32": 21}  # the source's, read from its tensor infos
    assert report["model"]["reference"].startswith("the F32 GGUF dequantized to float32 by the gguf package")
    assert record["read_back"]["exact"] and record["read_back"]["max_abs_diff"] == 0.0
    assert record["read_back"]["tensors_checked"] == 21  # every tensor of the file, not only the 14 quantized
    # AWQ folds its scales into the RMSNorms before the Linears: those go in as F32, the rest as the source had them.
    assert (record["replaced_f32"] > 0) == (method == "awq") and record["replaced"] == 14
    path = result.out_dir / "checkpoint" / "model.gguf"
    types = tensor_types(path)
    assert types["blk.0.attn_q.weight"] == qtype and types["blk.0.attn_norm.weight"] == "F32"
    assert types["token_embd.weight"] == "F32"  # not quantized: copied from the source as it was
    # transformers reads the written file back as the model the checks measured.
    from deploy_opt.llm.checks import PerplexityWindow, perplexity
    from deploy_opt.llm.gguf_model import load_model_folder
    from deploy_opt.llm.text_data import pydoc_texts

    reloaded, tokenizer = load_model_folder(path)
    again = perplexity(reloaded, tokenizer, pydoc_texts("evaluation"), PerplexityWindow(max_seq_len=64, max_tokens=256))
    assert again["ppl"] == pytest.approx(report["perplexity"]["quantized"]["ppl"], rel=1e-5)
    assert report["serve"]["servable"] is False and report["serve"]["llama_cpp_command"][0] == "llama-server"
    llama = record["llama_cpp"]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        assert llama == {"loaded": False, "reason": llama["reason"]} and "not installed" in llama["reason"]
    else:
        assert llama["loaded"], llama


def test_gguf_settings_that_cannot_work_are_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="blocks of 32"):
        load_llm_config(None, {"quantization": {"format": "gguf", "group_size": 64}})
    with pytest.raises(ConfigError, match="blocks of 32"):
        load_llm_config(None, {"quantization": {"format": "gguf", "method": "torchao-int8-wo"}})


def test_gguf_from_a_folder_of_another_family_names_the_ones_written() -> None:
    from types import SimpleNamespace

    from deploy_opt.llm.hf_gguf import gguf_architecture

    qwen = SimpleNamespace(config=SimpleNamespace(architectures=["Qwen2ForCausalLM"]))
    assert gguf_architecture(qwen) == "qwen2"
    gpt2 = SimpleNamespace(config=SimpleNamespace(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ConfigError, match="LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM.*start from a .gguf"):
        gguf_architecture(gpt2)


@pytest.mark.slow
def test_gguf_export_from_a_hugging_face_folder_writes_its_metadata_and_reads_back(tmp_path: Path, monkeypatch) -> None:
    """A tiny random Llama saved as a transformers folder: its hyper-parameters, BPE tokenizer and tensors become
    the GGUF's (as convert_hf_to_gguf.py writes them), the gguf reader reads the file back exactly, transformers
    loads it as the model the checks measured, and llama.cpp loads it and answers where it is installed."""
    monkeypatch.setenv("DEPLOY_OPT_CACHE", str(tmp_path / "cache"))
    folder = tiny_llama.make_tiny_llama(tmp_path / "tiny-hf")
    result = run_quantize_llm(_config(folder, "auto"), tmp_path / "reports", progress=False)
    report = json.loads((result.out_dir / "quantize_report.json").read_text())
    record = report["quantization"]["gguf"]
    assert record["source"] == "written from the Hugging Face folder" and record["types"] == ["Q4_0"]
    assert record["read_back"]["exact"] and record["replaced"] == 14
    path = result.out_dir / "checkpoint" / "model.gguf"
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "llama" and fields["llama.block_count"] == 2
    assert fields["llama.embedding_length"] == 64 and fields["tokenizer.ggml.model"] == "gpt2"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert fields["tokenizer.ggml.tokens"] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert fields["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert tensor_types(path)["blk.1.ffn_down.weight"] == "Q4_0"
    from deploy_opt.llm.gguf_model import load_model_folder

    reloaded, _ = load_model_folder(path)  # transformers' own GGUF reader (it un-permutes q/k)
    ids = torch.tensor([tokenizer("The list type is mutable.")["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        assert reloaded(input_ids=ids).logits.shape == model(input_ids=ids).logits.shape
    llama = record["llama_cpp"]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        assert "not installed" in llama["reason"]
    else:
        assert llama["loaded"], llama


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_an_hf_folder_written_as_f32_gguf_is_read_back_by_transformers_as_the_same_model(
    tmp_path: Path, monkeypatch, family: str
) -> None:
    """transformers' own GGUF reader (independent of the writer) loads the F32 file as the same network."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from deploy_opt.llm.gguf_model import load_model_folder
    from deploy_opt.llm.hf_gguf import write_hf_gguf

    monkeypatch.setenv("DEPLOY_OPT_CACHE", str(tmp_path / "cache"))
    folder = tiny_llama.make_tiny_llama(tmp_path / "tiny-hf")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if family == "llama":
        model = AutoModelForCausalLM.from_pretrained(folder)
    else:
        torch.manual_seed(0)
        config_class, model_class = {
            "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM),
        }[family]
        config = tiny_llama.decoder_config(
            config_class, len(tokenizer), max_position_embeddings=256, tie_word_embeddings=False
        )
        model = model_class(config).eval()
    path = write_hf_gguf(model, tokenizer, tmp_path / f"{family}.gguf")
    reloaded, _ = load_model_folder(path)
    ids = torch.tensor([tokenizer("The list type is mutable, tuples are not.")["input_ids"]])
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4)
