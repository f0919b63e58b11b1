"""The TensorRT engine path on the CPU: fakes of ``tensorrt`` and ``cuda.bindings.runtime`` that follow the real
APIs (``tests/fake_tensorrt.py``) stand in for the GPU.

- Scale readback: onnx-tensorrt's naming (a constant LAYER named after the initializer, its output tensor
  unnamed) applied to a real ORT-style Q/DQ model; ``network_scales`` must key it as ``read_qdq_scales`` does.
- The optimisation profile from varied calibration shapes, and every refused binding call as a clear error.
- The runner: buffers allocated once, its own stream, events around the execute alone, everything freed.
- ORT CUDA: a session that fell back to CPU is never timed as ``ort_cuda``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_tensorrt import (
    Builder,
    FakeCudart,
    IBuilderConfig,
    IOptimizationProfile,
    Network,
    Tensor,
    as_float32,
    fake_tensorrt,
    fake_trt_network_module,
    ort_style_qdq_model,
    parse_like_onnx_tensorrt,
    reference,
)

from dopt_common.errors import ExportError
from exporters.ort.qdq import read_qdq_scales
from exporters.tensorrt.engine import add_profile, initializer_names, network_scales
from exporters.tensorrt.profile import ShapeProfile, declared_dims, input_shapes

# ---------------------------------------------------------------- scale readback


def test_weights_are_read_back_by_their_constant_layer_name(tmp_path: Path) -> None:
    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    expected = {n: as_float32(t.scale) for n, t in read_qdq_scales(path).items()}
    assert {"x", "W", "mm"} == set(expected)  # the reference really has a weight in it
    network = parse_like_onnx_tensorrt(path)
    weight_dq = next(layer for layer in network._layers if layer.name == "W_DequantizeLinear")
    assert weight_dq.get_input(0).name.startswith("(Unnamed Layer*")  # what the old tensor-name keying saw
    assert network_scales(fake_trt_network_module(), network, initializer_names(path)) == expected


def test_a_uniqued_constant_layer_still_maps_to_its_initializer(tmp_path: Path) -> None:
    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    network = parse_like_onnx_tensorrt(path, taken=("W_quantized",))  # an earlier layer holds the name
    assert any(layer.name.startswith("W_quantized_") for layer in network._layers)
    trt = fake_trt_network_module()
    assert "W" not in network_scales(trt, network)  # without the initializer names the suffix stays
    assert network_scales(trt, network, initializer_names(path))["W"] == as_float32((0.011, 0.013, 0.017))


# ---------------------------------------------------------------- optimisation profile

SEQ_BATCHES = [(16, 12), (16, 31), (16, 12), (16, 20), (5, 9)]  # padded per batch; a short last batch of 5


def test_profile_spans_varied_sequence_lengths_and_a_short_last_batch() -> None:
    seen = [{"input_ids": s, "attention_mask": s} for s in SEQ_BATCHES]
    profile = ShapeProfile.from_shapes(seen, max_batch=32, opt_batch=32, declared={"input_ids": (None, None)})
    assert profile.shapes["input_ids"] == ((1, 9), (32, 12), (32, 31))  # opt seq: the most common (12)
    tuned = ShapeProfile.from_shapes(seen, max_batch=32, opt_batch=8, opt={"input_ids": (16, 20)})
    assert tuned.shapes["input_ids"] == ((1, 9), (8, 20), (32, 31))
    for shape in SEQ_BATCHES:
        low, _, high = profile.shapes["attention_mask"]
        assert all(lo <= d <= hi for lo, d, hi in zip(low, shape, high, strict=True))


def test_a_fixed_onnx_dim_stays_fixed_and_a_mismatch_is_named() -> None:
    fixed = ShapeProfile.from_shapes(
        [{"x": (4, 128)}, {"x": (2, 128)}], max_batch=8, opt_batch=8, declared={"x": (None, 128)}
    )
    assert fixed.shapes["x"] == ((1, 128), (8, 128), (8, 128))
    mismatch = r"input 'x' axis 1 is fixed at 128 in the ONNX model but batches have \[64\]"
    with pytest.raises(ExportError, match=mismatch):
        ShapeProfile.from_shapes([{"x": (4, 64)}], max_batch=8, opt_batch=8, declared={"x": (None, 128)})


def test_declared_dims_and_input_shapes_read_the_model_and_batches(tmp_path: Path) -> None:
    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    assert declared_dims(path) == {"x": (None, 4)}
    assert input_shapes([{"x": np.zeros((3, 4))}]) == [{"x": (3, 4)}]


class RefusingConfig(IBuilderConfig):
    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        return -1  # what TensorRT returns for a profile it refuses


def test_add_profile_sets_every_input_and_a_refused_profile_is_an_error() -> None:
    network = Network()
    network._inputs = [Tensor("input_ids", (-1, -1)), Tensor("attention_mask", (-1, -1))]
    builder, config = Builder(None), IBuilderConfig()
    profile = ShapeProfile.from_shapes(
        [{"input_ids": s, "attention_mask": s} for s in SEQ_BATCHES], max_batch=32, opt_batch=32
    )
    add_profile(builder, network, config, profile)
    assert config._profiles[0]._shapes == dict(profile.shapes)
    refused = RefusingConfig()
    with pytest.raises(ExportError, match=r"refused the optimization profile \(input_ids: min \(1, 9\)"):
        add_profile(builder, network, refused, profile)
    partial = ShapeProfile({"input_ids": profile.shapes["input_ids"]})
    with pytest.raises(ExportError, match=r"no shapes for dynamic inputs \['attention_mask'\]"):
        add_profile(builder, network, refused, partial)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Install fake tensorrt and cuda.bindings.runtime; returns (cudart, make_trt(refuse), engine path)."""
    cudart = FakeCudart()
    runtime = cudart.module()
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    for name, module in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.runtime", runtime)):
        monkeypatch.setitem(sys.modules, name, module)

    def install(refuse: str | None = None) -> types.ModuleType:
        trt = fake_tensorrt(cudart, refuse)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        return trt

    engine = tmp_path / "model.engine"
    engine.write_bytes(b"fake plan")
    return cudart, install, engine


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (rng.random((batch, seq)) > 0.2).astype(np.int64)
    return {"input_ids": rng.integers(0, 1000, (batch, seq)), "attention_mask": mask}


