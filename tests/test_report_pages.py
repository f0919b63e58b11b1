"""``report.html``: one self-contained page per build, LLM run, training run and search, rendered in headless
Chromium (the Debian package) with the network cut off and zero console errors; module paths in a torch build.

Chromium is skipped where it is not installed, except where ``DEPLOY_OPT_REQUIRE_CHROMIUM=1`` (``.ci/run`` installs
it and sets that, so CI never skips these)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import tiny_cnn_config

from deploy_opt.report.folder_page import write_report_page
from dopt_common.errors import InputError

MAX_PAGE_BYTES = 5 * 1024 * 1024
TINY = Path(__file__).parent / "tiny_torch.py"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("DEPLOY_OPT_REQUIRE_CHROMIUM") == "1":
        pytest.fail("DEPLOY_OPT_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
    pytest.skip("needs chromium (Debian: apt-get install chromium)")


def render(page: Path, shot: Path) -> list[str]:
    """Screenshot ``page`` offline; returns the console messages Chromium logged."""
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,900",
        f"--screenshot={shot}",
        "--enable-logging=stderr",
        "--v=0",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--no-first-run",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 5_000, done.stderr[-2000:]
    return [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def check_page(page: Path, tmp_path: Path) -> str:
    text = page.read_text(encoding="utf-8")
    assert page.stat().st_size <= MAX_PAGE_BYTES
    assert not re.search(r'(src|href)="(https?:)?//', text), "the page must not load anything from the network"
    assert render(page, tmp_path / f"{page.parent.name}.png") == []
    return text


@pytest.fixture(scope="module")
def torch_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build

    tmp = tmp_path_factory.mktemp("torch_build")
    config_path = tiny_cnn_config(tmp, f"{TINY}:calibration", f"{TINY}:evaluation")
    config, profile = load_build_config(config_path, "ci", ["sensitivity.enabled=true", "sensitivity.mode=exhaustive"])
    return run_build(config, profile, tmp / "reports", progress=False).out_dir


def test_a_torch_build_page_names_modules_and_renders_offline(torch_build: Path, tmp_path: Path) -> None:
    page = torch_build / "report.html"
    assert page.is_file()  # every build writes one
    text = check_page(page, tmp_path)
    build = json.loads((torch_build / "build.json").read_text())
    modules = build["export"]["module_names"]
    assert modules and all(path for path in modules.values())
    for heading in ("Accuracy and latency", "Per layer", "Sensitivity", "Calibration", "Run snapshot"):
        assert heading in text
    some = next(iter(modules.values()))
    assert some in text  # the per-layer table shows the PyTorch module beside the ONNX node
    sensitivity = json.loads((torch_build / "sensitivity.json").read_text())
    assert any(n.get("module") for n in sensitivity["nodes"])
    assert "PyTorch module" in (torch_build / "sensitivity.html").read_text()


def test_report_command_regenerates_the_page(torch_build: Path) -> None:
    (torch_build / "report.html").unlink()
    assert write_report_page(torch_build) == torch_build / "report.html"
    with pytest.raises(InputError, match="holds none of build.json"):
        write_report_page(torch_build / "..")


def test_training_and_search_pages_render(tmp_path: Path) -> None:
    from deploy_opt.config.profiles import example_config
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    config = load_train_config(example_config("train_digits"), ["epochs=1"])
    result = train(config, tmp_path / "run", progress=False)
    text = check_page(Path(result.output_dir) / "report.html", tmp_path)
    assert "training loss" in text and "gradient norm" in text and "SGD with momentum" in text


@pytest.mark.slow
def test_llm_page_renders_with_both_generations(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import tiny_llama

    from deploy_opt.llm.config import load_llm_config
    from deploy_opt.llm.pipeline import run_quantize_llm

    folder = tiny_llama.make_tiny_llama(tmp_path / "tiny")
    config = load_llm_config(None, tiny_llama.rtn_kv_flags(folder, session_len=512))
    result = run_quantize_llm(config, tmp_path / "reports", progress=False)
    text = check_page(result.out_dir / "report.html", tmp_path)
    assert "FP generation" in text and "quantized generation" in text and "KV cache" in text


def test_fallback_patterns_may_name_pytorch_modules(torch_build: Path) -> None:
    import onnx

    from deploy_opt.analysis.sensitivity.fallback import match_patterns
    from exporters.onnx.module_names import module_paths

    model = onnx.load(str(torch_build / "model.onnx"), load_external_data=False)
    modules = module_paths(model)  # model.onnx carries the map even though the simplifier dropped node metadata
    names = [n.name for n in model.graph.node]
    node, module = next((n, m) for n, m in modules.items() if n in names)
    assert node in match_patterns([module], names, modules)
    assert node in match_patterns([module[:-1] + "?"], names, modules)  # a glob on the module path
    with pytest.raises(Exception, match="matches no quantizable node or module"):
        match_patterns(["no.such.module"], names, modules)


def test_module_paths_from_scopes_names_and_parameters() -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from exporters.onnx.module_names import MODEL_KEY, module_paths, record_module_paths

    weight = numpy_helper.from_array(np.zeros((4, 4), np.float32), "val_7")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "encoder.layer.0.query.bias")
    fused = helper.make_node("Gemm", ["x", "val_7", "encoder.layer.0.query.bias"], ["y"], name="Gemm_1")
    scoped = helper.make_node("Relu", ["y"], ["z"], name="node_relu")
    scoped.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'encoder', 'encoder.act', 'relu']")
    placeholder = helper.make_node("Relu", ["z"], ["w"], name="node_shape")
    placeholder.metadata_props.add(
        key="pkg.torch.onnx.name_scopes", value="['', '_empty_nn_module_stack_from_metadata_hook', 'shape']"
    )
    torchscript = helper.make_node("Relu", ["w"], ["out"], name="/pooler/dense/Relu")
    graph = helper.make_graph(
        [fused, scoped, placeholder, torchscript],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
        [weight, bias],
    )
    model = helper.make_model(graph)
    found = module_paths(model)
    assert found == {
        "Gemm_1": "encoder.layer.0.query",
        "node_relu": "encoder.act",
        "/pooler/dense/Relu": "pooler.dense",
    }
    record_module_paths(model, {**found, "gone": "x"})  # only nodes the model has are stored
    model.graph.node[1].ClearField("metadata_props")  # as a simplifier leaves it
    assert module_paths(model) == found and MODEL_KEY in {p.key for p in model.metadata_props}
    assert "gone" not in module_paths(onnx.load_from_string(model.SerializeToString()))
