"""The code against the API-surface table (``tests/data/tensorrt_api.json``), and the engine build end to end.

- Every ``trt.<name>`` and ``cudart.<name>`` the TensorRT exporter uses is in the table (read from the AST), and the
  fakes refuse at run time any member the table lacks, so a fake cannot agree with a bug the real API would raise.
- A deliberate misuse (``.numpy()`` on ``IConstantLayer.weights``, ``.weights`` before the cast) fails here as it
  does on a GPU; the old code's ``_constant_values`` is shown to fail.
- ``build_engine`` and ``engine_scales`` (what ``align verify`` runs) on the fake module: the plan is written and
  the scales TensorRT's network carries equal ``read_qdq_scales``.
- The calibration cache header names ``tensorrt.__version__`` where only NVIDIA's split wheels are installed, and
  an installed TensorRT 11 (which reads no cache) gets none.
- Versions: the table (``scripts/tensorrt_api_table.py`` writes its ``versions`` from the real bindings wheels)
  says what 10.16 and 11.4 lack; the 11.x fake refuses ``BuilderFlag.INT8`` and ``FP16``, the 10.x one has them,
  and an fp16-fallback build runs against the 11.x table without them.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
from api_surface import NotInApiTable, Surface, members, table, versions
from fake_tensorrt import (
    Builder,
    IConstantLayer,
    as_float32,
    fake_tensorrt,
    ort_style_qdq_model,
    parse_like_onnx_tensorrt,
)

from exporters.ort.qdq import read_qdq_scales
from exporters.tensorrt import engine
from exporters.tensorrt.engine import initializer_names, network_scales

ROOT = Path(__file__).resolve().parents[1]
CODE = sorted((ROOT / "exporters" / "tensorrt").glob("*.py"))


def _module_uses(path: Path, names: tuple[str, ...]) -> set[str]:
    """``X`` of every ``<name>.X`` (and ``self._<name>.X``) in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self":
                base = ast.Name(base.attr.lstrip("_"))
            if isinstance(base, ast.Name) and base.id in names:
                found.add(node.attr)
    return found


def test_every_module_name_the_exporter_uses_is_in_the_table() -> None:
    trt = {name for path in CODE for name in _module_uses(path, ("trt",))}
    cuda = {name for path in CODE for name in _module_uses(path, ("cudart",))}
    assert {"IConstantLayer", "LayerType", "Builder", "OnnxParser", "nptype"} <= trt  # the scan sees real uses
    assert {"cudaMalloc", "cudaMemcpyAsync", "cudaEventElapsedTime"} <= cuda
    assert trt - set(table()["tensorrt"]["module"]) == set()
    assert cuda - set(table()["cuda_runtime"]["module"]) == set()


def test_the_table_declares_weights_an_ndarray_and_cuda_calls_tuples() -> None:
    classes = table()["tensorrt"]["classes"]
    assert classes["IConstantLayer"]["members"]["weights"]["type"] == "numpy.ndarray"
    assert classes["INetworkDefinition"]["members"]["get_layer"]["returns"] == "ILayer"
    calls = table()["cuda_runtime"]["module"]
    assert all(spec["returns"][0] == "cudaError_t" for spec in calls.values() if spec["kind"] == "function")


# ---------------------------------------------------------------- deliberate misuse


@pytest.fixture
def constant(tmp_path: Path):
    """A weight-scale constant layer as ``network.get_layer`` returns it (the base ILayer)."""
    network = parse_like_onnx_tensorrt(ort_style_qdq_model(tmp_path / "m.int8.onnx"))
    index = next(i for i, layer in enumerate(network._layers) if layer.name == "W_scale")
    return network.get_layer(index)


def test_numpy_on_the_weights_array_fails_as_on_a_gpu(constant) -> None:
    constant.__class__ = IConstantLayer
    assert isinstance(constant.weights, np.ndarray)
    with pytest.raises(AttributeError, match="'numpy.ndarray' object has no attribute 'numpy'"):
        constant.weights.numpy()


def test_the_old_readback_fails_on_the_table_built_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def old(trt, layer):  # the code before issue 33
        layer.__class__ = trt.IConstantLayer
        return tuple(float(v) for v in np.asarray(layer.weights.numpy(), dtype=np.float32).reshape(-1))

    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    monkeypatch.setattr(engine, "_constant_values", old)
    with pytest.raises(AttributeError, match="no attribute 'numpy'"):
        network_scales(fake_tensorrt(), parse_like_onnx_tensorrt(path), initializer_names(path))


def test_members_outside_the_table_are_refused(constant) -> None:
    with pytest.raises(NotInApiTable, match="'ILayer' object has no attribute 'weights'"):
        constant.weights  # noqa: B018  (get_layer returns ILayer: no weights before the cast)
    with pytest.raises(NotInApiTable, match="no attribute 'Weights'"):
        fake_tensorrt().Weights  # noqa: B018
    with pytest.raises(NotInApiTable, match=r"ILayer.get_input argument 0 is str"):
        constant.get_input("0")


