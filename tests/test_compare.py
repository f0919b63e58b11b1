"""compare.json: every CPU backend on fixed seeded samples, metrics against numpy, and the first diverging layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_onnx
from onnx import numpy_helper

from calibrators.activations.collect import select_tensors
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile
from deploy_opt.analysis.compare import SAMPLES_FILE, compare_backends, fixed_samples, output_metrics
from deploy_opt.analysis.comparison import ComparedModels, Comparison
from deploy_opt.config.build import CompareConfig, resolve_config
from deploy_opt.data.sources import Batch
from dopt_common.errors import ConfigError
from dopt_common.files import sha256_file
from exporters.ort.qdq import write_ort_qdq


def _activations(x: np.ndarray) -> dict[str, np.ndarray]:
    """The tiny model's tensors, computed in numpy."""
    w = tiny_onnx.weights()
    h0 = x @ w["w1"]
    h1 = h0 + w["b1"]
    h2 = np.maximum(h1, 0)
    h3 = h2 @ w["w2"]
    return {"x": x, "h0": h0, "h1": h1, "h2": h2, "h3": h3, "logits": h3 + w["b2"]}


def _batches(items: list) -> list[Batch]:
    return [Batch(inputs, label) for inputs, label in items]


@pytest.fixture
def qdq_model(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny model quantized with min/max ranges of its calibration data (a healthy INT8 model)."""
    model = onnx.load(str(tiny_model))
    x = np.concatenate([b.inputs["x"] for b in _batches(tiny_onnx.calibration())])
    acts = _activations(x)
    tensors = {
        n: activation_scale(n, float(acts[n].min()), float(acts[n].max()), "asymmetric", "minmax")
        for n in select_tensors(model, ["MatMul"])
    }
    tensors |= weight_scales(model, ["MatMul"])
    tensors |= bias_scales(model, tensors, ["MatMul"])
    return write_ort_qdq(
        tiny_model, ScaleFile("asymmetric", tensors, {}), tmp_path / "tiny.int8.onnx", op_types=["MatMul"]
    )


def _torch_tiny() -> object:
    import torch

    w = tiny_onnx.weights()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        model[0].weight.copy_(torch.from_numpy(w["w1"].T))
        model[0].bias.copy_(torch.from_numpy(w["b1"]))
        model[2].weight.copy_(torch.from_numpy(w["w2"].T))
        model[2].bias.copy_(torch.from_numpy(w["b2"]))
    return model.eval()


def _samples() -> dict[str, np.ndarray]:
    return fixed_samples(_batches(tiny_onnx.evaluation()), 32, 0)


def test_every_cpu_backend_is_compared_and_written(tiny_model: Path, qdq_model: Path, tmp_path: Path) -> None:
    import onnxruntime

    samples = _samples()
    extra = {"numpy_fp32": lambda feed: [tiny_onnx.reference(feed["x"])]}
    out = tmp_path / "report"
    models = ComparedModels(tiny_model, qdq_model, _torch_tiny(), extra, judge_top1=True)
    record = compare_backends(models, samples, out, config=CompareConfig(), seed=0)
    written = json.loads((out / "compare.json").read_text())
    assert written == json.loads(json.dumps(record.to_json()))
    assert Comparison.from_json(written) == record  # the typed record reads back as written
    assert written["format"] == "deploy_opt.analysis.compare/1" and written["seed"] == 0
    assert written["reference"] == "torch_fp32"
    backends = written["backends"]
    assert set(backends) == {
        "torch_fp32",
        "ort_fp32_cpu",
        "ort_int8_cpu",
        "ort_int8_cuda",
        "ort_int8_tensorrt_ep",
        "numpy_fp32",
        "tensorrt_int8",
    }
    for name in ("ort_fp32_cpu", "ort_int8_cpu", "numpy_fp32"):
        assert backends[name]["status"] == "ran" and backends[name]["pass"] is True, backends[name]
        assert set(backends[name]["outputs"]["logits"]) >= {
            "max_abs",
            "mean_abs",
            "cosine",
            "sqnr_db",
            "top1_agreement",
        }
    assert backends["tensorrt_int8"]["status"].startswith("not available")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert backends["ort_int8_cuda"]["status"].startswith("not available")
    if "TensorrtExecutionProvider" not in onnxruntime.get_available_providers():
        assert backends["ort_int8_tensorrt_ep"]["status"].startswith("not available: TensorrtExecutionProvider")
    fp32_sqnr = backends["ort_fp32_cpu"]["outputs"]["logits"]["sqnr_db"]
    assert fp32_sqnr is None or fp32_sqnr > 100  # None: no error at all (onnxruntime 1.32 matches numpy exactly)
    # INT8 metrics against an independent computation: ORT's INT8 output vs the numpy FP32 network.
    int8 = onnxruntime.InferenceSession(str(qdq_model), providers=["CPUExecutionProvider"]).run(None, samples)[0]
    reference = tiny_onnx.reference(samples["x"]).astype(np.float64)
    metrics = backends["ort_int8_cpu"]["outputs"]["logits"]
    assert metrics["max_abs"] == pytest.approx(np.abs(int8 - reference).max(), rel=1e-3)
    assert metrics["top1_agreement"] == np.mean(int8.argmax(1) == reference.argmax(1))
    noise = ((int8 - reference) ** 2).sum()
    assert metrics["sqnr_db"] == pytest.approx(10 * np.log10((reference**2).sum() / noise), abs=0.05)
    assert 20 < metrics["sqnr_db"] < 80 and metrics["cosine"] > 0.99
    # The per-layer table, in graph order, with no divergence on a healthy model.
    names = [row["name"] for row in written["layers"]]
    assert names.index("x") < names.index("w1") < names.index("h0") < names.index("h2") < names.index("logits")
    assert written["first_divergence"] is None and written["verdict"] == "pass"
    assert written["tolerances"]["min_quant_sqnr_db"] == CompareConfig().min_quant_sqnr_db
    # The samples file is what was compared, and its hash is recorded.
    assert written["samples"]["file"] == SAMPLES_FILE
    assert written["samples"]["sha256"] == sha256_file(out / SAMPLES_FILE)
    with np.load(out / SAMPLES_FILE) as saved:
        np.testing.assert_array_equal(saved["x"], samples["x"])


def test_a_broken_backend_fails_the_verdict(tiny_model: Path, qdq_model: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    extra = {
        "noise_int8": lambda feed: [rng.normal(0, 1, (len(feed["x"]), 4)).astype(np.float32)],
        "crash_int8": lambda feed: 1 / 0,
    }
    models = ComparedModels(tiny_model, qdq_model, extra_runners=extra)
    record = compare_backends(models, _samples(), tmp_path, config=CompareConfig())
    assert record.reference == "ort_fp32_cpu"
    assert record.backends["noise_int8"].passed is False
    assert record.backends["crash_int8"].status.startswith("failed: ZeroDivisionError")
    assert record.verdict == "fail" and len(record.failures) == 2


def test_same_seed_gives_the_same_samples() -> None:
    batches = _batches(tiny_onnx.evaluation())
    first, again, other = fixed_samples(batches, 20, 3), fixed_samples(batches, 20, 3), fixed_samples(batches, 20, 4)
    np.testing.assert_array_equal(first["x"], again["x"])
    assert first["x"].shape == (20, tiny_onnx.FEATURES)
    assert not np.array_equal(first["x"], other["x"])
    stream = np.concatenate([b.inputs["x"] for b in batches])
    positions = [int(np.flatnonzero((stream == row).all(axis=1))[0]) for row in first["x"]]
    assert positions == sorted(positions) and len(set(positions)) == 20  # distinct rows, in stream order
    assert fixed_samples(batches, 10_000, 0)["x"].shape[0] == len(stream)


def test_rows_of_differently_shaped_batches_are_zero_padded() -> None:
    batches = [Batch({"ids": np.ones((2, 3), np.int64)}, None), Batch({"ids": np.full((2, 5), 2, np.int64)}, None)]
    ids = fixed_samples(batches, 4, 0)["ids"]
    assert ids.shape == (4, 5) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids[0], [1, 1, 1, 0, 0])


@pytest.mark.parametrize(
    "tensor,factor,node",
    # ÷50 clips the tensor; ×100 makes its step ~40 dB coarser (×50 leaves h2, healthy at ~45 dB, at ~13 dB:
    # harmful, but above the default threshold that keeps MiniLM's healthy 18.7 dB minimum clear).
    [
        ("h2", 1 / 50, "fc2"),
        ("h2", 100.0, "fc2"),
        ("h0", 1 / 50, "fc1_bias"),
        ("x", 100.0, "fc1"),
        ("w2", 1 / 50, "fc2"),
    ],
)
def test_one_wrong_scale_is_the_first_divergence(
    tiny_model: Path, qdq_model: Path, tmp_path: Path, tensor: str, factor: float, node: str
) -> None:
    model = onnx.load(str(qdq_model))
    if tensor.startswith("w"):
        reader = next(
            n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == f"{tensor}_quantized"
        )
    else:
        reader = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    scale = next(i for i in model.graph.initializer if i.name == reader.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(factor), scale.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    record = compare_backends(ComparedModels(tiny_model, broken), _samples(), tmp_path, config=CompareConfig())
    first = record.first_divergence
    assert first is not None and (first["tensor"], first["node"]) == (tensor, node)
    assert first["sqnr_db"] < first["threshold"] == CompareConfig().min_quant_sqnr_db
    assert record.verdict == "fail"


def test_healthy_layers_keep_a_margin(tiny_model: Path, qdq_model: Path, tmp_path: Path) -> None:
    record = compare_backends(ComparedModels(tiny_model, qdq_model), _samples(), tmp_path, config=CompareConfig())
    quant = [row["quant_sqnr_db"] for row in record.layers if row["quant_sqnr_db"] is not None]
    assert len(quant) >= 5  # x, h0, h2, h3 and the weights
    assert min(quant) > CompareConfig().min_quant_sqnr_db + 8


MINIMAL = {
    "name": "t",
    "model": {"onnx": "m.onnx"},
    "data": {"calibration": "a:b", "evaluation": "a:c"},
}


def test_compare_config_section() -> None:
    config = resolve_config({**MINIMAL, "compare": {"samples": 8, "int8_min_cosine": 0.9}}, {}, [], ".")
    assert config.compare.samples == 8 and config.compare.int8_min_cosine == 0.9
    assert config.compare.seed is None and config.compare.enabled
    with pytest.raises(ConfigError, match="unknown key 'compare.unknown_key'"):
        resolve_config({**MINIMAL, "compare": {"unknown_key": 1}}, {}, [], ".")
    with pytest.raises(ConfigError, match=r"compare.fp32_min_cosine must be in \[0, 1\], got 1.5"):
        resolve_config(MINIMAL, {}, ["compare.fp32_min_cosine=1.5"], ".")
    with pytest.raises(ConfigError, match="compare.min_quant_sqnr_db"):
        resolve_config({**MINIMAL, "compare": {"min_quant_sqnr_db": -3}}, {}, [], ".")
    with pytest.raises(ConfigError, match="compare.samples"):
        resolve_config({**MINIMAL, "compare": {"samples": 0}}, {}, [], ".")


def test_output_metrics_on_known_values() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 2.0]])
    test = np.array([[1.0, 0.5], [0.0, 2.0]])
    m = output_metrics(reference, test)
    assert m["max_abs"] == 0.5 and m["mean_abs"] == 0.125
    assert m["sqnr_db"] == pytest.approx(10 * np.log10(5 / 0.25))
    assert m["cosine_min"] == pytest.approx(1 / np.sqrt(1.25)) and m["top1_agreement"] == 1.0
    assert "error" in output_metrics(reference, np.full((2, 2), np.nan))


@pytest.mark.gpu
def test_ort_cuda_runs_the_int8_model_as_the_cpu_does(qdq_model: Path) -> None:
    import onnxruntime

    shape = [d.dim_value or 4 for d in onnx.load(str(qdq_model)).graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    name = onnx.load(str(qdq_model)).graph.input[0].name
    cpu = onnxruntime.InferenceSession(str(qdq_model), providers=["CPUExecutionProvider"])
    cuda = onnxruntime.InferenceSession(str(qdq_model), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert cuda.get_providers()[0] == "CUDAExecutionProvider"  # not a silent fall-back to the CPU
    ours, theirs = cpu.run(None, {name: x})[0], cuda.run(None, {name: x})[0]
    # Both dequantize the same int8 graph; kernels may round one step apart, never further.
    assert np.abs(ours - theirs).max() <= 0.05 * np.abs(ours).max()
    assert (ours.argmax(1) == theirs.argmax(1)).mean() >= 0.75
