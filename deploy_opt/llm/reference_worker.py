"""The reference GPTQ, run by ``reference_gptq.py`` in a Python that has llm-compressor (often its own venv).

Standalone on purpose: it imports neither deploy_opt nor anything the venv lacks, so it runs under the peer's own
torch and transformers. ``python reference_worker.py FOLDER`` reads ``FOLDER/request.json``:

- ``model``: a Hugging Face folder of the float model;
- ``calibration``: the calibration windows (token ids), fed one a batch, in order, as deploy_opt fed them;
- ``evaluation``: the evaluation windows, each ``{"ids": [...], "fresh": n}``: its last n tokens are scored,
  exactly as deploy_opt's ``checks.window_nll`` scores them;
- ``settings``: bits, group_size, symmetric, actorder, dampening_frac, block_size, and ``targets``: the full
  names of the Linears to quantize (deploy_opt's own targets, so both quantize the same set).

It scores the float model, runs llm-compressor's ``oneshot`` with one ``GPTQModifier`` (W4A16 integer weights in
groups), scores the quantized model (llm-compressor leaves fake-quantized weights in place until a save compresses
them) and writes ``FOLDER/result.json``: per window ``[summed NLL, scored tokens]`` of both, versions, seconds.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("reference_worker")


def score_windows(model: Any, windows: list[dict[str, Any]]) -> list[list[float]]:
    """``[summed NLL, scored tokens]`` of each window's last ``fresh`` tokens, log-probabilities in float32."""
    import torch

    out = []
    with torch.no_grad():
        for window in windows:
            chunk = torch.tensor([window["ids"]], dtype=torch.long)
            logits = model(input_ids=chunk, use_cache=False).logits
            nll = -torch.log_softmax(logits[0, :-1].float(), dim=-1).gather(1, chunk[0, 1:, None])[:, 0]
            scored = nll[-int(window["fresh"]) :]
            out.append([float(scored.double().sum()), int(scored.numel())])
    return out


def gptq_modifier(settings: dict[str, Any]) -> Any:
    """llm-compressor's GPTQModifier for integer weights in groups, activations untouched (W4A16)."""
    from llmcompressor.modifiers.quantization import GPTQModifier

    weights = {
        "num_bits": settings["bits"],
        "type": "int",
        "symmetric": settings["symmetric"],
        "strategy": "group",
        "group_size": settings["group_size"],
    }
    return GPTQModifier(
        config_groups={"group_0": {"targets": list(settings["targets"]), "weights": weights}},
        actorder=settings["actorder"],
        dampening_frac=settings["dampening_frac"],
        block_size=settings["block_size"],
    )


def versions() -> dict[str, str]:
    """The versions that ran the reference."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("llmcompressor", "compressed-tensors", "transformers", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def run(folder: Path) -> dict[str, Any]:
    """Score, quantize with llm-compressor, score again; the result record."""
    import torch
    from llmcompressor import oneshot
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    request = json.loads((folder / "request.json").read_text(encoding="utf-8"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32)
    model.eval()
    start = time.perf_counter()
    original = score_windows(model, request["evaluation"])
    scored_s = time.perf_counter() - start
    samples = [{"input_ids": torch.tensor([ids], dtype=torch.long)} for ids in request["calibration"]]
    loader = DataLoader(samples, batch_size=None, shuffle=False)  # each sample already one batch of its own length
    start = time.perf_counter()
    recipe = gptq_modifier(request["settings"])
    # the processor is only asked for when oneshot tokenizes text itself; a DataLoader of ids is passed as is
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    oneshot(model=model, processor=tokenizer, dataset=loader, recipe=recipe, pipeline="sequential")
    quantize_s = time.perf_counter() - start
    quantized = score_windows(model, request["evaluation"])
    return {
        "tool": "llm-compressor",
        "versions": versions(),
        "original_window_nll": original,
        "quantized_window_nll": quantized,
        "quantize_s": quantize_s,
        "score_s": scored_s,
        "threads": torch.get_num_threads(),
    }


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s reference: %(message)s")
    folder = Path(sys.argv[1])
    result = run(folder)
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(result, allow_nan=False), encoding="utf-8")
    os.replace(tmp, folder / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