def test_a_fake_cannot_return_what_the_table_does_not_declare(constant) -> None:
    class Drifted(IConstantLayer):
        @property
        def weights(self):  # a Weights-like object, as the old hand-written fake returned
            return type("Weights", (), {"numpy": lambda self: np.ones(3, np.float32)})()

    constant.__class__ = Drifted
    with pytest.raises(NotInApiTable, match=r"IConstantLayer.weights returned Weights .*the table says numpy.ndarray"):
        constant.weights  # noqa: B018
    with pytest.raises(NotInApiTable, match=r"defines \['numpy'\]"):
        type("Bad", (Surface,), {"api": "IConstantLayer", "numpy": lambda self: None})


def test_a_scale_numpy_cannot_hold_is_a_clear_error() -> None:
    """Only a type NumPy lacks (BF16, FP8) comes back as trt.Weights (pyGraph.cpp); the code names it."""
    from dopt_common.errors import ExportError

    class Layer:  # a plain stand-in: the table's IConstantLayer.weights is an ndarray, so no fake returns this
        name, weights = "W_scale", type("Weights", (), {"dtype": "DataType.BF16"})()

    with pytest.raises(ExportError, match="scale constant 'W_scale' holds DataType.BF16 weights.*fix: store Q/DQ"):
        engine._constant_values(type("trt", (), {"IConstantLayer": Layer}), Layer())


# ---------------------------------------------------------------- the engine build, end to end


@pytest.mark.parametrize(
    ("version", "fp16", "typed"), [("10.16.1", True, False), ("11.4.0.106", True, True), ("10.16.1", False, True)]
)
def test_build_engine_runs_to_a_plan_and_reads_the_scales_back(tmp_path, monkeypatch, version, fp16, typed) -> None:
    from exporters.tensorrt.profile import ShapeProfile

    trt = fake_tensorrt(version=version)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    profile = ShapeProfile.from_shapes([{"x": (4, 4)}], max_batch=8, opt_batch=8, declared={"x": (None, 4)})
    built = engine.build_engine(path, tmp_path / "model.engine", profile, fp16_fallback=fp16)
    assert built.path.read_bytes() == b"fake plan" and built.tensorrt_version == version
    assert built.scales == {n: as_float32(t.scale) for n, t in read_qdq_scales(path).items()}
    assert (built.strongly_typed, built.fp16) == (typed, fp16 and not typed)
    assert engine.engine_scales(path) == built.scales  # what align verify reads


def test_a_parse_failure_names_the_parser_errors(tmp_path, monkeypatch) -> None:
    from dopt_common.errors import ExportError

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    with pytest.raises(ExportError, match=r"refused '.*missing.onnx': ModelImporter.cpp: failed to open"):
        engine.engine_scales(tmp_path / "missing.onnx")


# ---------------------------------------------------------------- the cache header's version


def test_the_cache_header_names_the_module_version_with_only_split_wheels(tmp_path, monkeypatch) -> None:
    """tensorrt-cu13, -libs and -bindings install no distribution named 'tensorrt' (issue 33)."""
    from importlib import metadata

    from deploy_opt.stages.backends import _installed_trt_version

    site = tmp_path / "site"
    (site / "tensorrt").mkdir(parents=True)
    (site / "tensorrt" / "__init__.py").write_text('__version__ = "10.16.1.11"\n')
    for dist in ("tensorrt_cu13", "tensorrt_cu13_libs", "tensorrt_cu13_bindings"):
        info = site / f"{dist}-10.16.1.11.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 10.16.1.11\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("tensorrt")  # the old lookup
    assert metadata.version("tensorrt-cu13-bindings") == "10.16.1.11"
    assert _installed_trt_version() == "10.16.1.11"
    from types import SimpleNamespace

    from test_interop import _random_scales

    from deploy_opt.stages.backends import write_backend_artifacts

    config = SimpleNamespace(deploy=SimpleNamespace(targets=("ort-cpu",)))
    quantized = SimpleNamespace(scales=_random_scales(1, "symmetric"), path=tmp_path / "model.int8.onnx")
    record = write_backend_artifacts(config, quantized, None, tmp_path)  # the build's backends stage
    header = (tmp_path / record.trt_cache).read_text().splitlines()[0]
    assert header == "TRT-101601-EntropyCalibration2"  # not the TRT-100001 fallback


