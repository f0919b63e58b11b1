"""The per-node compatibility report: every node gets every column, and fails/fallbacks are flagged.

Where ONNX Runtime can answer for itself (does a session load and run the model?), the report is checked against
it rather than against numbers copied from its own output.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.analysis import compat_data
from deploy_opt.analysis.compat import TARGETS, check_compat
from deploy_opt.analysis.compat_report import CompatReport, render_compat_markdown, write_compat
from dopt_common.errors import ConfigError, ModelError

TRT_VERSIONS = ("8.6", "9.3", "10.0", "10.1")
LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(glob.glob(str(LIGHT / "*.onnx")))


def _model(nodes, inputs, outputs, opset=17, initializers=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets)


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _ort_loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def _assert_columns(report: CompatReport, model: onnx.ModelProto) -> None:
    rows = [r for r in report.nodes if r["graph"] == "main"]
    assert [r["op_type"] for r in rows] == [n.op_type for n in model.graph.node]
    assert [r["graph_index"] for r in rows] == list(range(len(model.graph.node)))
    for row in report.nodes:
        assert {"ort_cpu", "ort_cuda", "int8_cpu", "tensorrt", "min_opset", "min_ort", "min_tensorrt"} <= set(row)
        assert isinstance(row["ort_cpu"]["kernel"], bool) and isinstance(row["ort_cuda"]["kernel"], bool)
        assert tuple(row["tensorrt"]) == TRT_VERSIONS
        assert set(row["status"]) == set(TARGETS) and set(row["status"].values()) <= {"ok", "fallback", "fail"}


def test_every_node_of_the_tiny_model_has_every_column(tiny_model: Path, tmp_path: Path) -> None:
    report = check_compat(tiny_model, TARGETS)
    model = onnx.load(str(tiny_model))
    _assert_columns(report, model)
    assert report.format == "deploy_opt.analysis.compat/1"
    assert report.model["opsets"] == {"ai.onnx": 17}
    assert [r["name"] for r in report.nodes] == [n.name for n in model.graph.node]
    # ORT runs this model on CPU, so the CPU column must say so for every node.
    assert _ort_loads(model)
    assert all(r["ort_cpu"]["kernel"] and r["status"]["ort-cpu"] == "ok" for r in report.nodes)
    assert report.summary["ort-cpu"] == {"ok": 5, "fallback": 0, "fail": 0}
    assert report.flagged == ()
    json_path, md_path = write_compat(report, tmp_path)
    assert json.loads(json_path.read_text()) == report.to_json()
    text = md_path.read_text()
    assert all(n.name in text for n in model.graph.node) and "| target | ok | fallback | fail |" in text


def test_sources_say_where_each_column_comes_from(tiny_model: Path) -> None:
    sources = check_compat(tiny_model).sources
    assert ort.__version__ in sources["ort_cpu"] and "registry" in sources["ort_cpu"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert "registry" in sources["ort_cuda"]
    else:  # the CPU wheel: ORT's published kernel table, with its version
        assert "ort_cuda_kernels.json" in sources["ort_cuda"] and "OperatorKernels.md" in sources["ort_cuda"]
    assert sources["tensorrt_target"]["version"] in TRT_VERSIONS


def _det_model() -> onnx.ModelProto:
    return _model([helper.make_node("Det", ["x"], ["y"], name="det")], [_float("x", [3, 3])], [_float("y", [])])


def test_an_op_tensorrt_does_not_support_is_flagged_for_tensorrt() -> None:
    table = compat_data.tensorrt_operators()
    assert all(not table[(v, "Det")].supported for v in TRT_VERSIONS)  # the CSV says N for Det
    model = _det_model()
    report = check_compat(model, ("ort-cpu", "tensorrt"))
    (row,) = report.nodes
    assert row["status"]["tensorrt"] == "fail" and row["min_tensorrt"] is None
    assert [(f["name"], f["target"]) for f in report.flagged] == [("det", "tensorrt")]
    assert _ort_loads(model) and row["status"]["ort-cpu"] == "ok"  # ORT itself runs it
    assert "⚠ det" in render_compat_markdown(report)


def test_a_constant_node_runs_everywhere_ort_runs_as_an_initializer() -> None:
    """ORT has no Constant kernel because it needs none (the node becomes an initializer at load): a torch export's
    Constant nodes are no ORT failure."""
    value = numpy_helper.from_array(np.ones((1, 4), np.float32), "c")
    model = _model(
        [
            helper.make_node("Constant", [], ["k"], name="const", value=value),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [_float("x", [1, 4])],
        [_float("y", [1, 4])],
    )
    report = check_compat(model, ("ort-cpu", "ort-cuda"))
    const = next(r for r in report.nodes if r["op_type"] == "Constant")
    assert _ort_loads(model) and const["status"]["ort-cpu"] == "ok" and const["status"]["ort-cuda"] == "ok"
    assert const["ort_cpu"]["via"] == "initializer"


def test_an_op_without_a_cuda_kernel_falls_back_to_cpu_on_ort_cuda() -> None:
    if compat_data.cuda_kernels().has_op("Det", ""):
        pytest.skip("this CUDA kernel table has Det")
    (row,) = check_compat(_det_model(), ("ort-cuda",)).nodes
    assert row["status"]["ort-cuda"] == "fallback" and "CPU" in row["reasons"]["ort-cuda"]


def test_an_op_newer_than_tensorrt_86_opsets_needs_tensorrt_10() -> None:
    model = _model([helper.make_node("Gelu", ["x"], ["y"])], [_float("x", [2, 4])], [_float("y", [2, 4])], opset=20)
    report = check_compat(model, ("tensorrt",), tensorrt_version="8.6")
    (row,) = report.nodes
    assert row["since_version"] == row["min_opset"] == onnx.defs.get_schema("Gelu", 20).since_version == 20
    assert row["min_tensorrt"] == "10.0"
    assert not row["tensorrt"]["8.6"]["supported"] and "opset 17" in row["tensorrt"]["8.6"]["reason"]
    assert row["status"]["tensorrt"] == "fail" and report.warnings  # model opset 20 > 8.6's 17
    assert row["min_ort"] == "1.17"  # the first release implementing opset 20
    assert _ort_loads(model) and row["status"]["ort-cpu"] == "ok"


def test_a_custom_domain_op_is_a_failure_on_ort_cpu() -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="custom")
    model = _model([node], [_float("x", [2])], [_float("y", [2])], extra_opsets=[("com.example", 1)])
    report = check_compat(model, ("ort-cpu", "tensorrt"))
    (row,) = report.nodes
    assert row["domain"] == "com.example" and row["opset"] == 1 and row["since_version"] is None
    assert row["status"] == {"ort-cpu": "fail", "ort-cuda": "fail", "tensorrt": "fail"}
    assert {f["target"] for f in report.flagged} == {"ort-cpu", "tensorrt"}
    assert not _ort_loads(model)  # ORT agrees: it cannot create a session


def _qdq_model(zero_point: int) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (an INT8 kernel exists) and -> Sin (none): ORT's QDQ shape."""
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(zero_point, np.int8), "zp"),
        numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dq"),
        helper.make_node("Conv", ["xd", "w"], ["c"], name="conv"),
        helper.make_node("Sin", ["xd"], ["y"], name="sin"),
    ]
    outputs = [_float("c", [1, 2, 4, 4]), _float("y", [1, 1, 6, 6])]
    return _model(nodes, [_float("x", [1, 1, 6, 6])], outputs, opset=13, initializers=inits)


