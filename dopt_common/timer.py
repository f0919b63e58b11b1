"""The one latency timer: warm-up, interleaved rounds and a stop rule, in milliseconds.

Every timing site of the project runs through ``time_rounds``: the build's benchmark
(``deploy_opt/stages/benchmark.py``), the auto search's probe (``deploy_opt/autotune/latency.py``), the fallback
search's rough step (``deploy_opt/analysis/sensitivity/fallback.py``), TensorRT's runner
(``exporters/tensorrt/runner.py``) and the corpus (``benchmarks/corpus/measure.py``); so do the benchmark
scripts that time runs (``benchmarks/int8/conversion_cost.py``, ``dynamic_int8.py``, ``unseen/peer_static.py``).
They differ only in their ``StopRule`` and clock, which each states where it calls this. It lives in
``dopt_common`` because exporters may not import deploy_opt. Speed-up intervals over the rounds (a paired
bootstrap) are ``deploy_opt/evaluation/uncertainty.py``'s.

A round runs every callable once, in the order given, so a burst of machine noise hits all of them alike. A
callable may return its own measurement in milliseconds (TensorRT's CUDA-event time of the execute alone); one
that returns None is timed on ``clock``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """When rounds stop, checked before each round on the time counted so far (seconds).

    Stop once ``min_rounds`` ran and more than ``min_seconds`` passed (a fast model keeps going until its median
    is stable), or once ``floor_rounds`` ran and more than ``max_seconds`` passed (a slow model stops early); never
    past ``max_rounds``. ``count``: ``elapsed`` counts ``clock`` since the first round, ``spent`` only the
    measured runs (CPU time of the runs themselves, when the clock is a CPU clock).
    """

    min_rounds: int
    min_seconds: float = -1.0  # below zero: min_rounds alone decides
    max_seconds: float | None = None
    floor_rounds: int = 1
    max_rounds: int | None = None
    count: str = "elapsed"  # "elapsed" or "spent"

    def stops(self, done: int, seconds: float) -> bool:
        """Whether to stop before round ``done + 1``, ``seconds`` counted so far."""
        if self.max_rounds is not None and done >= self.max_rounds:
            return True
        if done >= self.min_rounds and seconds > self.min_seconds:
            return True
        return self.max_seconds is not None and done >= self.floor_rounds and seconds > self.max_seconds


def runner(fn: Callable[..., object], *args: object) -> Callable[[], None]:
    """``fn(*args)`` as a run to time, its result dropped (``runner(session.run, None, feed)``)."""

    def run() -> None:
        fn(*args)

    return run


def fixed(rounds: int) -> StopRule:
    """Exactly ``rounds`` rounds."""
    return StopRule(min_rounds=rounds, max_rounds=rounds)


def warm_up(
    runs: Mapping[str, Callable[[], object]],
    times: int,
    max_seconds: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Run each callable ``times`` times, one after the other; past ``max_seconds`` of warm-up in all, each further
    callable runs once (a slow model needs few warm-up runs)."""
    started = clock()
    for run in runs.values():
        for _ in range(times):
            run()
            if max_seconds is not None and clock() - started > max_seconds:
                break


def time_rounds(
    runs: Mapping[str, Callable[[], float | None]],
    rule: StopRule,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Milliseconds of every run, by name, one of each per round, in order, until ``rule`` stops."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    started, spent, done = clock(), 0.0, 0
    while not rule.stops(done, spent if rule.count == "spent" else clock() - started):
        for name, run in runs.items():
            begin = clock()
            own = run()
            took = clock() - begin if own is None else own / 1e3
            times[name].append(took * 1e3)
            spent += took
        done += 1
    return times


def median_ms(times: list[float]) -> float:
    """The median of a run's rounds."""
    return float(statistics.median(times))


def deciles(times: list[float]) -> tuple[float, float]:
    """(10th, 90th) percentile of a run's rounds (both the one value for a single round)."""
    if len(times) < 2:
        return times[0], times[0]
    cuts = statistics.quantiles(times, n=10)
    return cuts[0], cuts[-1]
