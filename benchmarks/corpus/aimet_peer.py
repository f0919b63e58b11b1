"""AIMET-ONNX's post-training quantization of one model, run in ``.cache/aimet-venv`` (run.py starts it there).

One attempt (``--method adaround|seqmse|plain``), in a process of its own: load the file (converted to opset 13
when older, as for the other peers; a graph input or output dimension stored as -1, as Paddle2ONNX writes a free
batch axis, renamed to a symbolic one, since AIMET's export makes a dummy input from the declared shapes),
``equalize_model`` (cross-layer equalization: BatchNormalization folded, ReLU6 made ReLU, cross-layer scaling,
high-bias fold), then ``QuantizationSimModel(model, param_type=int8, activation_type=int8)`` with AIMET's default
config (``default_config_per_channel.json``: per-channel symmetric weights for Conv, ConvTranspose, Gemm and
MatMul, asymmetric activations, bias unquantized; quant scheme min_max), then

- ``adaround``: ``apply_adaround(sim, batches, num_iterations=10000)`` (AIMET's recommendation for 8-bit weights),
- ``seqmse``: ``apply_seq_mse(sim, batches)`` (20 candidates per weight),
- ``plain``: neither,

then ``sim.compute_encodings(batches)`` and ``sim.to_onnx_qdq(prequantize_constants=True)``: int8 weights behind
DequantizeLinear, uint8 activations as QuantizeLinear/DequantizeLinear, a model ORT CPU runs. The batches are the
config's calibration batches, as deploy_opt gets them.

``--method auto`` (run.py's): plain first (the fallback, and how long one attempt takes), then AdaRound within
``--adaround-share`` of ``--budget-s``, then, if it did not finish, SeqMSE within what is left; it ships the
first of AdaRound, SeqMSE and plain that finished and says which (``peers.NOTE_TAG``).

    .cache/aimet-venv/bin/python benchmarks/corpus/aimet_peer.py MODEL DATA.npz OUT --budget-s 840
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import peers

METHODS = {"adaround": "AdaRound", "seqmse": "SeqMSE", "plain": "plain"}
THREADS = 2  # as the scoring and timing sessions (measure.THREADS)


def _free_dims(model: object) -> list[str]:
    """Rename the graph's input and output dimensions stored as -1 to symbolic ones; return their names."""
    renamed = []
    for value in [*model.graph.input, *model.graph.output]:  # type: ignore[attr-defined]
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                dim.dim_param = f"{value.name}_{axis}"
                renamed.append(dim.dim_param)
    return renamed


def attempt(model_path: Path, data: Path, out: Path, method: str, iterations: int) -> str:
    """One quantization of ``model_path`` into ``out`` (CLE, sim, ``method``, encodings, Q/DQ export)."""
    import onnx
    import torch
    from aimet_onnx import QuantizationSimModel, apply_adaround, apply_seq_mse, int8
    from aimet_onnx.cross_layer_equalization import equalize_model

    torch.set_num_threads(THREADS)
    batches = peers.read_batches(data)
    source, steps = peers._opset_13(model_path, out.with_name(out.stem + ".opset13.onnx"))
    model = onnx.load(str(source))
    renamed = _free_dims(model)
    if renamed:
        steps.append(f"-1 dimensions named ({', '.join(renamed)})")
    equalize_model(model)
    sim = QuantizationSimModel(
        model,
        param_type=int8,
        activation_type=int8,
        dummy_input=batches[0],
        session_options_kwargs={"intra_op_num_threads": THREADS, "inter_op_num_threads": 1},
    )
    if method == "adaround":
        apply_adaround(sim, batches, num_iterations=iterations)
    elif method == "seqmse":
        apply_seq_mse(sim, batches)
    sim.compute_encodings(batches)
    quantized = sim.to_onnx_qdq(prequantize_constants=True)
    tmp = out.with_name(out.stem + ".tmp.onnx")
    onnx.save(quantized, str(tmp))
    tmp.replace(out)
    out.with_name(out.stem + ".opset13.onnx").unlink(missing_ok=True)
    return "; ".join(steps)


def _child(args: argparse.Namespace, method: str, limit_s: float) -> tuple[Path | None, str, str]:
    """``attempt`` in its own process, killed past ``limit_s``: (its model or None, what happened, its note)."""
    target = args.out.with_name(f"{args.out.stem}.{method}.onnx")
    target.unlink(missing_ok=True)
    if limit_s < 1:
        return None, f"{METHODS[method]} not tried (no time left)", ""
    command = [sys.executable, __file__, str(args.model), str(args.data), str(target), "--method", method]
    command += [f"--iterations={args.iterations}"]
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired as exc:
        for stream, text in ((sys.stdout, exc.stdout), (sys.stderr, exc.stderr)):
            stream.write(text.decode(errors="replace") if isinstance(text, bytes) else text or "")
        return None, f"{METHODS[method]} did not finish in {limit_s:.0f} s", ""
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    took = time.monotonic() - start
    notes = [ln.split(peers.NOTE_TAG, 1)[1].strip() for ln in done.stdout.splitlines() if peers.NOTE_TAG in ln]
    if done.returncode != 0 or not target.is_file():
        errors = [ln.strip() for ln in done.stderr.splitlines() if "Error" in ln] or done.stderr.splitlines() or [""]
        return None, f"{METHODS[method]} failed (exit {done.returncode}: {errors[-1][:120]})", ""
    return target, f"{METHODS[method]} {took:.0f} s", notes[-1] if notes else ""


def auto(args: argparse.Namespace) -> str:
    """Plain, then AdaRound, then SeqMSE within the budget; ship the best that finished; say what happened."""
    deadline = time.monotonic() + args.budget_s
    plain, plain_said, note = _child(args, "plain", args.budget_s)
    if plain is None:
        raise SystemExit(f"aimet: {plain_said}")
    tried = []
    chosen = None
    for method in ("adaround", "seqmse"):
        left = deadline - time.monotonic()
        path, said, _ = _child(args, method, left * args.adaround_share if method == "adaround" else left)
        tried.append(said)
        if path is not None:
            chosen = (method, path)
            break
    method, path = chosen or ("plain", plain)
    path.replace(args.out)
    for method_name in METHODS:  # what the attempts left, a killed one's scratch files included
        for suffix in ("", ".opset13", ".tmp"):
            args.out.with_name(f"{args.out.stem}.{method_name}{suffix}.onnx").unlink(missing_ok=True)
    iterations = f" ({args.iterations} iterations)" if method == "adaround" else ""
    done = "; ".join([plain_said, *tried])
    return "; ".join(x for x in [note, f"CLE + {METHODS[method]}{iterations} shipped ({done})"] if x)


def main() -> None:
    """CLI: ``MODEL DATA OUT [--method M] [--budget-s S]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path, help="the calibration batches (peers.write_batches)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--method", choices=["auto", *METHODS], default="auto")
    parser.add_argument("--budget-s", type=float, default=840.0, help="auto: seconds for every attempt together")
    parser.add_argument("--adaround-share", type=float, default=0.5, help="auto: AdaRound's share of what is left")
    parser.add_argument("--iterations", type=int, default=10000, help="AdaRound's optimisation steps per layer")
    args = parser.parse_args()
    args.model, args.data, args.out = args.model.resolve(), args.data.resolve(), args.out.resolve()
    if args.method == "auto":
        how = auto(args)
    else:
        how = attempt(args.model, args.data, args.out, args.method, args.iterations)
    print(f"{peers.NOTE_TAG} {how}")


if __name__ == "__main__":
    main()
