"""Nemotron through ``quantize-llm --format gguf``: lmdeploy runs it on no engine, so GGUF is how it is served.

A tiny random Nemotron (LayerNorm1P norms with biases, squared-ReLU MLP of up/down only, partial rotary, GQA) is
written as llama.cpp's ``NemotronModel`` writes it, and transformers' own GGUF reader (its ``nemotron`` config
map and ``NemotronTensorProcessor``, which takes the 1 back off the norms) stands in for llama.cpp's loader,
which is not installed here: it must load the F32 file and the quantized one as the networks deploy_opt measured.
"""

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

from deploy_opt.llm import gguf_export  # noqa: E402
from deploy_opt.llm.config import load_llm_config  # noqa: E402
from deploy_opt.llm.gguf_model import load_gguf_model  # noqa: E402
from deploy_opt.llm.hf_gguf import write_hf_gguf  # noqa: E402
from deploy_opt.llm.pipeline import run_quantize_llm  # noqa: E402
from exporters.gguf import read_gguf, tensor_types  # noqa: E402

PROMPT = "The list type is mutable, tuples are not."


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_llama.train_tokenizer()


def _tiny_nemotron(tokenizer):  # -> NemotronForCausalLM
    from transformers import NemotronConfig, NemotronForCausalLM

    torch.manual_seed(0)
    config = tiny_llama.decoder_config(
        NemotronConfig,
        len(tokenizer),
        max_position_embeddings=256,
        norm_eps=1e-6,  # not the default: the reader must take it from the file
        **tiny_llama.special_ids(tokenizer),
    )
    model = NemotronForCausalLM(config).eval()
    with torch.no_grad():  # random LayerNorm1P weights and biases: a lost +1 or a dropped bias changes the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.1)
    return model


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_nemotron_written_as_f32_gguf_is_read_back_by_transformers_as_the_same_model(
    tokenizer, tmp_path: Path
) -> None:
    """The hyper-parameters and tensors llama.cpp's converter writes, loaded by transformers as the same network."""
    model = _tiny_nemotron(tokenizer)
    path = write_hf_gguf(model, tokenizer, tmp_path / "nemotron.gguf")
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "nemotron"
    assert fields["nemotron.rope.dimension_count"] == 8  # head 16, partial_rotary_factor 0.5
    assert fields["nemotron.attention.layer_norm_epsilon"] == pytest.approx(1e-6)  # what llama.cpp reads
    assert fields["nemotron.rope.scaling.type"] == "none"
    tensors = read_gguf(path)
    norm = model.model.layers[0].input_layernorm
    assert np.array_equal(tensors["blk.0.attn_norm.weight"], (norm.weight + 1).detach().numpy())  # layernorm1p
    assert np.array_equal(tensors["blk.0.attn_norm.bias"], norm.bias.detach().numpy())
    assert "blk.0.ffn_gate.weight" not in tensors and len(tensors) == 24  # 2 x 10 + embeddings, output, its norm
    reloaded, _ = load_gguf_model(path)
    assert reloaded.config.norm_eps == pytest.approx(1e-6)
    np.testing.assert_allclose(_logits(reloaded, tokenizer), _logits(model, tokenizer), atol=1e-4)


def test_a_nemotron_folder_quantizes_to_gguf_and_reads_back_as_the_model_it_measured(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPTQ (auto: Nemotron has no AWQ groups) in Q4_0; the bytes read back exactly, the file as transformers loads
    it scores within the gate's 1%, and its logits are the in-process fake-quantized model's."""
    monkeypatch.setenv("DEPLOY_OPT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tiny-nemotron"
    _tiny_nemotron(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    measured = {}
    read_back_meaning = gguf_export.read_back_meaning

    def spy(model, *args, **kwargs):  # the in-process model, as the checks measured it
        measured["model"] = model
        return read_back_meaning(model, *args, **kwargs)

    monkeypatch.setattr(gguf_export, "read_back_meaning", spy)
    config = load_llm_config(
        None,
        {
            "model": {"path": str(folder)},
            "quantization": {"method": "auto", "format": "gguf"},
            "calibration": {"texts": ["pydoc"], "samples": 8, "max_seq_len": 64},
            "checks": {"eval_tokens": 256, "eval_seq_len": 64, "generations": 1, "max_new_tokens": 4},
            "gate": {"max_ppl_increase": "50%"},
        },
    )
    result = run_quantize_llm(config, tmp_path / "reports", progress=False)
    report = json.loads((result.out_dir / "quantize_report.json").read_text())
    assert result.gate.passed and report["scheme"]["method"] == "gptq", report["gate"]
    record = report["quantization"]["gguf"]
    assert record["architecture"] == "nemotron" and record["types"] == ["Q4_0"] and record["replaced"] == 12
    assert record["read_back"]["exact"] and record["read_back"]["max_abs_diff"] == 0.0
    assert record["read_back"]["tensors_checked"] == 24  # the norms' biases too
    meaning = record["read_back"]["meaning"]
    assert meaning["passed"] and meaning["gap"] <= meaning["max_gap"] == 0.01, meaning
    assert report["gate"]["criteria"][-1]["name"] == "read_back" and report["gate"]["criteria"][-1]["passed"]
    path = result.out_dir / "checkpoint" / "model.gguf"
    types = tensor_types(path)
    assert types["blk.1.ffn_up.weight"] == types["blk.1.attn_k.weight"] == "Q4_0"
    assert types["blk.1.attn_norm.weight"] == types["blk.1.attn_norm.bias"] == "F32"
    model = measured["model"]
    blocks = model.model.layers[1].mlp.down_proj.weight.detach().reshape(-1, 32)
    assert max(len(torch.unique(block)) for block in blocks) <= 16  # fake-quantized: 16 levels per ggml block
    reloaded, reader = load_gguf_model(path)
    assert reader.startswith("transformers")
    np.testing.assert_allclose(_logits(reloaded, tokenizer), _logits(model, tokenizer), rtol=0, atol=1e-5)
