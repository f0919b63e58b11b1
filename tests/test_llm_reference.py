"""The reference GPTQ beside deploy_opt's (``llm/reference_gptq.py``): its report section from stubbed per-window
scores, the worker's protocol through a fake llm-compressor (CI has no llm-compressor venv), the real one where its
venv exists, and a run that goes on, saying so in one line, when the tool is missing."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_llama

from deploy_opt.llm import reference_gptq
from deploy_opt.llm.checks import PerplexityWindow, perplexity, plan_windows, window_nll
from deploy_opt.llm.config import load_llm_config
from deploy_opt.llm.pipeline import load_llm, run_quantize_llm

WINDOW = PerplexityWindow(max_seq_len=64, max_tokens=512)

# A stand-in for llm-compressor with the signatures the worker calls (llmcompressor 0.14: ``oneshot(model=,
# processor=, dataset=, recipe=, pipeline=)`` and ``GPTQModifier(config_groups=, actorder=, dampening_frac=,
# block_size=)``); like the real one it leaves the targets' weights quantized in place: here by round to nearest.
FAKE_INIT = """
import json, os, torch

def oneshot(model, processor, dataset, recipe, pipeline):
    seen = [batch["input_ids"][0].tolist() for batch in dataset]
    with open(os.environ["FAKE_LLMC_SEEN"], "w") as f:
        json.dump({"calibration": seen, "pipeline": pipeline, "kwargs": recipe.kwargs}, f)
    group = recipe.kwargs["config_groups"]["group_0"]
    bits, size = group["weights"]["num_bits"], group["weights"]["group_size"]
    top = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for name in group["targets"]:
            w = model.get_submodule(name).weight
            g = w.reshape(w.shape[0], -1, size)
            scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / top
            w.copy_(((g / scale).round().clamp(-top - 1, top) * scale).reshape(w.shape))
    return model
"""
FAKE_MODIFIER = """
class GPTQModifier:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
"""


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama") / "model")


def _config(folder: Path, python: str | Path, **checks):
    flags = {
        "name": "tiny-reference",
        "model": {"path": str(folder)},
        "quantization": {"method": "rtn", "group_size": 32},
        "calibration": {"texts": ["pydoc"], "samples": 8, "max_seq_len": 64},
        "checks": {
            "eval_tokens": 512,
            "eval_seq_len": 64,
            "generations": 1,
            "max_new_tokens": 8,
            "reference_gptq": True,
            "reference_python": str(python),
            **checks,
        },
        "gate": {"max_ppl_increase": "90%"},
    }
    return load_llm_config(None, flags)


def _fake_python(tmp_path: Path) -> Path:
    """A 'python' whose llmcompressor is the fake above (this interpreter, the fake package first on its path)."""
    package = tmp_path / "fake" / "llmcompressor"
    (package / "modifiers" / "quantization").mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_INIT)
    (package / "modifiers" / "__init__.py").write_text("")
    (package / "modifiers" / "quantization" / "__init__.py").write_text(FAKE_MODIFIER)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path / "fake"}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def _our_window_scores(loaded, window: PerplexityWindow) -> list[list[float]]:
    """deploy_opt's own per-window scores of the loaded model (``checks.window_nll`` on ``plan_windows``)."""
    import torch

    plan = plan_windows(loaded.tokenizer, loaded.evaluation_docs, window)
    scores = []
    with torch.no_grad():
        for number, span in enumerate(plan.spans):
            chunk = torch.tensor([plan.ids[span[0] : span[1]]])
            scores.append(list(window_nll(loaded.model(input_ids=chunk).logits, chunk, span, number)))
    return scores


