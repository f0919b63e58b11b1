"""deploy_opt's shipped model against ONNX Runtime's own ``quantize_static`` on the same file, data and machine.

For a build of ``textdir.yaml`` or ``textrec.yaml`` (or any build whose data module yields ``(inputs, labels,
...)``), this quantizes the *original* ONNX file with ORT's ``quantize_static`` twice, on the same calibration
samples: with its defaults (QDQ, per-tensor int8 weights, uint8 activations, MinMax), and per-channel. It prints,
from one run, the metric on the evaluation data and the median latency at batch 32 (2 threads, the models
interleaved) for FP32, both of ORT's INT8 models and deploy_opt's ``model.int8.onnx``.

    python benchmarks/unseen/peer_static.py benchmarks/unseen/.cache/reports/unseen-textdir \\
        --model benchmarks/unseen/.cache/ch_ppocr_mobile_v2.0_cls_infer.onnx --data benchmarks/unseen/textdir.py
    python benchmarks/unseen/peer_static.py benchmarks/unseen/.cache/reports/unseen-textrec \\
        --model benchmarks/unseen/.cache/ch_PP-OCRv4_rec_infer.onnx --data benchmarks/unseen/textrec.py \\
        --metric char_accuracy
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.stages.benchmark import tiled
from dopt_common.ort import create_session
from dopt_common.siblings import sibling
from dopt_common.timer import fixed, median_ms, runner, time_rounds

CORPUS_PEERS = Path(__file__).resolve().parents[1] / "corpus" / "peers.py"


def top1(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """100 for each sample whose argmax is its label, else 0."""
    return 100.0 * (prediction.argmax(axis=1) == reference)


def _score(session: Any, batches: list, metric: Callable, fp32: Any) -> float:
    """The metric's mean over the evaluation data, run one sample at a time (a fixed-batch model takes only 1).

    Data without labels is scored against the FP32 model's output, as a build does.
    """
    scores = []
    for item in batches:
        for i in range(len(next(iter(item[0].values())))):
            feed = {k: v[i : i + 1] for k, v in item[0].items()}
            reference = fp32.run(None, feed)[0] if item[1] is None else item[1][i : i + 1]
            scores.append(metric(session.run(None, feed)[0], reference))
    return float(np.concatenate(scores).mean())


def _quantize(model: Path, out: Path, calibration: list, per_channel: bool) -> Path:
    """ORT's ``quantize_static`` (the corpus's call) calibrated one sample at a time, with its default MinMax."""
    rows = []
    for inputs, *_ in calibration:
        rows += [{k: v[i : i + 1] for k, v in inputs.items()} for i in range(len(next(iter(inputs.values()))))]
    sibling(CORPUS_PEERS, "peers").qdq_static(model, out, rows, per_channel)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="the original ONNX file")
    parser.add_argument("--data", type=Path, required=True, help="the data module (calibration_data, evaluation_data)")
    parser.add_argument("--metric", default="top1", help="a (prediction, reference) -> scores function of --data")
    args = parser.parse_args()
    data = sibling(args.data, args.data.stem)  # the data module named by path, as build configs name it
    metric = top1 if args.metric == "top1" else getattr(data, args.metric)
    calibration, evaluation = list(data.calibration_data()), list(data.evaluation_data())
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "FP32": args.model,
            "ORT quantize_static (defaults)": _quantize(args.model, Path(tmp) / "t.onnx", calibration, False),
            "ORT quantize_static (per-channel)": _quantize(args.model, Path(tmp) / "c.onnx", calibration, True),
            "deploy_opt": args.build / "model.int8.onnx",
        }
        sessions = {name: create_session(path, threads=2) for name, path in models.items()}
        feed = tiled(evaluation[0][0], 32)  # the build's tiling of real samples to batch 32
        runs = {name: runner(s.run, None, feed) for name, s in sessions.items()}
        times = time_rounds(runs, fixed(30))  # 30 interleaved rounds, no warm-up
        fp32_ms = median_ms(times["FP32"])
        print(f"| model | {args.metric} | batch 32 ms | speedup |\n|---|---:|---:|---:|")
        for name, s in sessions.items():
            ms = median_ms(times[name])
            score = _score(s, evaluation, metric, sessions["FP32"])
            print(f"| {name} | {score:.2f} | {ms:.2f} | {fp32_ms / ms:.2f}x |")


if __name__ == "__main__":
    main()
