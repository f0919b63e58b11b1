"""The corpus: every graph of onnx's backend-test ``light`` model zoo builds end to end from its ONNX file alone.

The three Conv+FC giants, DenseNet-121 and ResNet-50 run only with ``DEPLOY_OPT_FULL_ZOO=1`` (see ``_GIANTS``).

These are opset-9, IR-3 files from Caffe2 and older converters, with a fixed batch of 1, every initializer listed
as a graph input, weights made by ``ConstantOfShape`` (constant 0.02 or so), and biases shared between nodes. Each
build upgrades the opset, folds the weights, quantizes, passes the compatibility report and ``align verify``,
and its Q/DQ model loads and runs in ONNX Runtime.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import write_config
from zoo_data import ZOO, zoo_path

from deploy_opt.config.profiles import load_build_config
from deploy_opt.pipeline.build import run_build
from dopt_common.ort import create_session

HERE = Path(__file__).resolve().parent


# The three plain Conv+FC giants (AlexNet 240 MB, ZFNet 330 MB, VGG-19 550 MB of weights) exercise nothing the
# others do not and take half the corpus's time; DenseNet-121 and ResNet-50 (46 s and 30 s of the test command's
# 8 minutes) have the concats, residual Adds and BatchNorms that the Inceptions, ShuffleNet and SqueezeNet have.
# CI runs these five only with DEPLOY_OPT_FULL_ZOO=1.
_GIANTS = ("light_bvlc_alexnet", "light_vgg19", "light_zfnet512", "light_densenet121", "light_resnet50")
_FULL = os.environ.get("DEPLOY_OPT_FULL_ZOO") == "1"
# The default range choice (calibration.method: auto) measures every tensor's candidate methods by propagated
# output error: 18 s of DenseNet-121's 53. What these graphs test is their form (opset 9, IR 3, shared biases,
# weights made by ConstantOfShape), so SqueezeNet keeps every default and the others take min/max ranges, unless
# DEPLOY_OPT_FULL_ZOO=1 (tests/test_range_methods.py and test_calibration_build.py test the range choice).
_DEFAULTS = ("light_squeezenet",)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ZOO if _FULL or n not in _GIANTS])
def test_every_light_zoo_graph_builds_and_aligns(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOPT_ZOO_MODEL", name)
    shutil.copy(zoo_path(name), tmp_path / "model.onnx")
    data = HERE / "zoo_data.py"
    text = f"""
name: {name}
model: {{onnx: model.onnx}}
data: {{calibration: "{data}:calibration", evaluation: "{data}:evaluation", metric: cosine}}
benchmark: {{enabled: false}}
auto: {{budget_s: 5}}  # the graph's form is under test, not the search: it stops starting trials after 5 s
compare: {{samples: 8}}
"""
    if not (_FULL or name in _DEFAULTS):
        text += "calibration: {method: minmax}\n"
    config, profile = load_build_config(write_config(tmp_path, text), "ci", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    build = result.build.to_json()
    assert build["export"]["opset_converted"].startswith("9 -> 13")
    assert build["export"]["parity"]["max_abs"] <= build["export"]["parity"]["tolerance"]
    assert build["quantization"]["quantized_nodes"] > 0 and result.gate.passed, result.gate.lines()
    assert build["alignment"]["verdict"].startswith("pass")
    assert build["comparison"]["verdict"] == "pass", build["comparison"]
    compat = build["backends"]["compat"]
    # The FP32 model runs on every known backend; the Q/DQ model on the build's target (ORT CPU's form, with
    # int32 biases, which TensorRT's parser refuses: a TensorRT target gets a form of its own).
    assert all(counts["fail"] == 0 for counts in compat["compat"]["summary"].values()), compat
    assert compat["compat.int8"]["summary"]["ort-cpu"]["fail"] == 0, compat
    int8 = create_session(result.out_dir / "model.int8.onnx", threads=1)
    assert int8.get_inputs()[0].shape[0] == 1
