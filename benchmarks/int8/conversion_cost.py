"""What a float island costs on ONNX Runtime's CPU: one element's Q or DQ against what INT8 saves per MAC.

Not a test: run by hand. ``deploy_opt.autotune.islands.CONVERSION_MACS`` is the ratio this prints: the number of
multiply-accumulates whose INT8 saving pays for converting one element between float and int8. Three models on
a [batch, C, H, W] activation, each timed in one ORT CPU session (``dopt_common.ort.create_session``, all graph
optimisations, ``--threads`` threads), the median of ``--runs`` runs after 20 warm-up runs:

- ``qdq``: QuantizeLinear → DequantizeLinear, so one element costs half the pair;
- ``float``: ``--depth`` 3×3 C→C convolutions with ReLU;
- ``int8``: the same chain as a Q/DQ model (``onnxruntime.quantization.quantize_static``, QDQ, per-channel
  symmetric weights, uint8 activations), which ORT fuses into one QLinearConv chain with a Q in and a DQ out.

The saving per MAC is (float − int8 + one Q and one DQ of the chain's ends) / (depth × MACs per conv).

    python benchmarks/int8/conversion_cost.py                     # batch 1, 32 channels at 56×56, 1 thread
    python benchmarks/int8/conversion_cost.py --channels 64 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def _chain(channels: int, depth: int, size: int, batch: int) -> object:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(depth):
        weight = rng.normal(0, (2 / (9 * channels)) ** 0.5, (channels, channels, 3, 3)).astype(np.float32)
        bias = np.zeros(channels, np.float32)
        inits += [numpy_helper.from_array(weight, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        nodes += [
            helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        current = f"r{i}"
    shape = [batch, channels, size, size]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _qdq_pair(shape: list[int]) -> object:
    from onnx import TensorProto, helper, numpy_helper

    scale = numpy_helper.from_array(np.array(0.02, np.float32), "s")
    zero = numpy_helper.from_array(np.array(128, np.uint8), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [scale, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _int8(model: object, feed: np.ndarray, folder: Path) -> Path:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [{"x": feed}]

        def get_next(self) -> dict | None:
            return self.left.pop() if self.left else None

    source, out = folder / "float.onnx", folder / "int8.onnx"
    onnx.save(model, source)
    quantize_static(
        str(source), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return out


def _median_ms(model: object, feed: np.ndarray, threads: int, runs: int) -> float:
    from dopt_common.ort import create_session
    from dopt_common.timer import fixed, median_ms, runner, time_rounds, warm_up

    payload = model if isinstance(model, Path) else model.SerializeToString()
    session = create_session(payload, threads=threads)
    run = {"x": runner(session.run, None, {"x": feed})}
    warm_up(run, 20)
    return median_ms(time_rounds(run, fixed(runs))["x"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    shape = [args.batch, args.channels, args.size, args.size]
    feed = np.random.default_rng(1).normal(0, 1, shape).astype(np.float32)
    chain = _chain(args.channels, args.depth, args.size, args.batch)
    with tempfile.TemporaryDirectory() as folder:
        int8 = _int8(chain, feed, Path(folder))
        qdq_ms = _median_ms(_qdq_pair(shape), feed, args.threads, args.runs)
        float_ms = _median_ms(chain, feed, args.threads, args.runs)
        int8_ms = _median_ms(int8, feed, args.threads, args.runs)
    elements = int(np.prod(shape))
    macs = args.depth * elements * args.channels * 9
    per_element_ns = qdq_ms * 1e6 / (2 * elements)
    saved_per_mac_ns = (float_ms - int8_ms + qdq_ms) * 1e6 / macs
    print(f"shape {shape}, {args.depth} convs, {args.threads} thread(s), median of {args.runs}")
    print(f"Q→DQ {qdq_ms:.3f} ms; float chain {float_ms:.3f} ms; int8 chain {int8_ms:.3f} ms")
    print(f"one conversion {per_element_ns:.3f} ns/element; INT8 saves {saved_per_mac_ns * 1e3:.3f} ps/MAC")
    print(f"CONVERSION_MACS = {per_element_ns / saved_per_mac_ns:.0f}")


if __name__ == "__main__":
    main()
