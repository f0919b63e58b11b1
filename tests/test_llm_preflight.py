"""quantize-llm's first-second checks, from the model's header alone (config.json or GGUF metadata): an
architecture it cannot quantize, AWQ on a family without AWQ groups, a group no size divides, or a model lmdeploy
runs on no engine is exit 2 before a single weight is read; an explicit scheme no engine serves is said up front."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from deploy_opt.llm.config import LLMQuantConfig
from deploy_opt.llm.preflight import preflight, read_header
from dopt_common.errors import ConfigError, ModelError

LLAMA_SIZES = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "head_dim": 64}
FOUR_GB = 4 << 30


def _folder(tmp_path: Path, architectures: list[str], **sizes: object) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    config = {"architectures": architectures, **(sizes or LLAMA_SIZES)}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    # A 4 GB weight file nobody may open (sparse): the checks must decide from config.json alone.
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(b"not a safetensors file")
        handle.truncate(FOUR_GB)
    return folder


def _gguf(tmp_path: Path, arch: str, vocab: int = 0, **sizes: int) -> Path:
    """A GGUF with only metadata (a ``vocab``-token list, as real files carry), grown to 4 GB, sparse."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    if vocab:
        writer.add_token_list([f"token{i}" for i in range(vocab)])
    for key, value in sizes.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "r+b") as handle:
        handle.truncate(FOUR_GB)
    return path


def _quant(**fields: object) -> LLMQuantConfig:
    return LLMQuantConfig(**fields)  # type: ignore[arg-type]


def test_supported_families_pass_and_resolve_their_scheme_from_the_header(tmp_path: Path) -> None:
    gemma = {"hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4, "head_dim": 256}
    checked = preflight(_folder(tmp_path, ["Gemma3ForCausalLM"], **gemma), _quant())
    assert checked.architecture.family == "Gemma3" and checked.engine == "pytorch"
    assert (checked.scheme.method, checked.scheme.layout, checked.scheme.group_size) == ("awq-gptq", "awq", 128)
    sizes = {"embedding_length": 576, "feed_forward_length": 1536, "attention.head_count": 9}
    smol = preflight(_gguf(tmp_path, "llama", vocab=1000, **sizes), _quant())
    assert smol.architecture.family == "Llama" and smol.scheme.group_size == 64  # 128 does not divide 576
    assert read_header(_gguf(tmp_path, "qwen2")).architecture.family == "Qwen2"


def test_an_unknown_architecture_is_refused_in_seconds_on_a_4_gb_file(tmp_path: Path) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="'FalconForCausalLM'.*not one deploy_opt quantizes.*Gemma3"):
        preflight(_folder(tmp_path, ["FalconForCausalLM"]), _quant(method="gptq"))
    bloom = _gguf(tmp_path, "bloom", vocab=262_144)  # Gemma 3's vocabulary size
    assert os.path.getsize(bloom) == FOUR_GB
    with pytest.raises(ConfigError, match="'bloom'.*supported: Llama"):
        preflight(bloom, _quant())
    assert time.perf_counter() - started < 10


def test_awq_on_a_family_without_awq_groups_is_refused_and_qwen3_next_is_not_quantized(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ["NemotronForCausalLM"])
    assert preflight(folder, _quant(method="gptq", format="gguf")).architecture.family == "Nemotron"
    with pytest.raises(ConfigError, match="method awq needs AWQ scale groups.*fix: use method auto or gptq"):
        preflight(folder, _quant(method="awq"))
    with pytest.raises(ConfigError, match="Qwen3Next.*not quantized by deploy_opt: its MoE experts"):
        preflight(_folder(tmp_path, ["Qwen3NextForCausalLM"]), _quant())


def test_a_family_lmdeploy_runs_on_no_engine_is_refused_for_the_lmdeploy_format(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ["NemotronForCausalLM"])
    with pytest.raises(ConfigError, match="runs NemotronForCausalLM on neither engine.*fix: --format gguf"):
        preflight(folder, _quant())
    gguf = preflight(folder, _quant(format="gguf"))  # llama.cpp serves it: GPTQ in ggml's blocks of 32
    assert (gguf.scheme.layout, gguf.scheme.group_size, gguf.engine) == ("gguf", 32, None)


def test_a_group_no_layer_size_divides_is_refused_before_loading(tmp_path: Path) -> None:
    odd = {"hidden_size": 600, "intermediate_size": 1600, "num_attention_heads": 10}  # 60-wide heads
    with pytest.raises(ConfigError, match=r"none of 128, 64, 32 divides model.layers.0.*in_features 600"):
        preflight(_folder(tmp_path, ["LlamaForCausalLM"], **odd), _quant())
    with pytest.raises(ConfigError, match="ggml's blocks of 32 do not divide"):
        preflight(_folder(tmp_path, ["LlamaForCausalLM"], **odd), _quant(format="gguf"))


def test_an_explicit_scheme_no_engine_serves_is_said_before_the_long_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _folder(tmp_path, ["LlamaForCausalLM"])
    with caplog.at_level(logging.WARNING, logger="deploy_opt.llm.preflight"):
        checked = preflight(folder, _quant(method="gptq", desc_act=True))
    assert checked.engine is None and checked.scheme.method == "gptq"
    [record] = caplog.records
    assert "no lmdeploy engine will serve gptq gptq at group 64" in record.message
    assert "re-quantize with --method awq" in record.message


def test_the_cli_exits_2_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deploy_opt.cli import main

    folder = _folder(tmp_path, ["FalconForCausalLM"])
    started = time.perf_counter()
    code = main(["quantize-llm", "--path", str(folder), "--output-dir", str(tmp_path / "out")])
    assert code == 2 and "not one deploy_opt quantizes" in capsys.readouterr().err
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unreadable_config_is_a_model_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match="cannot be read as a model config"):
        preflight(folder, _quant(method="gptq"))


def test_a_gguf_whose_metadata_runs_past_its_end_is_a_model_error(tmp_path: Path) -> None:
    path = _gguf(tmp_path, "llama", vocab=100)
    with open(path, "r+b") as handle:  # cut inside the token list (not read_bytes: the file is 4 GB, sparse)
        handle.truncate(200)
    with pytest.raises(ModelError, match="running past its end"):
        read_header(path)


def test_layer_wise_onload_of_a_model_with_a_vision_tower_is_refused_up_front(tmp_path: Path) -> None:
    from deploy_opt.llm.pipeline_layers import choose_onload

    folder = _folder(tmp_path, ["Gemma3ForConditionalGeneration"])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vision_config": {"hidden_size": 32}}))
    with pytest.raises(ConfigError, match="also holds a vision tower.*fix: set model.onload: memory"):
        choose_onload("layers", folder)
    assert choose_onload("auto", folder) == "memory"  # the 4 GB file would otherwise call for layers
