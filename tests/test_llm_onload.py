"""Layer-wise onloading: the streamed walk writes the in-memory path's bytes and measures the same perplexity.

The model is a tiny random Llama stored in bfloat16 (as large checkpoints are), two or three layers, tied or not.
"""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import tiny_llama
import torch

from deploy_opt.llm.checks import PerplexityWindow, perplexity
from deploy_opt.llm.config import load_llm_config
from deploy_opt.llm.onload import (
    checkpoint_source,
    layer_source,
    load_skeleton,
    open_folder,
    quantize_streamed,
    streamed_perplexity,
)
from deploy_opt.llm.pipeline import run_quantize_llm
from deploy_opt.llm.pipeline_layers import choose_onload
from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
from dopt_common.errors import ConfigError, ModelError
from exporters.lmdeploy import load_quantized_checkpoint, read_quantized_weights
from exporters.shards import INDEX_FILE, ShardWriter
from exporters.w4a16_writer import CheckpointWriter, write_quantized_checkpoint

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
TEXT = " ".join(f"def f{i}(x): return x * {i} + {i % 7}" for i in range(200))


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (3 layers, tied embeddings) saved in bfloat16, with its tokenizer."""
    folder = tmp_path_factory.mktemp("bf16") / "model"
    tiny_llama.make_tiny_llama(folder, layers=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def samples() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 500, (1, 48), generator=gen) for _ in range(10)]


def test_shards_hold_the_bytes_save_file_writes(tmp_path: Path) -> None:
    groups = [
        {
            "a.qweight": torch.randint(-(2**31), 2**31 - 1, (8, 16), dtype=torch.int32),
            "a.scales": torch.randn(2, 16).half(),
        },
        {
            "n.weight": torch.randn(16).bfloat16(),
            "head": torch.randn(4, 4),
            "ids": torch.arange(5),
            "m": torch.ones(3, dtype=torch.bool),
        },
    ]
    (tmp_path / "one").mkdir()
    writer = ShardWriter(tmp_path / "one")
    for group in groups:
        writer.add(group)
    [single] = writer.finish()
    safetensors_torch.save_file(
        {**groups[0], **groups[1]}, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"}
    )
    assert single.read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["model.safetensors"]  # the spool is gone

    (tmp_path / "two").mkdir()
    writer = ShardWriter(tmp_path / "two", max_shard_bytes=64)
    for group in groups:
        writer.add(group)
    shards = writer.finish()
    assert [p.name for p in shards] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((tmp_path / "two" / INDEX_FILE).read_text())
    assert index["weight_map"]["a.qweight"] == shards[0].name and index["weight_map"]["head"] == shards[1].name
    back = {k: v for p in shards for k, v in safetensors_torch.load_file(str(p)).items()}
    assert all(torch.equal(back[k], v) for group in groups for k, v in group.items())


@pytest.mark.parametrize("method", ["gptq", "awq", "rtn"])
def test_streamed_checkpoint_is_byte_identical_to_the_in_memory_one(
    bf16_folder: Path, samples: list, tmp_path: Path, method: str
) -> None:
    settings = EngineSettings(method=method, group_size=32, desc_act=False)
    fmt = "awq" if method == "awq" else "gptq"
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_folder, dtype=torch.float32)
    in_memory = quantize_model(model, samples, settings, progress=False)
    write_quantized_checkpoint(model, in_memory.weights, tmp_path / "memory", fmt=fmt)

    folder = open_folder(bf16_folder)
    skeleton = load_skeleton(folder)
    writer = CheckpointWriter(tmp_path / "layers", fmt)
    streamed = quantize_streamed(folder, skeleton, samples, settings, writer, progress=False)
    writer.finish(skeleton)

    assert streamed.weights == {}  # written as they came, not held
    assert [r.output_error for r in streamed.records] == [r.output_error for r in in_memory.records]
    names = sorted(p.name for p in (tmp_path / "memory").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "layers").iterdir())
    assert all(filecmp.cmp(tmp_path / "memory" / n, tmp_path / "layers" / n, shallow=False) for n in names)
    assert all(p.is_meta for p in skeleton.model.layers.parameters())  # every layer went back to the meta device


def test_streamed_perplexity_equals_the_in_memory_one(bf16_folder: Path, samples: list, tmp_path: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(bf16_folder)
    window = PerplexityWindow(max_seq_len=64, max_tokens=300)
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_folder, dtype=torch.float32)
    folder = open_folder(bf16_folder)
    skeleton = load_skeleton(folder)
    original = perplexity(model, tokenizer, TEXT, window)
    assert streamed_perplexity(skeleton, layer_source(folder, skeleton), tokenizer, TEXT, window) == original

    result = quantize_model(
        model, samples, EngineSettings(method="gptq", group_size=32, desc_act=False), progress=False
    )
    write_quantized_checkpoint(model, result.weights, tmp_path / "ckpt", fmt="gptq", max_shard_bytes=50_000)
    assert (tmp_path / "ckpt" / INDEX_FILE).is_file()  # several shards, read through the index
    reloaded, _ = load_quantized_checkpoint(tmp_path / "ckpt")
    written = checkpoint_source(open_folder(tmp_path / "ckpt"), skeleton)
    streamed = streamed_perplexity(skeleton, written, tokenizer, TEXT, window)
    assert streamed["ppl"] == pytest.approx(perplexity(reloaded, tokenizer, TEXT, window)["ppl"], rel=1e-5)
    assert streamed["ppl"] != original["ppl"]
    assert set(read_quantized_weights(tmp_path / "ckpt")[0]) == set(result.weights)


def _flags(folder: Path, onload: str, **sections) -> dict:
    return {
        "name": f"tiny-{onload}",
        "model": {"path": str(folder), "onload": onload},
        "quantization": {"method": "rtn", "group_size": 32},
        "calibration": {"samples": 16, "max_seq_len": 64},
        "checks": {"eval_tokens": 256, "eval_seq_len": 64, "generations": 1, "max_new_tokens": 8},
        "gate": {"max_ppl_increase": "50%"},
        **sections,
    }


def test_quantize_llm_layers_matches_memory_and_says_what_it_skipped(bf16_folder: Path, tmp_path: Path) -> None:
    memory = run_quantize_llm(load_llm_config(None, _flags(bf16_folder, "memory")), tmp_path, progress=False)
    layers = run_quantize_llm(load_llm_config(None, _flags(bf16_folder, "layers")), tmp_path, progress=False)
    for name in ("model.safetensors", "config.json", "quantize_config.json", "tokenizer.json"):
        assert filecmp.cmp(memory.out_dir / "checkpoint" / name, layers.out_dir / "checkpoint" / name, shallow=False)
    assert layers.report.perplexity.before == pytest.approx(memory.report.perplexity.before, rel=1e-6)
    assert layers.report.perplexity.after == pytest.approx(memory.report.perplexity.after, rel=1e-4)
    assert layers.report.stable is None and "not run" in layers.report.stability["skipped"]
    assert layers.report.sections["model"]["onload"] == "layers"
    for run in (memory, layers):  # a folder source: the perplexities are relative to its own weights
        assert run.report.sections["model"]["reference"].startswith("the Hugging Face folder's weights in float32")
        assert "tensor_types" not in run.report.sections["model"]
    assert [c.name for c in layers.gate.criteria] == ["max_ppl_increase"]  # no stability criterion
    assert "not run: layer-wise onloading" in (layers.out_dir / "report.html").read_text()


def test_layers_refuses_what_needs_the_whole_model(bf16_folder: Path, tmp_path: Path) -> None:
    kv = _flags(bf16_folder, "layers", checks={"kv_cache": "int8"})
    with pytest.raises(ConfigError, match="kv_cache"):
        run_quantize_llm(load_llm_config(None, kv), tmp_path, progress=False)
    torchao = _flags(bf16_folder, "layers", quantization={"method": "torchao-int8-wo"})
    with pytest.raises(ConfigError, match="whole model"):
        run_quantize_llm(load_llm_config(None, torchao), tmp_path, progress=False)
    with pytest.raises(ConfigError, match="safetensors"):
        choose_onload("layers", tmp_path / "model.gguf")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="safetensors"):
        open_folder(tmp_path / "bin")


def test_auto_onloads_layers_when_the_model_does_not_fit(bf16_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deploy_opt.llm.pipeline_layers as pipeline_layers

    monkeypatch.setattr(pipeline_layers, "available_bytes", lambda: 10**12)
    assert choose_onload("auto", bf16_folder) == "memory"
    size = pipeline_layers.float32_bytes(bf16_folder)
    assert size == 4 * sum(p.numel() for p in load_skeleton(open_folder(bf16_folder)).state_dict().values()) - 4 * (
        load_skeleton(open_folder(bf16_folder)).lm_head.weight.numel()
    )  # tied: lm_head is not stored
    monkeypatch.setattr(pipeline_layers, "available_bytes", lambda: size)
    assert choose_onload("auto", bf16_folder) == "layers"
    assert choose_onload("memory", bf16_folder) == "memory"
