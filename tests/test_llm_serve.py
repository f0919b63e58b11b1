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
from deploy_opt.report.llm_report import LLMReport  # noqa: E402
from dopt_common.errors import ConfigError, DeployOptError, InputError, ReportError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy_opt", *args], capture_output=True, text=True)


def _checkpoint(
    tmp_path: Path,
    method: str | None,
    group_size: int = 128,
    *,
    desc_act: bool = False,
    sym: bool = True,
    arch: str = "LlamaForCausalLM",
) -> Path:
    """A config.json-only folder with the quantization_config our writer puts there (AWQ GEMM, or AutoGPTQ v1)."""
    folder = tmp_path / f"ckpt-{method}-{group_size}-{desc_act}-{sym}-{arch}"
    folder.mkdir()
    config: dict = {"architectures": [arch]}
    if method == "awq":
        config["quantization_config"] = {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
        }
    elif method:
        config["quantization_config"] = {
            "quant_method": method,
            "bits": 4,
            "group_size": group_size,
            "desc_act": desc_act,
            "sym": sym,
        }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _options(stdout: str, ckpt: Path) -> dict[str, str]:
    argv = shlex.split(stdout.strip())
    assert argv[:4] == ["lmdeploy", "serve", "api_server", str(ckpt.resolve())]
    return dict(zip(argv[4::2], argv[5::2], strict=True))


# lmdeploy 0.18: TurboMind reads awq and gptq at group 128 only (turbomind/converter.py, _SUPPORTED_GROUP_SIZES),
# gptq only symmetric without act-order (get_tm_config); the PyTorch engine reads awq at any group but has no gptq
# (pytorch/config.py, QuantizationConfig.from_config). --model-format goes to TurboMind only and must equal the
# checkpoint's quant_method; the PyTorch engine gets none (--model-format hf makes it raise).
@pytest.mark.parametrize(
    ("method", "group", "backend", "fmt"),
    [
        ("gptq", 128, "turbomind", "gptq"),
        ("awq", 128, "turbomind", "awq"),
        ("awq", 64, "pytorch", None),  # TurboMind serves group 128 only; the PyTorch engine reads AWQ g64
        ("awq", 32, "pytorch", None),
        (None, 0, "turbomind", None),  # a float folder: no --model-format at all
    ],
)
def test_dry_run_routes_to_the_engine_that_reads_the_checkpoint(
    tmp_path: Path, method: str | None, group: int, backend: str, fmt: str | None
) -> None:
    ckpt = _checkpoint(tmp_path, method, group)
    result = _cli("serve", str(ckpt), "--dry-run", "--port", "8011", "--tp", "2")
    assert result.returncode == 0, result.stderr
    expected = {"--backend": backend, "--server-port": "8011", "--tp": "2"}
    if fmt:
        expected["--model-format"] = fmt
    assert _options(result.stdout, ckpt) == expected


@pytest.mark.parametrize(
    ("method", "group", "extra", "why", "advice"),
    [
        ("gptq", 64, {}, "group_size 64", "--method awq"),  # the old default's g64 on SmolLM2
        ("gptq", 128, {"desc_act": True}, "desc_act true", "--no-desc-act"),  # act-order
        ("gptq", 128, {"sym": False}, "sym false", "--no-desc-act --symmetric"),
        ("gptq", -1, {}, "group_size -1", "--method awq"),
        ("awq", 8, {}, "group of 16 or more", "--method awq"),
        ("awq", 48, {}, "needs a power of two", "--method awq"),  # lmdeploy's Triton AWQ kernel: tl.arange
        ("torchao", 128, {}, "no torchao", "--method awq"),
    ],
)
def test_a_checkpoint_no_engine_serves_is_refused_with_requantize_advice(
    tmp_path: Path, method: str, group: int, extra: dict, why: str, advice: str
) -> None:
    ckpt = _checkpoint(tmp_path, method, group, **extra)
    result = _cli("serve", str(ckpt), "--dry-run")
    assert result.returncode == 2 and not result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "neither engine" in lines[0] and why in lines[0] and advice in lines[0], lines
    with pytest.raises(ConfigError, match="re-quantize"):
        serve_mod.serve_command(ckpt, ServeConfig())


