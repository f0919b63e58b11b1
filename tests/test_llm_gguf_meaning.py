"""Norm conventions per architecture, AWQ's norm groups, and a GGUF read-back that checks meaning.

- The architecture table's norm offsets against transformers' own GGUF reader (which undoes llama.cpp's).
- A tiny random Gemma 3 written as GGUF reads back, through transformers' GGUF loader, as the same network.
- ``quantize-llm --format gguf`` on that Gemma 3: the file loaded as a user loads it scores as the in-process
  model; written with the norms off by one (the defect of issue 57), the read-back fails the gate: exit 1.
- AWQ's scale folds leave each family's function unchanged before rounding, Gemma's ``1 + w`` norms included.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

import tiny_llama  # noqa: E402
import torch  # noqa: E402

from deploy_opt.cli import main  # noqa: E402
from deploy_opt.llm import architectures, gguf_export  # noqa: E402
from deploy_opt.llm.architectures import NORM, ScaleGroup, norm_offset  # noqa: E402

NORMED = "model.layers.0.input_layernorm.weight"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "nemotron"])
def test_norm_offsets_are_the_ones_transformers_gguf_reader_undoes(arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)()
    stored = np.full(4, 3.0, dtype=np.float32)
    read = processor.process(stored, "blk.0.attn_norm.weight").weights
    assert norm_offset(arch, NORMED) == pytest.approx(float(stored[0] - read[0]))
    assert norm_offset(arch, "model.layers.0.self_attn.q_proj.weight") == 0.0


def test_the_table_holds_gemmas_mlp_norm_and_qwen3_next_exception() -> None:
    gemma3 = architectures.by_layer("Gemma3DecoderLayer")
    mlp = [g for g in gemma3.awq_groups if "mlp.gate_proj" in g.consumers]
    assert [g.producer for g in mlp] == ["pre_feedforward_layernorm"] and gemma3.norm_form == "1 + w"
    assert architectures.by_hf_architecture(["Gemma3ForConditionalGeneration"]) is gemma3
    assert norm_offset("qwen3next", "model.layers.0.linear_attn.norm.weight") == 0.0
    assert norm_offset("qwen3next", NORMED) == 1.0 and norm_offset("unknown", NORMED) == 0.0


def _tiny_gemma3(layers: int = 2):  # (model, tokenizer)
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    tokenizer = tiny_llama.train_tokenizer()
    config = tiny_llama.decoder_config(
        Gemma3TextConfig,
        len(tokenizer),
        layers=layers,
        kv_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        sliding_window=16,
        **tiny_llama.special_ids(tokenizer),
        pad_token_id=0,
        architectures=["Gemma3ForCausalLM"],
    )
    model = Gemma3ForCausalLM(config).eval()
    _random_norms(model)
    return model, tokenizer


def _random_norms(model: torch.nn.Module) -> None:
    """Trained norms are far from their zero init (Gemma 3 270M's reach 282): the offset must matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.5)


def test_a_gemma3_written_as_gguf_reads_back_through_transformers_as_the_same_model(tmp_path: Path) -> None:
    from deploy_opt.llm.gguf_model import load_gguf_model
    from deploy_opt.llm.hf_gguf import write_hf_gguf

    model, tokenizer = _tiny_gemma3()
    path = write_hf_gguf(model, tokenizer, tmp_path / "gemma3.gguf")
    from exporters.gguf import read_gguf

    stored = read_gguf(path)["blk.0.attn_norm.weight"]
    assert np.array_equal(stored, model.model.layers[0].input_layernorm.weight.detach().numpy() + 1)  # 1 + w
    back, _ = load_gguf_model(path)
    ids = torch.tensor([tokenizer("The list type is mutable, tuples are not. " * 4)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def gemma3_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 as an F32 GGUF source, norms stored as ``1 + w`` (its byte-level BPE vocabulary is read by
    transformers' Gemma tokenizer converter: odd tokens, but the same ones for every model a run compares)."""
    from deploy_opt.llm.hf_gguf import write_hf_gguf

    model, tokenizer = _tiny_gemma3()
    return write_hf_gguf(model, tokenizer, tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf")


def _quantize(source: Path, out: Path, method: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict]:
    monkeypatch.setenv("DEPLOY_OPT_CACHE", str(out / "cache"))
    argv = ["quantize-llm", "--path", str(source), "--method", method, "--format", "gguf", "--output-dir", str(out)]
    argv += ["--texts", "pydoc", "--samples", "8", "--max-seq-len", "64", "--eval-tokens", "256"]
    argv += ["--eval-seq-len", "64", "--generations", "1", "--max-new-tokens", "4", "-q"]
    code = main(argv)
    report = next(out.glob("*/quantize_report.json"))
    return code, json.loads(report.read_text())


@pytest.mark.parametrize("method", ["gptq", pytest.param("awq", marks=pytest.mark.slow)])  # awq: ~18 s
def test_a_gemma3_gguf_export_reads_back_as_the_model_the_report_measured(
    gemma3_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    code, report = _quantize(gemma3_gguf, tmp_path / "out", method, monkeypatch)
    meaning = report["checkpoint"]["reload"]["meaning"]
    assert code == 0 and meaning["passed"] and meaning["gap"] < 1e-4, meaning
    assert meaning["reader"].startswith("transformers") and meaning["windows"] == 4
    assert meaning["ppl_in_process"] == pytest.approx(report["perplexity"]["quantized"]["ppl"], rel=1e-9)
    # GPTQ folds nothing: every norm stays the source's bytes. AWQ folds into the two (1 + w) norms feeding
    # Linears in each layer (input_layernorm, pre_feedforward_layernorm), written back as 1 + w'.
    assert report["quantization"]["gguf"]["replaced_f32"] == (0 if method == "gptq" else 4)
    assert report["checkpoint"]["reload"]["max_abs_diff"] < 1e-6
    assert [c["name"] for c in report["gate"]["criteria"]][-1] == "read_back"


def test_a_gguf_with_norms_off_by_one_fails_the_read_back_with_exit_1(
    gemma3_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The export as it was: the source's ``1 + w`` compared with the model's ``w``, every norm written as ``w``."""
    monkeypatch.setattr(gguf_export, "norm_offset", lambda arch, name: 0.0)
    code, report = _quantize(gemma3_gguf, tmp_path / "out", "gptq", monkeypatch)
    assert code == 1, capsys.readouterr().err
    meaning = report["checkpoint"]["reload"]["meaning"]
    assert not meaning["passed"] and report["gate"]["verdict"] == "FAILED"
    assert report["quantization"]["gguf"]["replaced_f32"] == 13  # every norm "changed", as issue 57 saw
    assert report["checkpoint"]["reload"]["exact"]  # the bytes read back as written: only the meaning check sees it
    worst = [t["name"] for t in meaning["differing_tensors"]]
    assert worst and all(name.endswith("norm.weight") for name in worst), worst
    criterion = report["gate"]["criteria"][-1]
    assert criterion["name"] == "read_back" and not criterion["passed"] and "norm.weight" in criterion["text"]


# ---------------------------------------------------------------------------------------------------- AWQ folds
def _family(name: str) -> torch.nn.Module:
    import transformers

    small = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    configs = {
        "llama": transformers.LlamaConfig(**small, **heads),
        "qwen3": transformers.Qwen3Config(**small, **heads, head_dim=16),
        "phi3": transformers.Phi3Config(**small, **heads, pad_token_id=0),
        "gemma": transformers.GemmaConfig(**small, **heads, head_dim=16),
        "gemma2": transformers.Gemma2Config(**small, **heads, head_dim=16),
        "gemma3": transformers.Gemma3TextConfig(**small, **heads, head_dim=16, sliding_window=8),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[name]).eval()
    _random_norms(model)
    return model


def _fold_all(model: torch.nn.Module, groups: tuple[ScaleGroup, ...] | None = None) -> None:
    from deploy_opt.llm.awq_layer import awq_groups, fold_scales

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            found, form = awq_groups(layer)
            for group in groups or found:
                producer = layer.get_submodule(group.producer)
                width = producer.weight.shape[0]
                if group.kind != NORM and width != layer.get_submodule(group.consumers[0]).in_features:
                    continue  # grouped-query attention, as quantize_awq_layer skips it
                fold_scales(layer, group, 0.5 + 1.5 * torch.rand(width, generator=generator), form)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma", "gemma2", "gemma3"])
def test_awq_scale_folds_leave_each_family_unchanged_before_rounding(family: str) -> None:
    model = _family(family)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        _fold_all(model)
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_folding_the_mlp_scales_into_gemma3s_sandwich_norm_would_change_it() -> None:
    """The test above can fail: Llama's group (post_attention_layernorm → MLP) on Gemma 3 changes its outputs."""
    model = _family("gemma3")
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(2))
    wrong = ScaleGroup("post_attention_layernorm", NORM, ("mlp.gate_proj", "mlp.up_proj"))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        _fold_all(model, (wrong,))
        assert not torch.allclose(model(input_ids=ids).logits, before, rtol=1e-3, atol=1e-3)


def test_awq_refuses_a_family_without_groups_and_an_unknown_gemma() -> None:
    from deploy_opt.llm.awq_layer import awq_groups
    from dopt_common.errors import ConfigError

    class NemotronDecoderLayer(torch.nn.Module):
        pass

    class Gemma9DecoderLayer(torch.nn.Module):
        pass

    with pytest.raises(ConfigError, match="no scaling groups for NemotronDecoderLayer.*fix: use method gptq"):
        awq_groups(NemotronDecoderLayer())
    with pytest.raises(ConfigError, match="Gemma9DecoderLayer.*1 \\+ w.*fix: use method gptq"):
        awq_groups(Gemma9DecoderLayer())
    llama = architectures.by_layer("LlamaDecoderLayer")
    assert llama.awq_groups[2].producer == "post_attention_layernorm"
