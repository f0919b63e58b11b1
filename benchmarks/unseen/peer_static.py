"""deploy_opt's shipped model against ONNX Runtime's own ``quantize_static`` on the same file, data and machine.

For a build of ``textdir.yaml`` (or any build whose data module yields ``(inputs, labels, ...)``), this quantizes
the *original* ONNX file with ORT's ``quantize_static`` (QDQ, per-channel int8 weights, uint8 activations,
MinMax, on the same calibration samples) and prints, from one run: top-1 on the evaluation data and the median
latency at batch 32 (2 threads, interleaved) for FP32, ORT's INT8 and deploy_opt's ``model.int8.onnx``.

    python benchmarks/unseen/peer_static.py benchmarks/unseen/.cache/reports/unseen-textdir \\
        --model benchmarks/unseen/.cache/ch_ppocr_mobile_v2.0_cls_infer.onnx --data benchmarks/unseen/textdir.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static


class _Reader(CalibrationDataReader):
    def __init__(self, batches: list) -> None:
        self.rows = iter([{k: v[i : i + 1] for k, v in b[0].items()} for b in batches for i in range(len(b[1]))])

    def get_next(self) -> dict | None:
        return next(self.rows, None)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _top1(session: ort.InferenceSession, batches: list) -> float:
    hits = total = 0
    for item in batches:
        for i in range(len(item[1])):
            out = session.run(None, {k: v[i : i + 1] for k, v in item[0].items()})[0]
            hits += int(np.argmax(out) == item[1][i])
            total += 1
    return 100.0 * hits / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="the original ONNX file")
    parser.add_argument("--data", type=Path, required=True, help="the data module (calibration_data, evaluation_data)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("peer_data", args.data)
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    calibration, evaluation = list(data.calibration_data()), list(data.evaluation_data())
    with tempfile.TemporaryDirectory() as tmp:
        theirs = Path(tmp) / "ort_static.onnx"
        quantize_static(
            str(args.model), str(theirs), _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        )  # fmt: skip
        models = {"FP32": args.model, "ORT quantize_static": theirs, "deploy_opt": args.build / "model.int8.onnx"}
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
        print("| model | top-1 | batch 32 ms | speedup |\n|---|---:|---:|---:|")
        for name, s in sessions.items():
            ms = statistics.median(times[name])
            print(f"| {name} | {_top1(s, evaluation):.2f} | {ms:.2f} | {fp32_ms / ms:.2f}x |")


if __name__ == "__main__":
    main()
