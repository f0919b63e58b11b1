"""KV-cache quantization: the per-head, per-token asymmetric simulation inside the HF model, the memory it saves,
``serve --kv-cache`` → lmdeploy's ``--quant-policy``, and the KV checks in the report and gate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

import tiny_llama  # noqa: E402
import torch  # noqa: E402

from deploy_opt.llm.kv_cache import check_engine_policy, fake_quantize, kv_bits, kv_memory, simulated_kv_cache  # noqa: E402
from deploy_opt.report.gate import apply_ppl_gate  # noqa: E402
from deploy_opt.report.llm_report import LLMReport  # noqa: E402
from dopt_common.errors import ConfigError  # noqa: E402


def test_fake_quantize_is_per_head_and_token_asymmetric() -> None:
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(1, 2, 5, 64, generator=gen) * torch.tensor([1.0, 30.0])[None, :, None, None] + 3.0
    for bits in (8, 4):
        out = fake_quantize(states, bits)
        span = states.amax(-1, keepdim=True) - states.amin(-1, keepdim=True)
        # Each (head, token) row keeps its own min and max exactly and rounds inside by at most half a step.
        assert torch.allclose(out.amin(-1), states.amin(-1), atol=1e-5)
        assert torch.allclose(out.amax(-1), states.amax(-1), atol=1e-4)
        assert ((out - states).abs() <= span / (2**bits - 1) / 2 + 1e-5).all()
        assert len(torch.unique(out[0, 0, 0])) <= 2**bits
    assert kv_bits("none") is None and kv_bits("int4") == 4
    with pytest.raises(ConfigError, match="none, int8 or int4"):
        kv_bits("fp8")


def test_the_simulation_quantizes_what_the_cache_holds_and_only_while_entered(tmp_path: Path) -> None:
    from deploy_opt.llm.gguf_model import load_model_folder

    model, _ = load_model_folder(tiny_llama.make_tiny_llama(tmp_path / "tiny"))
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=True).logits
        with simulated_kv_cache(8):
            int8 = model(input_ids=ids, use_cache=True).logits
        with simulated_kv_cache(4):
            int4 = model(input_ids=ids, use_cache=True).logits
        after = model(input_ids=ids, use_cache=True).logits
    assert torch.equal(plain, after)  # the patch is gone on exit
    err8, err4 = (plain - int8).abs().max(), (plain - int4).abs().max()
    assert 0 < err8 < err4  # int8 changes the logits a little, int4 more


def test_kv_memory_matches_the_arithmetic_for_smollm2() -> None:
    config = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    fp16 = kv_memory(config, 4096, None)
    assert fp16["fp16_bytes_per_token"] == 2 * 30 * 3 * 64 * 2 == 23_040 and "bytes" not in fp16
    int8 = kv_memory(config, 4096, 8)
    assert int8["bytes_per_token"] == 2 * 30 * 3 * (64 + 4)
    assert int8["saved_bytes"] == (23_040 - 12_240) * 4096 and int8["saved_fraction"] == pytest.approx(0.46875)
    assert kv_memory(config, 4096, 4)["bytes_per_token"] == 2 * 30 * 3 * (32 + 4)


def test_serve_kv_cache_maps_to_lmdeploys_quant_policy(tmp_path: Path) -> None:
    assert check_engine_policy("int8", "turbomind") == 8 and check_engine_policy("int4", "pytorch") == 4
    with pytest.raises(ConfigError, match="use int8 or int4"):
        check_engine_policy("none", "turbomind")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(
        '{"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64,'
        ' "zero_point": true, "version": "gemm"}}'
    )
    out = subprocess.run(
        [sys.executable, "-m", "deploy_opt", "serve", str(ckpt), "--dry-run", "--kv-cache", "int8"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["--quant-policy", "8"] and "--backend pytorch" in out.stdout


def test_the_gate_judges_the_kv_cache_checks() -> None:
    def report(kv_ppl: float, kv_ok: bool) -> dict:
        return {
            "perplexity": {"original": {"ppl": 10.0}, "quantized": {"ppl": 10.5}},
            "stability": {"ok": True, "flagged": 0, "generations": 8, "baseline": {}, "excused": 1},
            "kv_cache": {
                "kv_cache": "int4",
                "perplexity": {"ppl": kv_ppl},
                "stability": {"ok": kv_ok, "flagged": 0 if kv_ok else 1, "generations": 8},
            },
        }

    passed = apply_ppl_gate(LLMReport.from_json(report(10.6, True)), "10%")
    assert passed.passed and [c.name for c in passed.criteria] == [
        "max_ppl_increase",
        "stability",
        "perplexity_kv_cache",
        "stability_kv_cache",
    ]
    assert "with the int4 KV cache" in passed.criteria[2].text and "1 excused" in passed.criteria[1].text
    assert not apply_ppl_gate(LLMReport.from_json(report(11.5, True)), "10%").passed
    assert not apply_ppl_gate(LLMReport.from_json(report(10.6, False)), "10%").passed