# ---------------------------------------------------------------- the runner


def test_runner_allocates_once_runs_on_its_own_stream_and_times_the_execute_alone(gpu) -> None:
    from exporters.tensorrt.runner import engine_runner, time_runner

    cudart, install, engine = gpu
    trt = install()
    with engine_runner(engine) as runner:
        mallocs = [e for e in cudart.timeline if e[0] == "malloc"]
        sizes = {e[2] for e in mallocs}
        assert len(mallocs) == 4 and 8 * 16 * 8 in sizes  # every io tensor, sized for the profile's (8, 16)
        for batch, seq in [(2, 5), (8, 16), (1, 1), (5, 12)]:  # a short batch, the maximum, varied sequences
            got = runner(feeds(batch, seq))
            for out, want in zip(got, reference(*feeds(batch, seq).values()), strict=True):
                np.testing.assert_array_equal(out, want)
        assert [e for e in cudart.timeline if e[0] == "malloc"] == mallocs  # nothing allocated per call
        stream = cudart.streams[0]
        assert int(stream) != 0 and set(trt._engines[0]._context._executed_on) == {int(stream)}
        copies = [e for e in cudart.timeline if e[0] == "copy"]
        assert copies and all(e[2] == int(stream) for e in copies)
        # The events bracket exactly one execute: no copy, malloc or sync between them.
        records = [i for i, e in enumerate(cudart.timeline) if e[0] == "record"]
        for start, end in zip(records[::2], records[1::2], strict=True):
            assert [e[0] for e in cudart.timeline[start + 1 : end]] == ["execute"]
        assert time_runner(runner, feeds(4, 8), repeats=3, warmup=0) == 2.0  # the median of 3.0, 1.0, 2.0
    assert cudart.memory == {}  # every buffer freed
    assert set(map(int, cudart.destroyed)) == {int(stream), *map(int, cudart.events)}
    with pytest.raises(ExportError, match="is closed"):
        runner(feeds(1, 1))


@pytest.mark.parametrize(
    ("refuse", "message"),
    [
        ("set_input_shape", r"refused input 'input_ids' of shape \(8, 16\): the engine's profile is min \(1, 1\)"),
        ("set_tensor_address", r"refused the device address of tensor 'input_ids'"),
        ("execute_async_v3", r"failed to execute on inputs 'input_ids' \(2, 3\) \(profile min \(1, 1\) opt "),
    ],
)
def test_every_refused_binding_call_is_a_clear_error(gpu, refuse: str, message: str) -> None:
    from exporters.tensorrt.runner import engine_runner

    cudart, install, engine = gpu
    install(refuse)
    with pytest.raises(ExportError, match=message):
        with engine_runner(engine) as runner:
            runner(feeds(2, 3))
    assert cudart.memory == {} and len(cudart.destroyed) == 3  # freed on the way out, even from __init__


