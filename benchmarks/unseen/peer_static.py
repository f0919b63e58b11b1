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
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from dopt_common.siblings import sibling


class _Reader(CalibrationDataReader):
    def __init__(self, batches: list) -> None:
        rows = []
        for inputs, *_ in batches:
            rows += [{k: v[i : i + 1] for k, v in inputs.items()} for i in range(len(next(iter(inputs.values()))))]
        self.rows = iter(rows)

    def get_next(self) -> dict | None:
        return next(self.rows, None)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def top1(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """100 for each sample whose argmax is its label, else 0."""
    return 100.0 * (prediction.argmax(axis=1) == reference)


def _score(session: ort.InferenceSession, batches: list, metric: Callable, fp32: ort.InferenceSession) -> float:
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
    quantize_static(
        str(model),
        str(out),
        _Reader(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
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
        sessions = {name: _session(path) for name, path in models.items()}
        first = evaluation[0][0]
        feed = {k: np.concatenate([v] * (-(-32 // len(v))))[:32] for k, v in first.items()}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(30):
            for name, s in sessions.items():
                begin = time.perf_counter()
                s.run(None, feed)
                times[name].append((time.perf_counter() - begin) * 1e3)
        fp32_ms = statistics.median(times["FP32"])
        print(f"| model | {args.metric} | batch 32 ms | speedup |\n|---|---:|---:|---:|")
        for name, s in sessions.items():
            ms = statistics.median(times[name])
            score = _score(s, evaluation, metric, sessions["FP32"])
            print(f"| {name} | {score:.2f} | {ms:.2f} | {fp32_ms / ms:.2f}x |")


if __name__ == "__main__":
    main()
