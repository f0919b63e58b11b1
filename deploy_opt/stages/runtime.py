"""The evaluate and benchmark stages: every runtime scored in one pass, then FP32 vs INT8 latency."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.build import BenchmarkConfig, DeployConfig
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.evaluate import Evaluation, evaluate, session_runner, torch_runner
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.report.record_sections import BenchmarkRecord
from deploy_opt.stages import benchmark
from dopt_common.ort import create_session, usable_threads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtimes:
    """The ORT sessions of the build (FP32, shipped INT8, and the INT8 without fallback) and their scores."""

    sessions: dict[str, Any]
    scores: Evaluation  # on the judged samples
    reference: str  # the runner every other is compared with: torch FP32 when there is a torch model
    decision: Evaluation | None = None  # the same runners on the samples the search decided on


def evaluate_runtimes(
    models: dict[str, Path],
    input_names: list[str],
    torch_model: Any,
    evaluation: Iterable[Batch],
    metric: Metric,
    threads: int,
    progress: bool,
    decision: Sequence[Batch] = (),
) -> Runtimes:
    """Open one session per model (``ort_fp32``, ``ort_int8``, ...) and score them all in one pass over the
    judged ``evaluation``, and in a second over the ``decision`` samples when there are any."""
    sessions = {name: create_session(path, threads=threads) for name, path in models.items()}
    runners = {name: session_runner(s) for name, s in sessions.items()}
    if torch_model is not None:
        runners = {"torch_fp32": torch_runner(torch_model, input_names)} | runners
    reference = "torch_fp32" if torch_model is not None else "ort_fp32"
    decided = evaluate(runners, decision, metric, reference, progress) if decision else None
    return Runtimes(sessions, evaluate(runners, evaluation, metric, reference, progress), reference, decided)


def cpu_timed(deploy: DeployConfig, bench: BenchmarkConfig) -> BenchmarkConfig:
    """The benchmark section, switched off when no deploy target runs on the CPU: a GPU profile's speed is the
    TensorRT engine's (``build/backends.py``), and an ORT CPU timing under its name would say nothing of it."""
    if "ort-cpu" in deploy.targets or not bench.enabled:
        return bench
    log.info(
        "benchmark: not timed on the CPU: the targets (%s) run on GPUs; the TensorRT engine's timing, where it "
        "was built here, is the build's speed",
        ", ".join(deploy.targets),
    )
    return dataclasses.replace(bench, enabled=False)


def run_benchmark(
    bench: BenchmarkConfig, sessions: dict[str, Any], sample: Batch, same: dict[str, str] | None = None
) -> BenchmarkRecord | None:
    """Median latencies at each batch size with the FP32/INT8 speedup, or None when benchmarking is off.

    ``same``: sessions that run another's graph (``benchmark.compare``), recorded as ``same_model``.
    """
    if not bench.enabled:
        return None
    return BenchmarkRecord(
        threads=usable_threads(bench.threads),
        warmup=bench.warmup,
        repeats=bench.repeats,
        input_shapes={k: list(v.shape[1:]) for k, v in sample.inputs.items()},
        max_seconds=bench.max_seconds,
        batches=benchmark.compare(
            sessions, sample, bench.batch_sizes, bench.warmup, bench.repeats, bench.max_seconds, same
        ),
        same_model=dict(same) if same else None,
    )