def test_a_shape_outside_the_profile_names_the_input_shape_and_range(gpu) -> None:
    from exporters.tensorrt.runner import engine_runner

    cudart, install, engine = gpu
    install()
    with engine_runner(engine) as runner:
        runner(feeds(2, 3))
        with pytest.raises(ExportError, match=r"input 'input_ids' of shape \(2, 40\).*max \(8, 16\); fix: rebuild"):
            runner(feeds(2, 40))


def test_a_cuda_error_is_named_and_nothing_leaks(gpu) -> None:
    from exporters.tensorrt.runner import engine_runner

    cudart, install, engine = gpu
    install()
    cudart.fail_malloc = True
    with pytest.raises(ExportError, match=r"cudaMalloc\(input_ids, 1024\) failed with cudaErrorMemoryAllocation"):
        engine_runner(engine)
    assert len(cudart.destroyed) == 3  # the stream and both events


# ---------------------------------------------------------------- ORT CUDA


class FakeSession:
    def __init__(self, providers: list[str]) -> None:
        self.providers, self.runs = providers, 0

    def get_providers(self) -> list[str]:
        return self.providers

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        return reference(*feed.values())


@pytest.mark.parametrize(
    "session_providers", [["CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"]]
)
def test_ort_cuda_is_timed_only_when_the_session_runs_on_cuda(gpu, monkeypatch, session_providers) -> None:
    import dopt_common.ort
    from deploy_opt.data.sources import Batch
    from deploy_opt.stages.backends import time_engine_vs_ort_cuda

    cudart, install, engine = gpu
    install()
    ort = types.ModuleType("onnxruntime")
    ort.get_available_providers = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]  # the package has it
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    session = FakeSession(session_providers)
    opened: list[object] = []
    monkeypatch.setattr(dopt_common.ort, "create_session", lambda model, **k: opened.append(model) or session)
    timing = time_engine_vs_ort_cuda(engine, Path("model.onnx"), Batch(feeds(2, 6), None), (1, 8))
    on_cuda = "CUDAExecutionProvider" in session_providers
    assert opened == [Path("model.onnx")]  # the FP32 model: ORT's CUDA EP runs a Q/DQ model in float
    for size in ("1", "8"):
        row = timing.rows[size]
        assert row["tensorrt_execute"] in (1.0, 2.0, 3.0)  # event-timed
        assert ("ort_cuda_fp32" in row) is on_cuda and ("speedup_vs_ort_cuda_fp32" in row) is on_cuda
    if on_cuda:
        assert session.runs > 0 and timing.ort_cuda.startswith("ran on")
    else:
        assert session.runs == 0
        assert timing.ort_cuda.startswith("not available: session fell back to CPU")
        assert "onnxruntime-gpu[cuda,cudnn]" in timing.ort_cuda
    assert cudart.memory == {}  # the timing runner was closed


def test_engine_profile_covers_every_shape_the_build_runs(tmp_path: Path) -> None:
    from deploy_opt.config.build import BenchmarkConfig, CompareConfig, GateConfig
    from deploy_opt.data.sources import Batch
    from deploy_opt.stages.backends import engine_profile

    path = ort_style_qdq_model(tmp_path / "m.int8.onnx")
    config = types.SimpleNamespace(
        benchmark=BenchmarkConfig(batch_sizes=(1, 32)), compare=CompareConfig(batch_size=64), gate=GateConfig()
    )
    calibration = [{"x": (16, 4)}, {"x": (16, 4)}, {"x": (3, 4)}]  # a short last batch
    profile = engine_profile(config, path, Batch({"x": np.zeros((8, 4), np.float32)}, None), calibration)
    assert profile.shapes["x"] == ((1, 4), (32, 4), (64, 4))  # batch to the compare's 64, tuned for the gate's 32


def test_engine_outputs_are_matched_to_the_onnx_model_s_by_name(gpu) -> None:
    from exporters.tensorrt.runner import engine_runner

    cudart, install, engine = gpu
    install()
    with engine_runner(engine) as runner:
        first, second = runner.outputs
        pooled, tokens = reference(*feeds(2, 3).values())
        swapped = runner.in_order([second, first])(feeds(2, 3))  # a graph that lists them the other way round
        np.testing.assert_array_equal(swapped[0], tokens)
        np.testing.assert_array_equal(swapped[1], pooled)
        with pytest.raises(ExportError, match=r"has outputs .* the ONNX model \['logits'\]; fix: rebuild"):
            runner.in_order(["logits"])
