"""Latency of ORT FP32 vs INT8: median of repeated runs after warm-up, at fixed batch sizes."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from deploy_opt.config.build import BuildConfig
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.uncertainty import NOISY_WIDTH, speedup_interval
from deploy_opt.report.record_sections import BatchRow
from dopt_common.timer import StopRule, deciles, median_ms, runner, time_rounds, warm_up

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Latency:
    """Summary of repeated timings of one session at one batch size, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    times_ms: tuple[float, ...] = field(default=(), repr=False)  # every round, in order (pairs across sessions)

    def to_json(self) -> dict[str, float]:
        """Plain data for build.json (the rounds themselves stay out)."""
        return {k: v for k, v in asdict(self).items() if k != "times_ms"}


def feed_of_size(batch: Batch, size: int) -> dict[str, np.ndarray]:
    """Real samples tiled along the batch axis to exactly ``size`` rows."""
    return tiled(batch.inputs, size)


def tiled(inputs: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Each input's rows repeated along the batch axis to exactly ``size`` rows."""
    reps = -(-size // len(next(iter(inputs.values()))))
    return {k: np.ascontiguousarray(np.concatenate([v] * reps, axis=0)[:size]) for k, v in inputs.items()}


def fixed_batch(model_path: Path) -> int | None:
    """The batch size the model's first input fixes (an integer first dimension), or None when it is dynamic."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    dims = inputs[0].type.tensor_type.shape.dim if inputs else []
    return dims[0].dim_value if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else None


def respect_fixed_batch(config: BuildConfig, model_path: Path) -> BuildConfig:
    """``config`` timing only the batch size the model accepts, when its batch is fixed (a static export).

    The profile's sizes (1 and 32) would feed a [1, 3, 320, 320] model 32 rows; its one size stands instead, for
    the search's latency probe, the benchmark, the TensorRT profile and the gate alike.
    """
    size = fixed_batch(model_path)
    bench = config.benchmark
    if size is None or bench.batch_sizes == (size,):
        return config
    log.info(
        "benchmark: the model fixes its batch at %d; timing batch %d only (not %s)", size, size, list(bench.batch_sizes)
    )
    return dataclasses.replace(
        config,
        benchmark=dataclasses.replace(bench, batch_sizes=(size,)),
        gate=dataclasses.replace(config.gate, speedup_batch=None),
    )


MIN_REPEATS = 5
# A fast model repeats until this much time has passed (past ``repeats``): fifty runs of a 0.5 ms model are
# 25 ms of measurement, which one scheduler hiccup can move by 30%.
MIN_SECONDS = 2.0


def measure(
    sessions: dict[str, object],
    feed: dict[str, np.ndarray],
    warmup: int,
    repeats: int,
    max_seconds: float | None = None,
) -> dict[str, Latency]:
    """Time each session ``repeats`` times after ``warmup`` runs, interleaved so noise hits all alike.

    Past ``max_seconds`` (and at least ``MIN_REPEATS`` rounds) it stops early; below ``MIN_SECONDS`` it goes on
    past ``repeats`` (up to 100 times as many). The repeats done are recorded.
    """
    runs = {name: runner(session.run, None, feed) for name, session in sessions.items()}  # type: ignore[attr-defined]
    warm_up(runs, warmup, None if max_seconds is None else max_seconds / 4)
    rule = StopRule(
        min_rounds=repeats,
        min_seconds=min(MIN_SECONDS, max_seconds or MIN_SECONDS),
        max_seconds=max_seconds,
        floor_rounds=MIN_REPEATS,
        max_rounds=repeats * 100,
    )
    return {name: _summarize(values) for name, values in time_rounds(runs, rule).items()}


def _summarize(times: list[float]) -> Latency:
    low, high = deciles(times)
    return Latency(median_ms(times), low, high, len(times), tuple(times))


def _measured_pairs(
    sessions: dict[str, object], feed: dict[str, np.ndarray], warmup: int, repeats: int, max_seconds: float | None
) -> dict[str, Latency]:
    """``measure``, then once more (rounds pooled) when the FP32/INT8 interval is wider than ``NOISY_WIDTH`` of
    its value: a busy machine gets a second window before the speed is called noise."""
    stats = measure(sessions, feed, warmup, repeats, max_seconds)
    if "ort_fp32" not in stats or "ort_int8" not in stats:
        return stats
    if speedup_interval(stats["ort_fp32"].times_ms, stats["ort_int8"].times_ms).relative_width <= NOISY_WIDTH:
        return stats
    log.info("benchmark: the speedup interval is wide (noisy machine); timing once more")
    again = measure(sessions, feed, 1, repeats, max_seconds)
    return {name: _summarize([*stats[name].times_ms, *again[name].times_ms]) for name in stats}


def compare(
    sessions: dict[str, object],
    batch: Batch,
    sizes: tuple[int, ...],
    warmup: int,
    repeats: int,
    max_seconds: float | None = None,
    same: dict[str, str] | None = None,
) -> dict[str, BatchRow]:
    """Latency of every session at each batch size, with the FP32/INT8 speedup (ratio of medians) and its 95%
    interval from bootstrapping the interleaved rounds as pairs (``speedup_ci95``).

    With ``ort_fp32_original`` (a pruned build) the pruned FP32 and INT8 are also timed against it. ``same``
    maps a session to another that runs the same graph (FP32 ships: model.int8.onnx quantizes no node): it is
    not timed again, it gets the other's rounds, so its speedup is exactly 1.
    """
    same = same or {}
    timed = {name: session for name, session in sessions.items() if name not in same}
    results: dict[str, BatchRow] = {}
    for size in sizes:
        stats = _measured_pairs(timed, feed_of_size(batch, size), warmup, repeats, max_seconds)
        stats |= {name: stats[source] for name, source in same.items() if name in sessions}
        row: dict[str, object] = {name: latency.to_json() for name, latency in stats.items()}
        for name in stats:
            if name.startswith("ort_int8") and "ort_fp32" in stats:
                interval = speedup_interval(stats["ort_fp32"].times_ms, stats[name].times_ms)
                row[name.replace("ort_int8", "speedup")] = stats["ort_fp32"].median_ms / stats[name].median_ms
                row[name.replace("ort_int8", "speedup") + "_ci95"] = [interval.low, interval.high]
        if "ort_fp32_original" in stats:  # a pruned build: both pruned models against the unpruned FP32
            for name in ("ort_fp32", "ort_int8"):
                row[f"speedup_{name[4:]}_vs_original"] = stats["ort_fp32_original"].median_ms / stats[name].median_ms
        results[str(size)] = BatchRow.from_json(row)
    return results