def test_a_qdq_node_without_an_int8_kernel_runs_in_float_on_cpu() -> None:
    report = check_compat(_qdq_model(0), ("ort-cpu", "tensorrt"))
    rows = {r["name"]: r for r in report.nodes}
    assert rows["conv"]["quantized"] and rows["conv"]["int8_cpu"]["kernel"]
    assert "QLinearConv" in rows["conv"]["int8_cpu"]["kernels"] and rows["conv"]["status"]["ort-cpu"] == "ok"
    assert rows["sin"]["quantized"] and not rows["sin"]["int8_cpu"]["kernel"]
    assert rows["sin"]["status"]["ort-cpu"] == "fallback"
    assert rows["q"]["int8_cpu"]["kernels"] == ["QuantizeLinear"]
    assert rows["q"]["tensorrt"]["10.1"]["restriction"] == "satisfied"  # zero point 0, as TensorRT wants


def test_a_nonzero_zero_point_fails_tensorrt_at_parse_time() -> None:
    rows = {r["name"]: r for r in check_compat(_qdq_model(3), ("tensorrt",)).nodes}
    for name in ("q", "dq"):
        assert rows[name]["tensorrt"]["10.1"]["restriction"] == "applies"  # the table's clause, and the importer's
        assert rows[name]["status"]["tensorrt"] == "fail" and "non-zero zero point" in rows[name]["reasons"]["tensorrt"]


@pytest.mark.skipif(not LIGHT_MODELS, reason=f"the installed onnx has no light test models in {LIGHT}")
@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: Path(p).stem)
def test_every_node_of_onnx_s_own_test_models_is_reported(path: str, tmp_path: Path) -> None:
    report = check_compat(path, TARGETS)
    model = onnx.load(path, load_external_data=False)
    _assert_columns(report, model)
    assert report.model["nodes"] == len(report.nodes) >= len(model.graph.node) > 0
    assert sum(report.summary["ort-cpu"].values()) == len(report.nodes)
    json_path, md_path = write_compat(report, tmp_path, name="compat.int8")
    assert json_path.name == "compat.int8.json" and json.loads(json_path.read_text())["nodes"]
    assert CompatReport.from_json(json.loads(json_path.read_text())).to_json() == report.to_json()  # reads back
    text = md_path.read_text()
    assert "## Per op type" in text and text.count("\n| ") >= len(report.nodes)


