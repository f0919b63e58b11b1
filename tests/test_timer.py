"""The one latency timer (``dopt_common/timer.py``): warm-up, interleaved rounds and each site's stop rule, on a
fake clock so every count is exact."""

from __future__ import annotations

import pytest

from dopt_common.timer import StopRule, deciles, fixed, median_ms, time_rounds, warm_up


class FakeClock:
    """A clock each run advances by that run's cost (seconds); reading it costs nothing."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def run(self, cost: float, log: list[str] | None = None, name: str = ""):
        def go() -> None:
            self.now += cost
            if log is not None:
                log.append(name)

        return go


def test_rounds_interleave_in_order_and_time_each_run() -> None:
    clock, order = FakeClock(), []
    runs = {"fp32": clock.run(0.002, order, "fp32"), "int8": clock.run(0.001, order, "int8")}
    times = time_rounds(runs, fixed(3), clock)
    assert order == ["fp32", "int8"] * 3
    assert times == {"fp32": pytest.approx([2.0] * 3), "int8": pytest.approx([1.0] * 3)}


@pytest.mark.parametrize(
    ("cost", "rounds"),
    [
        (0.0015, 667),  # fast: past min_rounds until 2 s have passed (3 ms a round)
        (0.5, 5),  # slow: past max_seconds once floor_rounds ran, although min_rounds is 10
        (0.0001, 2000),  # very fast: max_rounds ends it first
    ],
)
def test_the_build_s_rule_settles_fast_models_and_caps_slow_ones(cost: float, rounds: int) -> None:
    clock = FakeClock()
    rule = StopRule(min_rounds=10, min_seconds=2.0, max_seconds=2.0, floor_rounds=5, max_rounds=2000)
    times = time_rounds({"a": clock.run(cost), "b": clock.run(cost)}, rule, clock)
    assert len(times["a"]) == len(times["b"]) == rounds


def test_spent_counts_only_the_runs_and_a_run_may_measure_itself() -> None:
    clock = FakeClock()

    def idle_then_run() -> None:  # a busy machine: waiting time the rule must not count
        clock.now += 1.0

    def engine() -> float:
        clock.now += 0.5
        return 3.0  # its own milliseconds (a CUDA event), not the clock's 500

    rule = StopRule(min_rounds=2, min_seconds=0.01, count="spent")
    times = time_rounds({"wait": idle_then_run, "engine": engine}, rule, clock)
    assert times["engine"] == [3.0, 3.0]  # spent 2 x (1.0 + 0.003) s > 0.01 once two rounds ran


def test_warm_up_runs_each_its_times_and_stops_early_past_its_budget() -> None:
    clock, order = FakeClock(), []
    warm_up({"a": clock.run(0.1, order, "a"), "b": clock.run(0.1, order, "b")}, 3, clock=clock)
    assert order == ["a"] * 3 + ["b"] * 3
    order.clear()
    warm_up({"a": clock.run(1.0, order, "a"), "b": clock.run(1.0, order, "b")}, 3, max_seconds=0.5, clock=clock)
    assert order == ["a", "b"]  # a slow model gets one warm-up run each


def test_medians_and_deciles() -> None:
    assert median_ms([3.0, 1.0, 2.0]) == 2.0
    assert deciles([5.0]) == (5.0, 5.0)
    low, high = deciles([float(i) for i in range(1, 11)])
    assert low < 2.0 and high > 9.0
