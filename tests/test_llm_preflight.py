"""quantize-llm refuses an architecture it cannot quantize, or AWQ on a family without AWQ groups, from the
model's header alone: exit 2 in seconds, before a single weight is read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from deploy_opt.llm.preflight import model_architecture, preflight
from dopt_common.errors import ConfigError, ModelError


def _folder(tmp_path: Path, architectures: list[str]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": architectures}), encoding="utf-8")
    # A weight file nobody may open: the checks must decide from config.json alone.
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def _gguf(tmp_path: Path, arch: str) -> Path:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_supported_families_pass_and_name_their_table_entry(tmp_path: Path) -> None:
    assert preflight(_folder(tmp_path, ["Gemma3ForCausalLM"]), "awq-gptq").family == "Gemma3"
    assert model_architecture(_gguf(tmp_path, "qwen2"))[1].family == "Qwen2"


def test_an_unknown_architecture_is_refused_naming_what_is_supported(tmp_path: Path) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="'FalconForCausalLM'.*not one deploy_opt quantizes.*Gemma3"):
        preflight(_folder(tmp_path, ["FalconForCausalLM"]), "gptq")
    with pytest.raises(ConfigError, match="'bloom'.*supported: Llama"):
        preflight(_gguf(tmp_path, "bloom"), "auto")
    assert time.perf_counter() - started < 5


def test_awq_on_a_family_without_awq_groups_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ["NemotronForCausalLM"])
    assert preflight(folder, "gptq").family == "Nemotron"
    with pytest.raises(ConfigError, match="method awq needs AWQ scale groups.*fix: use method gptq"):
        preflight(folder, "awq")


def test_the_cli_exits_2_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deploy_opt.cli import main

    folder = _folder(tmp_path, ["FalconForCausalLM"])
    code = main(["quantize-llm", "--path", str(folder), "--output-dir", str(tmp_path / "out")])
    assert code == 2 and "not one deploy_opt quantizes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unreadable_config_is_a_model_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match="cannot be read as a model config"):
        preflight(folder, "gptq")
