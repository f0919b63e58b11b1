"""Latency of a candidate model against FP32 on the target runtime, measured side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from deploy_opt.evaluation.uncertainty import Interval, speedup_interval
from dopt_common.ort import create_session
from dopt_common.timer import StopRule, median_ms, runner, time_rounds, warm_up


@dataclass(frozen=True)
class LatencyProbe:
    """Times a model and the FP32 model alternately at one batch; the ratio of medians is the speedup.

    Two clocks, for two uses:

    - ``speedup``, which ranks the search's candidates, runs both models on one thread and times each run in that
      thread's CPU time (``time.thread_time``). A busy machine delays a run but does not lengthen the CPU time it
      takes, so the ranking, and every choice the search makes from it, is the same at load 1 and at load 4
      (wall-clock ratios of two-thread sessions moved 1.04-1.18x on one textdet model beside two CPU hogs;
      one-thread CPU time 1.08-1.10x). Rounds stop on that CPU time too.
    - ``speedup_interval``, the last step (INT8 against FP32, as users run it), times ``fp32`` and the model at
      ``threads`` on the wall clock: the one timing-dependent decision, which the verdict flags under load.

    Rounds go on until both ``min_rounds`` and ``min_seconds`` are reached (a millisecond model gets hundreds of
    rounds, so its median is stable) and stop at ``max_seconds`` (a slow model gets at least three).
    """

    fp32: Any  # an open ORT session of the FP32 model at ``threads``
    feed: dict[str, np.ndarray]
    threads: int
    min_rounds: int = 7
    min_seconds: float = 1.0
    max_seconds: float = 4.0
    fp32_single: Any = None  # the FP32 model on one thread (``speedup``); None: ``fp32`` serves

    def speedup(self, model: bytes, scale: float = 1.0) -> tuple[float, float]:
        """(median one-thread CPU ms of ``model``, FP32 median ÷ its median); ``scale`` stretches the limits."""
        single = self.fp32_single if self.fp32_single is not None else self.fp32
        times, fp32_times = self._rounds(create_session(model, threads=1), single, time.thread_time, scale)
        ms = median_ms(times)
        return ms, median_ms(fp32_times) / ms

    def speedup_interval(self, model: bytes, scale: float = 1.0) -> tuple[float, Interval]:
        """(median wall ms of ``model``, the speedup with its 95% interval from the interleaved rounds as pairs)."""
        session = create_session(model, threads=self.threads)
        times, fp32_times = self._rounds(session, self.fp32, time.perf_counter, scale)
        return median_ms(times), speedup_interval(fp32_times, times)

    def _rounds(self, session: Any, fp32: Any, clock: Callable[[], float], scale: float) -> tuple[list, list]:
        """Milliseconds of ``session`` and of ``fp32`` on ``clock``, one of each per round, alternately; the rounds
        count the time the runs themselves took on that clock."""
        runs = {"model": runner(session.run, None, self.feed), "fp32": runner(fp32.run, None, self.feed)}
        warm_up(runs, 1)
        rule = StopRule(
            min_rounds=self.min_rounds,
            min_seconds=self.min_seconds * scale,
            max_seconds=self.max_seconds * scale,
            floor_rounds=3,
            count="spent",
        )
        times = time_rounds(runs, rule, clock)
        return times["model"], times["fp32"]
