"""Latency of a candidate model against FP32 on the target runtime, measured side by side."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy_opt.evaluation.uncertainty import Interval, speedup_interval
from dopt_common.ort import create_session


@dataclass(frozen=True)
class LatencyProbe:
    """Times a model and the FP32 model alternately at one batch; the ratio of medians is the speedup.

    Rounds go on until both ``min_rounds`` and ``min_seconds`` are reached (a millisecond model gets hundreds of
    rounds, so its median is stable) and stop at ``max_seconds`` (a slow model gets at least three).
    """

    fp32: Any  # an open ORT session of the FP32 model
    feed: dict[str, np.ndarray]
    threads: int
    min_rounds: int = 7
    min_seconds: float = 1.0
    max_seconds: float = 4.0

    def speedup(self, model: bytes, scale: float = 1.0) -> tuple[float, float]:
        """(median ms of ``model``, FP32 median ÷ its median); ``scale`` stretches the time limits."""
        times, fp32_times = self._rounds(model, scale)
        ms = statistics.median(times)
        return ms, statistics.median(fp32_times) / ms

    def speedup_interval(self, model: bytes, scale: float = 1.0) -> tuple[float, Interval]:
        """(median ms of ``model``, the speedup with its 95% interval from the interleaved rounds as pairs)."""
        times, fp32_times = self._rounds(model, scale)
        return statistics.median(times), speedup_interval(fp32_times, times)

    def _rounds(self, model: bytes, scale: float) -> tuple[list[float], list[float]]:
        """Milliseconds of ``model`` and of FP32, one of each per round, alternately."""
        session = create_session(model, threads=self.threads)
        for s in (session, self.fp32):
            s.run(None, self.feed)
        times: dict[int, list[float]] = {0: [], 1: []}
        started = time.perf_counter()
        while True:
            for key, s in ((0, session), (1, self.fp32)):
                begin = time.perf_counter()
                s.run(None, self.feed)
                times[key].append((time.perf_counter() - begin) * 1e3)
            elapsed, rounds = time.perf_counter() - started, len(times[0])
            if rounds >= 3 and elapsed > self.max_seconds * scale:
                break
            if rounds >= self.min_rounds and elapsed > self.min_seconds * scale:
                break
        return times[0], times[1]