def test_an_installed_tensorrt_11_gets_no_calibration_cache(tmp_path, monkeypatch) -> None:
    """TensorRT 11 removed implicit calibration, the one reader of calibration.cache: build.json says why."""
    from types import SimpleNamespace

    from test_interop import _random_scales

    from deploy_opt.stages import backends

    monkeypatch.setattr(backends, "_installed_trt_version", lambda: "11.4.0.106")
    config = SimpleNamespace(deploy=SimpleNamespace(targets=("ort-cpu",)))
    quantized = SimpleNamespace(scales=_random_scales(1, "symmetric"), path=tmp_path / "model.int8.onnx")
    record = backends.write_backend_artifacts(config, quantized, None, tmp_path)
    assert not (tmp_path / "calibration.cache").exists()
    assert record.trt_cache.startswith("not written: the installed TensorRT 11.4.0.106 has no implicit INT8")
    monkeypatch.setattr(backends, "_installed_trt_version", lambda: "10.16.1.11")
    assert backends.write_backend_artifacts(config, quantized, None, tmp_path).trt_cache == "calibration.cache"


# ---------------------------------------------------------------- versions


def test_the_table_holds_what_the_wheels_say_10_and_11_have() -> None:
    section = table()["tensorrt"]
    assert versions("tensorrt") == ["10.16.1.11", "11.4.0.106"]
    old, new = (section["versions"][v] for v in versions("tensorrt"))
    assert {"BuilderFlag.INT8", "BuilderFlag.FP16"} <= set(new["absent"]) and old["absent"] == []
    assert old["deprecated"]["BuilderFlag.INT8"].startswith("10.12: Superseded by strong typing")  # not 10.1
    assert new["deprecated"]["NetworkDefinitionCreationFlag.STRONGLY_TYPED"].startswith("11.0: Strongly typed mode")
    assert section["evidence"]["BuilderFlag.INT8"]["10.16.1.11"] == "docstring 'Enable Int8 layer selection.'"
    assert all(wheel["wheel"] in table()["sources"]["tensorrt"] for wheel in section["versions"].values())


def test_no_class_member_differs_between_versions() -> None:
    """The fake classes are shared by every version (``Surface.imitates``); a class member that one version lacks
    needs version-bound fakes first."""
    classes = table()["tensorrt"]["classes"]
    for api in classes:
        assert len({tuple(members("tensorrt", api, v)) for v in versions("tensorrt")}) == 1, api


@pytest.mark.parametrize("flag", ["INT8", "FP16"])
def test_the_11_fake_refuses_the_builder_flags_11_removed(flag: str) -> None:
    new, old = fake_tensorrt(version="11.4.0.106"), fake_tensorrt(version="10.16.1")
    with pytest.raises(NotInApiTable, match=rf"BuilderFlag.{flag} is not in tensorrt 11.4.0.106 \(deprecated in 10.12"):
        getattr(new.BuilderFlag, flag)
    assert not hasattr(new.BuilderFlag, flag)  # what engine.py's hasattr sees on 11.x
    assert getattr(old.BuilderFlag, flag).name == flag
    assert fake_tensorrt().__version__ == "11.4.0.106"  # the default imitates the newest table


def test_the_old_unconditional_fp16_flag_fails_on_the_11_fake() -> None:
    trt = fake_tensorrt(version="11.4.0.106")
    with pytest.raises(NotInApiTable, match="BuilderFlag.FP16 is not in tensorrt 11.4.0.106"):
        engine._builder_config(trt, trt.Builder(trt.Logger()), True, 1)


def test_fp16_fallback_builds_against_the_11_table_and_says_what_it_did(tmp_path, monkeypatch) -> None:
    from exporters.tensorrt.profile import ShapeProfile

    trt, builders = fake_tensorrt(version="11.4.0.106"), []

    class Recording(Builder):
        def __init__(self, logger) -> None:
            super().__init__(logger)
            builders.append(self)

    monkeypatch.setattr(trt, "Builder", Recording)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    profile = ShapeProfile.from_shapes([{"x": (4, 4)}], max_batch=8, opt_batch=8, declared={"x": (None, 4)})
    built = engine.build_engine(path, tmp_path / "model.engine", profile, fp16_fallback=True)
    (network, config, network_flags) = builders[0]._built[0]
    assert config._flags == set() and network_flags == 0  # no FP16/INT8; STRONGLY_TYPED is ignored on 11
    record = built.to_json()
    assert (record["strongly_typed"], record["fp16_fallback"]) == (True, False)
    assert "fp16 fallback not applied, TensorRT 11 removed BuilderFlag.FP16" in record["precision"]


@pytest.mark.parametrize("error", [TypeError("__init__(): incompatible constructor arguments"), RuntimeError("x")])
def test_a_builder_the_binding_refuses_is_an_export_error(tmp_path, monkeypatch, error) -> None:
    """``trt.Builder`` raises (rather than returning None) on some machines; build_tensorrt catches DeployOptError."""
    from dopt_common.errors import DeployOptError, ExportError

    def refuse(logger):
        raise error

    trt = fake_tensorrt()
    monkeypatch.setattr(trt, "Builder", refuse)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    name = type(error).__name__
    with pytest.raises(ExportError, match=rf"^TensorRT could not create a builder \({name}: .*\); fix: run on") as info:
        engine.engine_scales(ort_style_qdq_model(tmp_path / "m.int8.onnx"))
    assert isinstance(info.value, DeployOptError) and "\n" not in str(info.value)
