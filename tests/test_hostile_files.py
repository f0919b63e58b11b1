"""Hostile files (issue 54): damaged or malicious weights, a GGUF claiming 2**62 tensors, a config that is a device,
a FIFO, binary or huge, an empty DEPLOY_OPT_PROFILES and a corrupt search.db. Each ends in exit 2 with one line
that names the file, the fault and the fix; no code in a pickle runs and no read runs for ever."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from deploy_opt.cli import main

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 32,  # group 32 divides it: the header passes, and loading meets the damaged file
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI, require exit 2 and return its one stderr line."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    last = err.splitlines()[-1]
    assert "Traceback" not in err and "fix" in last, err
    return last


def _llm_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA), encoding="utf-8")
    return folder


def _safetensors(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


ONE_TENSOR = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
BAD_SAFETENSORS = {
    "header length over the cap": (_safetensors(b"{}", length=2**40), "over the 104,857,600 cap"),
    "header longer than the file": (_safetensors(b"{}", length=4096), "but the file is"),
    "header not JSON": (_safetensors(b"\xff\xfe not json"), "not UTF-8 JSON"),
    "header a list": (_safetensors(b"[1, 2]"), "not an object"),
    "offsets past the end": (_safetensors(ONE_TENSOR, b"\0" * 8), "outside its 8 data bytes"),
    "shorter than 8 bytes": (b"\x01\x02", "shorter than the 8-byte header length"),
}


@pytest.mark.parametrize("case", sorted(BAD_SAFETENSORS))
def test_a_damaged_safetensors_file_is_exit_2_naming_it(case: str, tmp_path: Path, capsys) -> None:
    blob, fault = BAD_SAFETENSORS[case]
    folder = _llm_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(blob)
    line = _run(["quantize-llm", "--path", str(folder), "--output-dir", str(tmp_path / "out")], capsys)
    assert "model.safetensors" in line and fault in line, line


class _RunsCode:
    """Pickles as a call to os.system: what a malicious pytorch_model.bin carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused_unopened(tmp_path: Path, capsys) -> None:
    import torch

    folder = _llm_folder(tmp_path)
    marker = tmp_path / "code-ran"
    torch.save({"model.embed_tokens.weight": _RunsCode(marker)}, folder / "pytorch_model.bin")
    line = _run(["quantize-llm", "--path", str(folder), "--output-dir", str(tmp_path / "out")], capsys)
    assert "pytorch_model.bin" in line and "posix.system" in line and "refused unopened" in line, line
    assert not marker.exists()


