"""``quantize-llm`` end to end on a tiny random Llama: every method writes a checkpoint that reloads and answers,
a report with perplexity, stability and per-layer errors, and a gate verdict; ``serve --dry-run`` on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_llama

from deploy_opt.llm.config import load_llm_config
from deploy_opt.llm.pipeline import run_quantize_llm
from deploy_opt.report.llm_report import LLMReport
from dopt_common.errors import ConfigError, InputError, OutputError


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama") / "model")


def _config(folder: Path, method: str | None, **quant):
    """A short run of ``method`` at group 32 (None: the defaults, method and group_size auto)."""
    flags = {
        "name": f"tiny-{method or 'default'}",
        "model": {"path": str(folder)},
        "quantization": {"method": method, "group_size": 32, **quant} if method else {},
        "calibration": {"samples": 32, "max_seq_len": 64},
        "checks": {"eval_tokens": 256, "eval_seq_len": 64, "generations": 2, "max_new_tokens": 16},
        "gate": {"max_ppl_increase": "50%"},
    }
    return load_llm_config(None, flags)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq", "rtn"])
def test_each_method_writes_a_checked_checkpoint(tiny_folder: Path, tmp_path: Path, method: str) -> None:
    result = run_quantize_llm(_config(tiny_folder, method), tmp_path, progress=False)
    report = json.loads((result.out_dir / "quantize_report.json").read_text())
    assert report == json.loads(json.dumps(result.report.to_json()))
    assert LLMReport.from_json(report).to_json() == report  # the typed record reads back as written
    assert report["format"] == "deploy_opt.llm_quantize/1" and report["method"] == method
    # Per-layer errors for the 7 Linears of each of the 2 layers; embeddings and lm_head kept.
    layers = report["quantization"]["layers"]
    assert len(layers) == 14 and all(0 < layer["weight_error"] < 1 for layer in layers)
    assert not any("embed_tokens" in layer["name"] or "lm_head" in layer["name"] for layer in layers)
    assert report["calibration"]["counts"] and report["calibration"]["sample_hash"]
    ppl = report["perplexity"]
    assert ppl["original"]["ppl"] > 1 and ppl["quantized"]["ppl"] > 1
    assert ppl["increase"] == pytest.approx(ppl["quantized"]["ppl"] / ppl["original"]["ppl"] - 1)
    assert report["stability"]["generations"] == 2 and "ok" in report["stability"]
    # The written checkpoint reloads and its logits match the in-memory quantized model (fp16 scales).
    assert report["checkpoint"]["reload"]["max_logit_diff"] < 0.05
    assert report["checkpoint"]["format"] == ("awq" if method == "awq" else "gptq")
    assert report["config"]["quantization"]["method"] == method and report["versions"]["torch"]
    assert result.gate.passed == report["gate"]["passed"]
    assert report["scheme"]["method"] == method and "as configured" in report["scheme"]["reason"]
    # lmdeploy 0.18 serves AWQ g32 on its PyTorch engine only; GPTQ-layout codes at g32 on neither engine, and
    # serve --dry-run agrees with the report either way.
    out = _serve_dry_run(result.out_dir / "checkpoint")
    if method == "awq":
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == report["serve_command"] == report["serve"]["command"]
        assert report["serve"]["backend"] == "pytorch" and "--model-format" not in out.stdout
    else:
        assert out.returncode == 2 and "neither engine" in out.stderr and "--method awq" in out.stderr
        assert report["serve"]["servable"] is False and out.stderr.strip().endswith(report["serve"]["reason"])
        assert "serve_command" not in report


def _serve_dry_run(checkpoint: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "deploy_opt", "serve", str(checkpoint), "--dry-run"]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.fixture(scope="module")
def tiny_folder_128(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama_128") / "model", hidden=128)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hidden", "group", "backend"),
    [(64, 64, "pytorch"), (128, 128, "turbomind")],  # 64 like SmolLM2's 576: 128 does not divide
)
def test_the_default_writes_a_checkpoint_lmdeploy_serves(
    request: pytest.FixtureRequest, tmp_path: Path, hidden: int, group: int, backend: str
) -> None:
    folder = request.getfixturevalue("tiny_folder" if hidden == 64 else "tiny_folder_128")
    config = _config(folder, None)
    assert (config.quantization.method, config.quantization.group_size) == ("auto", "auto")
    report = run_quantize_llm(config, tmp_path, progress=False).report.to_json()
    scheme = report["scheme"]
    assert (scheme["method"], scheme["layout"], scheme["group_size"], scheme["desc_act"]) == (
        "awq-gptq",
        "awq",
        group,
        False,
    )
    assert scheme["requested"]["method"] == "auto" and "method auto" in scheme["reason"]
    qconfig = json.loads((tmp_path / config.name / "checkpoint" / "config.json").read_text())["quantization_config"]
    assert (qconfig["quant_method"], qconfig["group_size"], qconfig.get("desc_act", False)) == ("awq", group, False)
    # The default calibration text is the mixed corpus: several domains, none above half of the windows.
    shares = report["calibration"]["domain_share"]
    assert {"python-docs", "docstrings"} <= set(shares) and max(shares.values()) <= 0.5
    assert "code" not in shares  # not in the default mix: it measured worse on the decide split
    out = _serve_dry_run(tmp_path / config.name / "checkpoint")
    assert out.returncode == 0, out.stderr
    assert report["serve"]["backend"] == backend and f"--backend {backend}" in out.stdout


@pytest.mark.slow
def test_an_act_order_gptq_checkpoint_quantizes_but_serve_refuses_it(tiny_folder_128: Path, tmp_path: Path) -> None:
    config = _config(tiny_folder_128, "gptq", group_size=128, desc_act=True)
    report = run_quantize_llm(config, tmp_path, progress=False).report.to_json()
    qconfig = json.loads((tmp_path / config.name / "checkpoint" / "config.json").read_text())["quantization_config"]
    assert qconfig["desc_act"] is True and report["serve"]["servable"] is False
    assert "--no-desc-act" in report["serve"]["reason"] and "serve_command" not in report
    out = _serve_dry_run(tmp_path / config.name / "checkpoint")
    assert out.returncode == 2 and "desc_act true" in out.stderr and "--no-desc-act" in out.stderr


@pytest.mark.slow
def test_group_size_that_does_not_divide_is_an_error_naming_the_layer(tiny_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"group_size 128 does not divide .*q_proj \(in_features 64\)"):
        run_quantize_llm(_config(tiny_folder, "gptq", group_size=128), tmp_path, progress=False)
    assert not any(tmp_path.iterdir()), "a failed run left files behind"


@pytest.mark.slow
def test_evaluation_text_that_is_also_calibration_text_is_refused(tiny_folder: Path, tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("The same words for both. " * 200)
    config = load_llm_config(
        None,
        {
            "model": {"path": str(tiny_folder)},
            "quantization": {"group_size": 32},
            "calibration": {"texts": [str(text)], "samples": 4, "max_seq_len": 64},
            "checks": {"eval_texts": [str(text)]},
        },
    )
    with pytest.raises(InputError, match="held-out"):
        run_quantize_llm(config, tmp_path / "out", progress=False)


@pytest.mark.slow
def test_torchao_int8_weight_only_runs_with_the_same_checks(tiny_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    result = run_quantize_llm(_config(tiny_folder, "torchao-int8-wo"), tmp_path, progress=False)
    report = result.report.to_json()
    assert report["checkpoint"]["format"] == "torchao" and "serve_command" not in report
    assert report["perplexity"]["increase"] < 0.05  # int8 weight-only barely moves a model
    assert report["checkpoint"]["reload"]["max_logit_diff"] < 1e-3


@pytest.mark.slow
def test_default_name_kv_checks_and_another_models_folder(tiny_folder: Path, tmp_path: Path) -> None:
    flags = tiny_llama.rtn_kv_flags(tiny_folder, session_len=1024)
    result = run_quantize_llm(load_llm_config(None, flags), tmp_path, progress=False)
    assert result.out_dir.name == "model-rtn-g32"  # <model folder>-<method>-g<group>
    report = result.report.to_json()
    kv = report["kv_cache"]
    assert kv["kv_cache"] == "int8" and kv["perplexity"]["kv_bits"] == 8
    quantized_ppl = report["perplexity"]["quantized"]["ppl"]
    assert kv["increase_vs_quantized"] == pytest.approx(kv["perplexity"]["ppl"] / quantized_ppl - 1)
    # head_dim 16: 16 int8 bytes plus a 4-byte scale and zero point against 32 fp16 bytes, per head and token.
    assert kv["memory"]["session_len"] == 1024 and kv["memory"]["saved_fraction"] == pytest.approx(1 - 20 / 32)
    assert kv["stability"]["generations"] == 2 and "fp_text" in kv["stability"]["runs"][0]
    assert {c["name"] for c in report["gate"]["criteria"]} >= {"perplexity_kv_cache", "stability_kv_cache"}
    assert "fp_text" in report["stability"]["runs"][0] and "excused" in report["stability"]
    # Another model under the same name is refused, and the first run's folder is untouched.
    other = tiny_llama.make_tiny_llama(tmp_path / "elsewhere" / "model", seed=1)
    with pytest.raises(OutputError, match="holds a run of another model"):
        run_quantize_llm(load_llm_config(None, {**flags, "model": {"path": str(other)}}), tmp_path, progress=False)
    assert (result.out_dir / "quantize_report.json").is_file()