def test_the_data_files_load_and_cover_every_tensorrt_version() -> None:
    versions = compat_data.tensorrt_versions()
    assert tuple(v.version for v in versions) == TRT_VERSIONS
    assert {v.version: v.max_opset for v in versions} == {"8.6": 17, "9.3": 19, "10.0": 20, "10.1": 20}
    table = compat_data.tensorrt_operators()
    for version in TRT_VERSIONS:
        assert table[(version, "Conv")].supported and sum(k[0] == version for k in table) > 150
    releases = {r.version: r.opset for r in compat_data.ort_releases()}
    assert releases["1.14"] == 18 and releases["1.16"] == 19 and releases["1.17"] == 20 and releases["1.20"] == 21
    opsets = [r.opset for r in compat_data.ort_releases()]
    assert opsets == sorted(opsets)
    cuda = compat_data.cuda_kernels()
    assert cuda.has_op("Conv", "") and cuda.ort_version


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: check_compat(m, ("ort-gpu",)), ConfigError, "ort-gpu"),
        (lambda m: check_compat(m, ("tensorrt",), tensorrt_version="7.0"), ConfigError, "7.0"),
        (lambda m: check_compat(m.parent / "missing.onnx"), ModelError, "missing.onnx"),
    ],
)
def test_bad_arguments_name_the_value(tiny_model: Path, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(tiny_model)


def test_tensorrt_parser_is_skipped_cleanly_without_tensorrt(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec  # as on a machine without tensorrt, whether or not this one has it
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt" else real(name, *a))
    parser = check_compat(tiny_model, ("tensorrt",)).tensorrt_parser
    assert parser["ran"] is False and "not installed" in parser["reason"]


@pytest.mark.tensorrt
def test_tensorrt_parser_confirms_the_table(tiny_model: Path) -> None:
    pytest.importorskip("tensorrt")
    report = check_compat(tiny_model, ("tensorrt",))
    if not report.tensorrt_parser["ran"]:
        pytest.skip(report.tensorrt_parser["reason"])
    assert all(r["tensorrt_parser"] for r in report.nodes) and report.summary["tensorrt"]["fail"] == 0


def _clear_kernel_caches() -> None:
    for loader in (compat_data._registry, compat_data.runtime_kernels, compat_data.cuda_kernels):
        loader.cache_clear()


def test_a_gpu_build_reads_its_registry_in_a_child_process(monkeypatch, tiny_model: Path) -> None:
    """onnxruntime-gpu lists more providers than the CPU wheel: its registry is read in a child process (the
    child here runs the real CPU wheel), and gives the same CPU kernels as the in-process read."""
    from exporters.ort import registry as ort_registry

    in_process = ort_registry.registry_rows()
    calls = []
    real_run = ort_registry.subprocess.run
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_registry.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    version, rows = ort_registry.read_registry()
    assert calls and version == ort.__version__ and rows == json.loads(json.dumps(in_process))


def test_a_registry_read_that_dies_falls_back_to_the_published_tables(monkeypatch, caplog, tiny_model: Path) -> None:
    """onnxruntime-gpu 1.31 without TensorRT's libraries segfaults reading its registry (seen on an H200): the
    child dies by signal 11 (subprocess.run's CompletedProcess has returncode -11), and the report reads the CPU
    and CUDA kernels from data/ instead of failing the build."""
    from exporters.ort import registry as ort_registry

    died = ort_registry.subprocess.CompletedProcess(args=[], returncode=-11, stdout="", stderr="")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_registry.subprocess, "run", lambda *a, **k: died)
    _clear_kernel_caches()
    try:
        with caplog.at_level("WARNING"):
            report = check_compat(tiny_model, targets=("ort-cpu", "ort-cuda"))
        assert "signal 11" in caplog.text
        assert "ort_cpu_kernels.json" in report.sources["ort_cpu"]
        assert "ort_cuda_kernels.json" in report.sources["ort_cuda"]
        published = compat_data.runtime_kernels(compat_data.CPU_PROVIDER)
    finally:
        _clear_kernel_caches()
    installed = compat_data.runtime_kernels(compat_data.CPU_PROVIDER)
    # The shipped CPU table is a real registry: every op the installed CPU wheel registers is in it.
    assert set(installed.kernels) <= set(published.kernels)
    # And it judges the model as the installed registry does.
    assert report.summary == check_compat(tiny_model, targets=("ort-cpu", "ort-cuda")).summary