def test_a_truncated_pytorch_model_bin_is_exit_2(tmp_path: Path, capsys) -> None:
    import torch

    folder = _llm_folder(tmp_path)
    torch.save({"w": torch.zeros(64)}, folder / "pytorch_model.bin")
    blob = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(blob[: len(blob) // 2])
    line = _run(["quantize-llm", "--path", str(folder), "--output-dir", str(tmp_path / "out")], capsys)
    assert "pytorch_model.bin" in line and "cannot be loaded with weights_only=True" in line, line


def _gguf(tensors: int, pairs: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, pairs) + b"\0" * 64


@pytest.mark.parametrize(
    ("blob", "fault"),
    [
        (_gguf(2**62, 0), "claims 4,611,686,018,427,387,904 tensors, over the 1,000,000 cap"),
        (_gguf(0, 2**62), "metadata pairs, over the 1,000,000 cap"),
        (_gguf(1000, 10), "(truncated?)"),
        (_gguf(1, 1, version=99), "has version 99"),
        (b"GGML" + b"\0" * 40, "does not start with a GGUF header"),
    ],
)
def test_a_hostile_gguf_header_is_exit_2_before_any_reader(blob: bytes, fault: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(blob)
    line = _run(["quantize-llm", "--path", str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert "model.gguf" in line and fault in line, line


# ----------------------------------------------------------------------------------------------- config files


def _hostile_config(kind: str, tmp_path: Path) -> Path:
    if kind == "device":
        return Path("/dev/zero")
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "binary":
        path.write_bytes(b"name: x\n\xff\xfe\x00\x81")
    elif kind == "huge":
        with open(path, "wb") as handle:  # sparse: 16 MiB + 1 on paper, nothing on disk
            handle.truncate(16 * 2**20 + 1)
    return path


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("device", "is not a regular file"),
        ("fifo", "is not a regular file"),
        ("binary", "is not UTF-8 text"),
        ("huge", "over the 16,777,216-byte cap"),
    ],
)
@pytest.mark.parametrize("command", [["build"], ["train", "search"]])
def test_a_config_that_is_not_a_small_text_file_is_exit_2(
    kind: str, fault: str, command: list[str], tmp_path: Path, capsys
) -> None:
    path = _hostile_config(kind, tmp_path)
    line = _run([*command, str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert str(path) in line and fault in line, line


def test_a_profile_that_is_a_fifo_is_exit_2(tmp_path: Path, capsys) -> None:
    path = _hostile_config("fifo", tmp_path)
    line = _run(["build", "--profile", str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert "profile" in line and "is not a regular file" in line, line


# ------------------------------------------------------------------------------------------ DEPLOY_OPT_PROFILES


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_profiles_variable_means_the_built_in_presets(value: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DEPLOY_OPT_PROFILES", value)
    assert main(["profiles"]) == 0
    assert "cpu-server" in capsys.readouterr().out


def test_a_profiles_variable_naming_no_folder_is_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DEPLOY_OPT_PROFILES", str(tmp_path / "nowhere"))
    line = _run(["profiles"], capsys)
    assert "DEPLOY_OPT_PROFILES=" in line and "nowhere" in line and "unset it" in line, line


# --------------------------------------------------------------------------------------------------- search.db


@pytest.mark.parametrize(
    "content", [b"not a database" * 100, b"SQLite format 3\0" + b"\xff" * 200], ids=["garbage", "bad-pages"]
)
def test_a_corrupt_search_db_is_exit_2_naming_the_fix(content: bytes, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "out" / "train_digits-search"
    folder.mkdir(parents=True)
    (folder / "search.db").write_bytes(content)
    line = _run(["train", "search", "--trials", "12", "--output-dir", str(tmp_path / "out")], capsys)
    assert "search.db" in line and "not a readable Optuna database" in line and "delete it" in line, line


# ------------------------------------------------------------------------------------- ONNX files, model.hf


@pytest.mark.parametrize(("blob", "guess"), [(b"\x08\xff" * 500, "truncated, or another format"), (b"hi\n", "text")])
def test_init_with_a_file_that_is_not_onnx_is_exit_2(blob: bytes, guess: str, tmp_path: Path, capsys) -> None:
    import numpy as np

    model, data = tmp_path / "model.onnx", tmp_path / "data.npz"
    model.write_bytes(blob)
    np.savez(data, x=np.zeros((4, 16), np.float32), label=np.zeros(4))
    line = _run(["init", str(model), str(data), str(data), "-o", str(tmp_path / "c.yaml")], capsys)
    assert "model.onnx" in line and "is not a readable ONNX model" in line and guess in line, line


def test_build_with_a_hf_folder_whose_safetensors_is_damaged_is_refused(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from deploy_opt.stages.hf_model import load_hf_model
    from dopt_common.errors import CheckpointError

    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(_safetensors(b"{}", length=2**40))
    model = SimpleNamespace(hf="bert", task="text-classification")
    with pytest.raises(CheckpointError, match=r"bert/model.safetensors' is not valid safetensors: .* over the"):
        load_hf_model(model, str(tmp_path))


@pytest.mark.parametrize("shard", ["../../outside.safetensors", 7])
def test_a_shard_index_naming_a_file_outside_the_folder_is_exit_2(shard: object, tmp_path: Path, capsys) -> None:
    folder = _llm_folder(tmp_path)
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    (folder / "model-00001-of-00001.safetensors").write_bytes(_safetensors(b"{}"))
    argv = ["quantize-llm", "--path", str(folder), "--onload", "layers", "--output-dir", str(tmp_path / "o")]
    line = _run(argv, capsys)
    assert "model.safetensors.index.json' is not a safetensors index" in line and "not a file in the folder" in line
