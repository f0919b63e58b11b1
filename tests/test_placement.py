"""Q/DQ placement: the ``inputs`` rule, and fallback variants that equal the real exclusion in both placements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_attention_onnx

from calibrators.activations.collect import collect, select_tensors
from calibrators.activations.minmax import MinMaxObserver
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile
from deploy_opt.analysis.sensitivity.variants import exclusion_variant
from dopt_common.ort import create_session
from exporters.ort.graph import quantized_nodes
from exporters.ort.qdq import write_ort_qdq

OPS = ("MatMul",)


def _scales(fp32: Path) -> ScaleFile:
    model = onnx.load(str(fp32))
    names = select_tensors(model, OPS)
    observer = MinMaxObserver(set())
    collect(fp32, (b for b, _ in tiny_attention_onnx.calibration()), names, observer)
    tensors = {n: activation_scale(n, lo, hi, "asymmetric", "minmax") for n, (lo, hi) in observer.ranges().items()}
    tensors |= weight_scales(model, OPS, (), "absmax", 127)
    tensors |= bias_scales(model, tensors, OPS, ())
    return ScaleFile("asymmetric", tensors)


def _write(fp32: Path, scales: ScaleFile, out: Path, placement: str, exclude: tuple[str, ...] = ()) -> Path:
    return write_ort_qdq(
        fp32, scales, out, op_types=OPS, exclude_nodes=exclude, quantize_outputs=placement == "outputs"
    )


def _outputs(model: onnx.ModelProto | Path) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    session = create_session(data, threads=1, optimize=False)
    feeds = tiny_attention_onnx.evaluation()[0][0]
    return session.run(None, feeds)[0]


def _readers_of_dq(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Node name → the names of its inputs that come out of a DequantizeLinear."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name: [i for i in n.input if i in dq] for n in model.graph.node}


@pytest.fixture(scope="module")
def fp32_and_scales(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScaleFile]:
    fp32 = tiny_attention_onnx.make_model(tmp_path_factory.mktemp("placement") / "fp32.onnx")
    return fp32, _scales(fp32)


def test_inputs_placement_quantizes_only_the_edges_into_quantized_nodes(fp32_and_scales, tmp_path: Path) -> None:
    fp32, scales = fp32_and_scales
    inputs = onnx.load(str(_write(fp32, scales, tmp_path / "in.onnx", "inputs")))
    outputs = onnx.load(str(_write(fp32, scales, tmp_path / "out.onnx", "outputs")))
    # ln2's output n2 feeds ffn_up (quantized) and ... h feeds ln2 and residual2; o_proj's output attn feeds the
    # residual Add. ORT's placement hands the residual Adds dequantized values; the inputs rule keeps them float.
    assert _readers_of_dq(outputs)["residual1"], "ORT's default placement quantizes o_proj's output for the Add"
    assert not _readers_of_dq(inputs)["residual1"] and not _readers_of_dq(inputs)["residual2"]
    assert _readers_of_dq(inputs)["ffn_up"] and _readers_of_dq(inputs)["q_proj"]
    names = {n.name for n in quantized_nodes(inputs)}
    assert names == {"q_proj", "k_proj", "v_proj", "scores", "context", "o_proj", "ffn_up", "ffn_down"}


@pytest.mark.parametrize("placement", ["inputs", "outputs"])
@pytest.mark.parametrize(
    "excluded", [("q_proj",), ("v_proj", "ffn_up"), ("scores", "context", "o_proj"), ("k_proj", "ffn_down")]
)
def test_a_fallback_variant_equals_the_real_exclusion(fp32_and_scales, tmp_path, placement, excluded) -> None:
    fp32, scales = fp32_and_scales
    full = onnx.load(str(_write(fp32, scales, tmp_path / "full.onnx", placement)))
    real = _write(fp32, scales, tmp_path / "real.onnx", placement, excluded)
    variant = exclusion_variant(full, onnx.load(str(fp32)), OPS, excluded, placement)
    quantized = {n.name for n in quantized_nodes(variant) if n.op_type in OPS}
    assert quantized == {n.name for n in quantized_nodes(onnx.load(str(real))) if n.op_type in OPS}
    if placement == "inputs":  # with ORT's placement an excluded node still reads a shared tensor's DQ
        assert not quantized & set(excluded)
    np.testing.assert_array_equal(_outputs(variant), _outputs(real))
    assert not np.array_equal(_outputs(variant), _outputs(full)), "the exclusion must change something"


def test_excluding_every_node_gives_the_float_model(fp32_and_scales, tmp_path: Path) -> None:
    fp32, scales = fp32_and_scales
    for placement in ("inputs", "outputs"):
        full = onnx.load(str(_write(fp32, scales, tmp_path / f"{placement}.onnx", placement)))
        every = [n.name for n in quantized_nodes(full) if n.op_type in OPS]
        variant = exclusion_variant(full, onnx.load(str(fp32)), OPS, every, placement)
        assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in variant.graph.node)
        np.testing.assert_allclose(_outputs(variant), _outputs(fp32), rtol=1e-5, atol=1e-6)


CHAIN = ("Conv", "MatMul", "Add", "Relu", "GlobalAveragePool", "Flatten")


def _chain_model_and_scales(tmp_path: Path) -> tuple[Path, ScaleFile]:
    """The foreign CNN (Conv → Relu → Conv → Relu → pool → Flatten → MatMul → Add), normalised, with chain scales."""
    import foreign_onnx

    from calibrators.qparams import share_passthrough_scales, widen_weights_for_bias
    from exporters.onnx.normalize import constants_to_initializers, fold_weight_chains, modernise_ir

    model = onnx.version_converter.convert_version(onnx.load(str(foreign_onnx.make_model(tmp_path / "f.onnx"))), 13)
    modernise_ir(model), constants_to_initializers(model), fold_weight_chains(model)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(model, str(fp32))
    observer = MinMaxObserver(set())
    collect(fp32, (b for b, _ in foreign_onnx.calibration()), select_tensors(model, CHAIN), observer)
    tensors = {n: activation_scale(n, lo, hi, "asymmetric", "minmax") for n, (lo, hi) in observer.ranges().items()}
    tensors |= share_passthrough_scales(model, tensors, CHAIN)
    tensors |= weight_scales(model, CHAIN, (), "absmax", 127)
    tensors |= widen_weights_for_bias(model, tensors, CHAIN)
    tensors |= bias_scales(model, tensors, CHAIN, ())
    return fp32, ScaleFile("asymmetric", tensors)


@pytest.mark.parametrize("excluded", [("conv1",), ("conv2",), ("fc",), ("conv2", "fc")])
def test_a_chain_variant_equals_the_real_exclusion(tmp_path: Path, excluded: tuple[str, ...]) -> None:
    """With Relu quantized too (chain coverage), excluding its producer leaves the Relu float, as the writer does.

    Excluding a Relu that the writer removed (its clip done by the producer's Q/DQ) cannot be derived from the
    Q/DQ model: the auto search writes those variants (``context.variant_model``).
    """
    import foreign_onnx

    fp32, scales = _chain_model_and_scales(tmp_path)
    write = lambda out, exclude=(): write_ort_qdq(  # noqa: E731
        fp32, scales, tmp_path / out, op_types=CHAIN, exclude_nodes=exclude, quantize_outputs=True
    )
    full = onnx.load(str(write("full.onnx")))
    real = write("real.onnx", excluded)
    variant = exclusion_variant(full, onnx.load(str(fp32)), CHAIN, excluded, "outputs")
    feeds = foreign_onnx.evaluation()[0][0]
    run = lambda m: create_session(  # noqa: E731
        m.SerializeToString() if isinstance(m, onnx.ModelProto) else m, threads=1, optimize=False
    ).run(None, feeds)[0]
    np.testing.assert_allclose(run(variant), run(real), rtol=1e-6, atol=1e-6)
    assert np.abs(run(real) - run(fp32)).max() < 0.1 * np.abs(run(fp32)).max()