@pytest.mark.slow
def test_the_worker_gets_our_windows_and_scores_them_as_we_do(tiny_folder: Path, tmp_path: Path) -> None:
    os.environ["FAKE_LLMC_SEEN"] = str(tmp_path / "seen.json")
    config = _config(tiny_folder, _fake_python(tmp_path))
    loaded = load_llm(config, tiny_folder)
    raw = reference_gptq.run_reference_gptq(config, loaded, WINDOW)
    assert raw["ran"] is True, raw
    seen = json.loads((tmp_path / "seen.json").read_text())
    # The same calibration windows, in order, one batch each; the run's group, our targets, act-order, 0.01.
    assert seen["calibration"] == [list(ids) for ids in loaded.selection.input_ids]
    group = seen["kwargs"]["config_groups"]["group_0"]
    assert group["weights"] == {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    assert len(group["targets"]) == 14 and not any("lm_head" in t or "embed" in t for t in group["targets"])
    assert seen["kwargs"]["actorder"] == "static" and seen["kwargs"]["dampening_frac"] == 0.01
    # The float model scored in the worker's process agrees window by window with deploy_opt's scoring.
    ours = _our_window_scores(loaded, WINDOW)
    np.testing.assert_allclose(raw["original_window_nll"], ours, rtol=1e-5)
    assert [t for _, t in raw["quantized_window_nll"]] == [t for _, t in ours]
    assert raw["original_window_nll"] != raw["quantized_window_nll"]
    assert "group 32" in raw["settings"] and "actorder static" in raw["settings"]


def test_the_report_quotes_both_increases_with_their_intervals() -> None:
    rng = np.random.default_rng(0)
    fp = [[float(n), 63] for n in rng.uniform(150, 250, 8)]
    ours_q = [[n * 1.05 + rng.uniform(0, 2), t] for n, t in fp]
    ref_q = [[n * 1.10 + rng.uniform(0, 2), t] for n, t in fp]
    tokens = 63 * 8

    def ppl(windows):
        return math.exp(sum(n for n, _ in windows) / tokens)

    original = {"ppl": ppl(fp), "window_nll": fp}
    quantized = {"ppl": ppl(ours_q), "window_nll": ours_q}
    raw = {"ran": True, "tool": "llm-compressor", "settings": "s", "versions": {"llmcompressor": "0.14.0.1"}}
    raw |= {"original_window_nll": fp, "quantized_window_nll": ref_q, "quantize_s": 1.0}
    record = reference_gptq.reference_record(raw, original, quantized, "awq-gptq")
    # Independent of the bootstrap: the point values are the summed-NLL ratios.
    assert record["reference"]["increase"] == pytest.approx(ppl(ref_q) / ppl(fp) - 1)
    assert record["deploy_opt"]["increase"] == pytest.approx(ppl(ours_q) / ppl(fp) - 1)
    for side in (record["reference"], record["deploy_opt"]):
        low, high = side["ci95"]
        assert low < side["increase"] < high
    assert record["difference"] == pytest.approx(record["deploy_opt"]["increase"] - record["reference"]["increase"])
    assert record["float_ppl_gap"] == pytest.approx(0.0) and record["windows"] == 8 and record["tokens"] == tokens
    paired = record["quantized_vs_reference"]  # ours 5% over FP, the reference 10%: ours is the lower
    assert paired["value"] == pytest.approx(ppl(ours_q) / ppl(ref_q) - 1) and paired["ci95"][1] < 0
    line = reference_gptq.reference_line(record)
    assert "llm-compressor 0.14.0.1" in line and "deploy_opt awq-gptq" in line and "95% CI" in line
    # Without our per-window scores, our side is the point value and says nothing of an interval.
    bare = reference_gptq.reference_record(raw, {"ppl": original["ppl"]}, {"ppl": quantized["ppl"]}, "rtn")
    assert "ci95" not in bare["deploy_opt"] and "ci95" in bare["reference"]
    assert bare["quantized_vs_reference"] is None


@pytest.mark.slow
def test_a_missing_tool_is_one_line_and_the_run_goes_on(tiny_folder: Path, tmp_path: Path) -> None:
    config = _config(tiny_folder, tmp_path / "no-such-python")
    result = run_quantize_llm(config, tmp_path / "out", progress=False)
    record = json.loads((result.out_dir / "quantize_report.json").read_text())["reference_gptq"]
    assert record["ran"] is False and "not installed" in record["reason"] and "fix:" in record["reason"]
    assert "\n" not in record["reason"]
    assert "Reference GPTQ" in (result.out_dir / "report.html").read_text()
    assert result.report.perplexity.after > 1  # deploy_opt's own numbers are all there
    assert reference_gptq.reference_line(record).startswith("reference GPTQ: not run: llm-compressor")


def test_the_reference_stays_off_by_default() -> None:
    config = load_llm_config(None, {})
    assert config.checks.reference_gptq is False
    assert reference_gptq.reference_before_quantization(config, None, WINDOW, None) is None


@pytest.mark.slow
@pytest.mark.skipif(
    reference_gptq.find_reference_python(None)[0] is None, reason="llm-compressor venv absent (the fake covers CI)"
)
def test_real_llm_compressor_quantizes_and_scores_our_windows(tiny_folder: Path) -> None:
    python = reference_gptq.find_reference_python(None)[0]
    config = _config(tiny_folder, python)
    loaded = load_llm(config, tiny_folder)
    raw = reference_gptq.run_reference_gptq(config, loaded, WINDOW)
    assert raw["ran"] is True, raw
    assert raw["versions"]["llmcompressor"].startswith("0.14")
    np.testing.assert_allclose(raw["original_window_nll"], _our_window_scores(loaded, WINDOW), rtol=1e-4)
    original = perplexity(loaded.model, loaded.tokenizer, loaded.evaluation_docs, WINDOW)
    record = reference_gptq.reference_record(raw, original, original, "rtn")
    assert abs(record["float_ppl_gap"]) < 1e-4 and record["reference"]["increase"] != 0


@pytest.mark.parametrize(("method", "symmetric"), [("auto", False), ("gptq", True), ("awq", False)])
def test_the_reference_quantizes_with_the_run_s_symmetry(method: str, symmetric: bool) -> None:
    """The default's AWQ-layout codes carry zero points, so its reference is asymmetric GPTQ (W4A16_ASYM): a
    symmetric reference would lose far more at 4 bits and flatter the run."""
    import types

    import transformers

    from deploy_opt.llm.config import LLMQuantConfig
    from deploy_opt.llm.run_common import plan_scheme

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4
    )
    model = transformers.LlamaForCausalLM(config)
    scheme = plan_scheme(LLMQuantConfig(method=method), model)
    settings = reference_gptq.reference_settings(types.SimpleNamespace(model=model, scheme=scheme), ("lm_head",))
    assert settings.symmetric is symmetric and settings.group_size == scheme.group_size == 64
    assert ("asymmetric" not in settings.describe()) is symmetric
