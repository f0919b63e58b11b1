"""A budget counted in work rather than wall time, so that machine load does not change decisions.

Work is this process's CPU time (all its threads: ONNX Runtime's and torch's included) divided by the threads
the build runs with (``benchmark.threads``). On an idle machine whose threads are busy that is close to wall
time; on a loaded one the same work takes longer on the wall clock but costs the same CPU time, so the same
config and data start the same trials. Wall time is only a cap (``auto.wall_cap``, a multiple of the budget),
and the auto search's verdict says when the cap, not the budget, ended it.

Ray workers (``sensitivity.parallel`` > 1) run in other processes, whose CPU time is not counted here; there
the wall cap is what bounds the search.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
LOADED = 0.25  # the share of its time the main thread waited for a CPU above which the machine counts as loaded


def work_seconds(threads: int) -> float:
    """This process's CPU time over ``threads``: the unit of every budget the search spends."""
    return time.process_time() / max(threads, 1)


def _run_delay() -> tuple[float, float] | None:
    """The main thread's time on a CPU and waiting for one, in seconds (Linux schedstat), or None."""
    try:
        fields = Path(f"/proc/self/task/{os.getpid()}/schedstat").read_text().split()
    except OSError:
        return None
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


@dataclass
class WorkClock:
    """A budget of work seconds (``work_seconds``), capped by ``wall_cap_s`` of wall time."""

    budget_s: float
    wall_cap_s: float
    threads: int
    work0: float
    wall0: float
    delay0: tuple[float, float] | None

    @classmethod
    def start(cls, budget_s: float, wall_cap_s: float, threads: int) -> WorkClock:
        """A clock whose budget starts now."""
        return cls(budget_s, wall_cap_s, threads, work_seconds(threads), time.perf_counter(), _run_delay())

    def spent(self) -> float:
        """Work seconds spent since the start."""
        return work_seconds(self.threads) - self.work0

    def wall(self) -> float:
        """Wall seconds since the start."""
        return time.perf_counter() - self.wall0

    def left(self, expected_work: float = 0.0, expected_wall: float = 0.0) -> bool:
        """Whether work of ``expected_work`` (taking ``expected_wall``) still fits the budget and the cap."""
        fits_budget = self.spent() + expected_work < self.budget_s
        return fits_budget and self.wall() + expected_wall < self.wall_cap_s

    def capped(self) -> bool:
        """Whether the wall cap (not the work budget) is what is spent: the machine was too loaded to finish."""
        return self.wall() >= self.wall_cap_s and self.spent() < self.budget_s

    def waiting_share(self) -> float | None:
        """The share of the main thread's time since the start spent waiting for a CPU (None: unknown)."""
        now = _run_delay()
        if now is None or self.delay0 is None:
            return None
        ran, waited = now[0] - self.delay0[0], now[1] - self.delay0[1]
        return waited / (ran + waited) if ran + waited > 0 else None

    def loaded(self) -> bool:
        """Whether other work competed for the CPUs during the search (``LOADED``)."""
        share = self.waiting_share()
        return share is not None and share > LOADED
