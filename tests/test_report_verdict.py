"""report.html tells the truth (issue 31): a passing build shows no FAIL, a real divergence shows in words (never a
raw dict), the per-layer precision is read from the shipped model, and a target the build does not deploy to is
information, not a fault."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import onnx
import pytest
import tiny_onnx
from conftest import build_tiny
from onnx import helper

from calibrators.activations.collect import select_tensors
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile
from deploy_opt.report.build_page import write_build_page
from deploy_opt.report.layers import layer_table_rows
from exporters.ort.qdq import write_ort_qdq

FAIL_BOX = 'class="verdict fail"'


def _banners(text: str) -> list[str]:
    """Every verdict box of a page: its class and its text."""
    return re.findall(r'<div class="verdict (\w+)"><b>[^<]*</b>([^<]*)</div>', text)


@pytest.fixture(scope="module")
def fused_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny MLP built with asymmetric activations and Relu among the op types: ORT removes the Relu into the
    Add before it, which takes the Relu's output name (what made a passing build show a red FAIL)."""
    tmp = tmp_path_factory.mktemp("fused_build")
    overrides = ["quantization.activations=asymmetric", "quantization.op_types=[MatMul, Add, Relu]"]
    return build_tiny(tmp, "gate: {max_drop: 5}", overrides).out_dir


def test_a_passing_build_with_a_removed_relu_shows_no_fail(fused_build: Path, caplog: pytest.LogCaptureFixture) -> None:
    nodes = onnx.load(str(fused_build / "model.int8.onnx")).graph.node
    assert not any(n.op_type == "Relu" for n in nodes)  # the case at hand: ORT did remove it
    build = json.loads((fused_build / "build.json").read_text())
    comparison = json.loads((fused_build / "compare.json").read_text())
    assert build["gate"]["passed"] is True
    assert comparison["verdict"] == "pass" and comparison["first_divergence"] is None, comparison["failures"]
    with caplog.at_level(logging.WARNING):
        text = write_build_page(fused_build).read_text(encoding="utf-8")
    assert not any("diverging" in r.getMessage() for r in caplog.records)
    assert FAIL_BOX not in text and "FAIL" not in text
    assert "&#x27;tensor&#x27;" not in text and "{&#x27;" not in text  # no raw Python dict anywhere
    assert ("pass", "comparison pass; first diverging layer: none") in _banners(text)


def test_a_real_divergence_still_shows_in_words(fused_build: Path, tmp_path: Path) -> None:
    folder = tmp_path / "build"
    folder.mkdir()
    for name in ("build.json", "compare.json", "model.onnx", "model.int8.onnx"):
        (folder / name).write_bytes((fused_build / name).read_bytes())
    record = json.loads((folder / "compare.json").read_text())
    record |= {
        "verdict": "fail",
        "failures": ["layer 'h2' (node 'fc2') diverges: quantization"],
        "first_divergence": {
            "tensor": "h2",
            "node": "fc2",
            "producer": "relu",
            "op": "Relu",
            "reason": "quantization",
            "sqnr_db": 0.2317,
            "threshold": 10.0,
        },
    }
    (folder / "compare.json").write_text(json.dumps(record))
    text = write_build_page(folder).read_text(encoding="utf-8")
    fails = [words for css, words in _banners(text) if css == "fail"]
    assert fails == [
        "comparison fail; first diverging layer: tensor &#x27;h2&#x27; (Relu, node &#x27;fc2&#x27;): its own "
        "quantization SQNR is 0.2 dB, below 10 dB"
    ]
    assert "{&#x27;" not in text


def test_targets_not_deployed_to_are_informational(fused_build: Path, tmp_path: Path) -> None:
    summary = json.loads((fused_build / "compat.int8.json").read_text())["summary"]
    assert summary["tensorrt"]["fail"] > 0  # int32 biases: TensorRT would refuse this model; it is not a target
    text = (fused_build / "report.html").read_text(encoding="utf-8")
    section = text[text.index("Compatibility per target") : text.index("Cross-backend comparison")]
    assert FAIL_BOX not in section
    assert re.search(r'<td class="t">tensorrt</td><td class="t">informational: not deployed to</td>', section)
    assert '<td class="t">ort-cpu</td><td class="t">deployed</td>' in section
    # ort-cuda too: ORT's CUDA EP runs the Q/DQ nodes in float (a fallback, counted for information)
    infos = [words for css, words in _banners(section) if css == "info"]
    assert any(words.startswith("ort-cuda, tensorrt: not deployed to") for words in infos), infos
    # The same counts on a deployed target are a fault.
    folder = tmp_path / "build"
    folder.mkdir()
    for name in ("build.json", "compat.int8.json"):
        (folder / name).write_bytes((fused_build / name).read_bytes())
    compat = json.loads((folder / "compat.int8.json").read_text())
    (folder / "compat.int8.json").write_text(json.dumps(compat | {"targets": ["ort-cpu", "tensorrt"]}))
    text = write_build_page(folder).read_text(encoding="utf-8")
    assert ("fail", f"tensorrt: {summary['tensorrt']['fail']} nodes fail") in _banners(text)


def _two_gemms(path: Path) -> Path:
    """x → Gemm fc1 → h → Gemm fc2 → y: fc2 reads fc1's output directly."""
    inits = tiny_onnx.seeded_weights(5, w1=(32, 16), b1=32, w2=(4, 32), b2=4)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Gemm", ["h", "w2", "b2"], ["y"], name="fc2", transB=1),
    ]
    return tiny_onnx.save_xy_model(path, nodes, "two_gemms", ["batch", 16], ["batch", 4], inits)


def test_layer_precision_comes_from_the_shipped_model(tmp_path: Path) -> None:
    fp32 = _two_gemms(tmp_path / "model.onnx")
    model = onnx.load(str(fp32))
    tensors = {n: activation_scale(n, -4.0, 4.0, "asymmetric", "minmax") for n in select_tensors(model, ["Gemm"])}
    tensors |= weight_scales(model, ["Gemm"])
    tensors |= bias_scales(model, tensors, ["Gemm"])
    qdq = write_ort_qdq(
        fp32,
        ScaleFile("asymmetric", tensors, {}),
        tmp_path / "model.int8.onnx",
        op_types=["Gemm"],
        exclude_nodes=["fc2"],
    )
    nodes = {n.name: n for n in onnx.load(str(qdq)).graph.node}
    dequantized = {o for n in nodes.values() if n.op_type == "DequantizeLinear" for o in n.output}
    # fc2 is excluded, yet it reads fc1's quantized output through a DequantizeLinear: its weight stays float.
    assert nodes["fc2"].input[0] in dequantized and nodes["fc2"].input[1] == "w2"
    rows = {row[0]: row for row in layer_table_rows(tmp_path, {})}
    assert rows["fc1"][7] == "INT8" and rows["fc1"][5] == 32 * 16
    assert rows["fc2"][7] == "FP32" and rows["fc2"][5] == rows["fc2"][4] == 4 * 32 * 4
    fallback = {row[0]: row[7] for row in layer_table_rows(tmp_path, {"fallback": {"nodes": ["fc2"]}})}
    assert fallback == {"fc1": "INT8", "fc2": "fallback (FP32)"}
