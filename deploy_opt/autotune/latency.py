"""Latency of a candidate model against FP32 on the target runtime, measured side by side."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dopt_common.ort import create_session


@dataclass(frozen=True)
class LatencyProbe:
    """Times a model and the FP32 model alternately at one batch; the ratio of medians is the speedup."""

    fp32: Any  # an open ORT session of the FP32 model
    feed: dict[str, np.ndarray]
    threads: int
    rounds: int = 7
    budget_s: float = 4.0  # per measurement: fewer rounds for a slow model

    def speedup(self, model: bytes) -> tuple[float, float]:
        """(median ms of ``model``, FP32 median ÷ its median)."""
        session = create_session(model, threads=self.threads)
        for s in (session, self.fp32):
            s.run(None, self.feed)
        times: dict[int, list[float]] = {0: [], 1: []}
        started = time.perf_counter()
        for _ in range(self.rounds):
            for key, s in ((0, session), (1, self.fp32)):
                begin = time.perf_counter()
                s.run(None, self.feed)
                times[key].append((time.perf_counter() - begin) * 1e3)
            if time.perf_counter() - started > self.budget_s and len(times[0]) >= 3:
                break
        ms, fp32_ms = statistics.median(times[0]), statistics.median(times[1])
        return ms, fp32_ms / ms