@pytest.mark.parametrize(
    ("method", "group", "backend", "why", "fix"),
    [
        ("awq", 64, "turbomind", "group_size 64", "--backend pytorch"),
        ("gptq", 128, "pytorch", "no gptq", "--backend turbomind"),
    ],
)
def test_forcing_an_engine_that_refuses_the_checkpoint_is_an_error(
    tmp_path: Path, method: str, group: int, backend: str, why: str, fix: str
) -> None:
    result = _cli("serve", str(_checkpoint(tmp_path, method, group)), "--dry-run", "--backend", backend)
    assert result.returncode == 2
    assert why in result.stderr and fix in result.stderr


# lmdeploy 0.18's CLI calls archs.autoget_backend for every --backend but pytorch (cli/serve.py), which picks
# TurboMind only for the architectures in turbomind/supported_models.py; Mistral, Phi-3 and Gemma are not there.
@pytest.mark.parametrize("arch", ["MistralForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM"])
@pytest.mark.slow
def test_a_gptq_checkpoint_of_an_architecture_turbomind_lacks_is_refused(tmp_path: Path, arch: str) -> None:
    ckpt = _checkpoint(tmp_path, "gptq", 128, arch=arch)
    result = _cli("serve", str(ckpt), "--dry-run")
    assert result.returncode == 2 and not result.stdout
    [line] = result.stderr.strip().splitlines()
    assert f"architecture {arch} is not in TurboMind's list" in line and "no gptq" in line, line
    assert f"re-quantize with --method awq (lmdeploy serves {arch} on its PyTorch engine only" in line, line
    forced = _cli("serve", str(ckpt), "--dry-run", "--backend", "turbomind")
    assert forced.returncode == 2 and "whatever --backend says" in forced.stderr


@pytest.mark.parametrize(("method", "group"), [("awq", 128), ("awq", 64), (None, 0)])
@pytest.mark.slow
def test_an_architecture_turbomind_lacks_goes_to_the_pytorch_engine(tmp_path: Path, method, group) -> None:
    ckpt = _checkpoint(tmp_path, method, group, arch="MistralForCausalLM")
    result = _cli("serve", str(ckpt), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert _options(result.stdout, ckpt)["--backend"] == "pytorch" and "--model-format" not in result.stdout
    forced = _cli("serve", str(ckpt), "--dry-run", "--backend", "turbomind")
    assert forced.returncode == 2 and "serve with --backend pytorch" in forced.stderr


def test_an_architecture_neither_engine_runs_is_refused_naming_the_gguf_route(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, "awq", 128, arch="NemotronForCausalLM")  # in no list of lmdeploy 0.18
    result = _cli("serve", str(ckpt), "--dry-run")
    assert result.returncode == 2 and not result.stdout
    [line] = result.stderr.strip().splitlines()
    assert "not in the PyTorch engine's list" in line and "runs NemotronForCausalLM on neither engine" in line, line
    assert "--format gguf" in line, line


def test_forcing_the_pytorch_engine_on_a_float_folder_passes_no_model_format(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, None)
    result = _cli("serve", str(ckpt), "--dry-run", "--backend", "pytorch")
    assert result.returncode == 0, result.stderr
    assert "--model-format" not in result.stdout and _options(result.stdout, ckpt)["--backend"] == "pytorch"


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
    assert apply_ppl_gate(LLMReport.from_json(_report(10.0, 10.4)), "5%").passed
    failed = apply_ppl_gate(LLMReport.from_json(_report(10.0, 10.6)), "5%")
    assert not failed.passed and "+6.0%" in failed.criteria[0].text
    assert not apply_ppl_gate(LLMReport.from_json(_report(10.0, 10.1, stable=False)), "5%").passed


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


def test_a_checkpoint_tp_cannot_split_is_refused_before_lmdeploy_starts(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, "awq", 128)
    config = json.loads((ckpt / "config.json").read_text())
    config |= {"num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768, "intermediate_size": 1536}
    (ckpt / "config.json").write_text(json.dumps(config))
    assert "--tp" in " ".join(serve_mod.serve_command(ckpt, ServeConfig(tp=2)))  # 768 / 2 = 3 groups of 128
    result = _cli("serve", str(ckpt), "--dry-run", "--tp", "4")
    assert result.returncode == 2 and not result.stdout
    [line] = result.stderr.strip().splitlines()
    assert "num_attention_heads 12" not in line and "hidden_size 768 / --tp 4 = 192 is not a whole number" in line
    with pytest.raises(ConfigError, match=r"num_attention_heads 12 does not divide by --tp 8"):
        serve_mod.serve_command(ckpt, ServeConfig(tp=8))
