"""``serve`` (the lmdeploy command, the host checks), the llm config and flags, and the perplexity gate."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_opt.llm import serve as serve_mod
from deploy_opt.llm.config import ServeConfig, load_llm_config
from deploy_opt.report.gate import apply_ppl_gate, parse_increase
from dopt_common.errors import ConfigError, DeployOptError, InputError, ReportError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy_opt", *args], capture_output=True, text=True)


def _checkpoint(tmp_path: Path, method: str | None, group_size: int = 64) -> Path:
    folder = tmp_path / f"ckpt-{method}-{group_size}"
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"]}
    if method:
        config["quantization_config"] = {
            "quant_method": method,
            "bits": 4,
            "group_size": group_size,
            "desc_act": False,
            "sym": True,
        }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("method", "group", "fmt", "backend"),
    [
        ("gptq", 128, "gptq", "turbomind"),
        ("awq", 128, "awq", "turbomind"),
        ("gptq", 64, "gptq", "pytorch"),  # TurboMind serves group 128 only: auto picks the PyTorch engine
        ("awq", 64, "awq", "pytorch"),
        (None, 0, "hf", "turbomind"),
    ],
)
def test_dry_run_prints_the_lmdeploy_command(
    tmp_path: Path, method: str | None, group: int, fmt: str, backend: str
) -> None:
    ckpt = _checkpoint(tmp_path, method, group)
    result = _cli("serve", str(ckpt), "--dry-run", "--port", "8011", "--tp", "2")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    assert argv[:4] == ["lmdeploy", "serve", "api_server", str(ckpt.resolve())]
    options = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert options == {"--model-format": fmt, "--backend": backend, "--server-port": "8011", "--tp": "2"}


def test_forcing_turbomind_on_a_checkpoint_it_refuses_is_an_error(tmp_path: Path) -> None:
    result = _cli("serve", str(_checkpoint(tmp_path, "gptq", 64)), "--dry-run", "--backend", "turbomind")
    assert result.returncode == 2
    assert "group_size 64" in result.stderr and "--backend pytorch" in result.stderr


def test_profile_serve_section_sets_the_defaults(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, "gptq")
    result = _cli("serve", str(ckpt), "--dry-run", "--profile", "a100", "--session-len", "4096")
    assert result.returncode == 0, result.stderr
    assert "--tp 1" in result.stdout and "--server-port 23333" in result.stdout
    assert "--session-len 4096" in result.stdout


def test_serving_without_a_gpu_exits_2_naming_what_is_missing(tmp_path: Path) -> None:
    if serve_mod.cuda_gpus():
        pytest.skip("this machine has a CUDA GPU")
    result = _cli("serve", str(_checkpoint(tmp_path, "awq")))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA GPU" in lines[0] and "pip install lmdeploy" in lines[0]


def test_missing_lmdeploy_is_named_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_mod, "cuda_gpus", lambda: ["GPU 0: NVIDIA H200 (UUID: x)"])
    with pytest.raises(serve_mod.ServeError, match="not on PATH.*pip install lmdeploy"):
        serve_mod.check_host("lmdeploy-that-does-not-exist", 1)
    with pytest.raises(ConfigError, match="1 GPU"):
        serve_mod.check_host("lmdeploy-that-does-not-exist", 4)


def test_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no config.json"):
        serve_mod.serve_command(tmp_path, ServeConfig())
    result = _cli("serve", str(tmp_path), "--dry-run")
    assert result.returncode == 2 and "no config.json" in result.stderr


def test_unservable_quant_method_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="torchao"):
        serve_mod.model_format(_checkpoint(tmp_path, "torchao"))


def test_llm_config_file_profile_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text("name: x\nquantization:\n  method: awq\n  group_size: 64\ncalibration:\n  samples: 600\n")
    config = load_llm_config(path, {"quantization": {"desc_act": False}}, {"serve": {"tp": 2}})
    assert (config.quantization.method, config.quantization.group_size, config.quantization.desc_act) == (
        "awq",
        64,
        False,
    )
    assert config.calibration.samples == 600 and config.serve.tp == 2
    assert config.quantization.keep == ("embed_tokens", "lm_head")
    path.write_text("quantization:\n  groupsize: 64\n")
    with pytest.raises(ConfigError, match="unknown key 'quantization.groupsize'.*group_size"):
        load_llm_config(path)
    with pytest.raises(ConfigError, match="group_size 100"):
        load_llm_config(None, {"quantization": {"group_size": 100}})


def test_every_field_is_a_flag() -> None:
    result = _cli("quantize-llm", "--help")
    assert result.returncode == 0
    for flag in (
        "--method",
        "--group-size",
        "--no-desc-act",
        "--keep",
        "--samples",
        "--max-seq-len",
        "--texts",
        "--max-ppl-increase",
        "--tp",
    ):
        assert flag in result.stdout, flag


def _report(before: float, after: float, stable: bool = True) -> dict:
    return {
        "name": "x",
        "perplexity": {"original": {"ppl": before}, "quantized": {"ppl": after}},
        "stability": {"ok": stable, "flagged": 0 if stable else 2, "generations": 8},
        "config": {"gate": {"max_ppl_increase": "10%"}},
    }


def test_perplexity_gate() -> None:
    assert parse_increase("5%") == pytest.approx(0.05) and parse_increase(0.05) == 0.05
    with pytest.raises(ReportError, match="'five'"):
        parse_increase("five")
    assert apply_ppl_gate(_report(10.0, 10.4), "5%").passed
    failed = apply_ppl_gate(_report(10.0, 10.6), "5%")
    assert not failed.passed and "+6.0%" in failed.criteria[0].text
    assert not apply_ppl_gate(_report(10.0, 10.1, stable=False), "5%").passed


def test_gate_command_reads_a_quantize_report(tmp_path: Path) -> None:
    path = tmp_path / "quantize_report.json"
    path.write_text(json.dumps(_report(9.46, 10.2)))
    assert _cli("gate", str(path)).returncode == 0  # its own 10%
    result = _cli("gate", str(tmp_path), "--max-ppl-increase", "5%")
    assert result.returncode == 1 and "FAIL" in result.stdout
    path.write_text(json.dumps({"perplexity": {}}))
    assert _cli("gate", str(path), "--max-ppl-increase", "5%").returncode == 2


def test_serve_error_is_a_deploy_opt_error() -> None:
    assert issubclass(serve_mod.ServeError, DeployOptError)
