"""ONNX Runtime sessions created one way everywhere, so timings and results are comparable."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import ModelError, one_line

log = logging.getLogger(__name__)


def create_session(
    model: str | os.PathLike[str] | bytes,
    *,
    threads: int | None = None,
    optimize: bool = True,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    spin: bool = True,
) -> Any:
    """An ORT InferenceSession with fixed thread counts; graph optimisations off for calibration.

    ``spin=False`` parks idle intra-op threads instead of spinning: for work whose CPU time is a budget
    (``dopt_common.clock``), since threads that spin while the machine is loaded burn CPU time doing nothing.
    Latency is timed with spinning on, as users run.
    """
    ort = require("onnxruntime", purpose="running ONNX models")
    if {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(providers):
        preload_cuda_libraries(ort)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = usable_threads(threads)
        options.inter_op_num_threads = 1
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else os.fspath(model), options, providers=list(providers)
        )
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        name = "<in-memory model>" if isinstance(model, bytes) else os.fspath(model)
        # Whole: ORT names the node first and the reason last, and a cut message loses one of them.
        reason = one_line(exc)
        raise ModelError(f"ONNX Runtime cannot load '{name}': {reason}") from exc


def preload_cuda_libraries(ort: Any) -> None:
    """Load the CUDA and cuDNN libraries that onnxruntime-gpu[cuda,cudnn] installed as pip packages.

    Its CUDA provider library has no RUNPATH to them, so without this a process that has not imported a CUDA
    torch first gets no CUDA session. ``preload_dlls`` exists from onnxruntime-gpu 1.21 and skips what it does not
    find; it loads each library once per process.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # it prints what it could not load; stdout is for CLI results
        preload()
    if said.getvalue().strip():
        log.info("onnxruntime.preload_dlls: %s", " ".join(said.getvalue().split()))


def usable_threads(threads: int) -> int:
    """``threads``, but no more than the cores this process may run on: a profile written for an 8-core server
    oversubscribes a 2-core machine, which makes every timing there meaningless and every run slower."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads > cores:
        _warn_threads(threads, cores)
    return max(1, min(threads, cores))


@functools.cache
def _warn_threads(threads: int, cores: int) -> None:
    log.warning("%d threads asked for, %d cores here: ORT sessions use %d", threads, cores, cores)


@functools.cache
def int8_pairs_saturate() -> bool:
    """True when this machine's ORT CPU kernels saturate uint8 x int8 products (x86 without VNNI).

    Without VNNI, MLAS multiplies u8 x s8 with VPMADDUBSW, whose pairwise sums saturate at int16:
    255*127 + 255*127 = 64770 comes back as 32767. ORT fuses DQ -> MatMul/Conv into those kernels (and turns int8
    activations into uint8 first on such CPUs), so a full-range int8 model computes something else than its
    scales say. 7-bit weights (ORT's ``reduce_range``) keep every pair sum below 32768. One MatMulInteger tells.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((2, 1), 127, np.int8), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "u8s8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (y,) = create_session(model.SerializeToString(), threads=1).run(None, {"a": np.full((1, 2), 255, np.uint8)})
    saturates = int(y.ravel()[0]) != 2 * 255 * 127
    if saturates:  # cached: said once per process, however many builds ask
        log.warning(
            "ONNX Runtime's int8 CPU kernels saturate u8×s8 products on this machine (no VNNI): int8 weights for "
            "ORT CPU use 7 bits (±63) so the model computes what its scales say"
        )
    return saturates
