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
LOADED = 0.25  # the share of the machine's CPU time other processes used, above which it counts as loaded


def work_seconds(threads: int) -> float:
    """This process's CPU time over ``threads``: the unit of every budget the search spends."""
    return time.process_time() / max(threads, 1)


def _machine_busy() -> tuple[float, float] | None:
    """(CPU seconds every process has used, this process's own), from Linux's /proc/stat; None elsewhere.

    Not the main thread's run delay: ONNX Runtime's own spinning intra-op threads make this process's main thread
    wait for a CPU on an idle machine (44 % on a VAD build with nothing else running).
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields[:8]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK"), time.process_time()


@dataclass
class WorkClock:
    """A budget of work seconds (``work_seconds``), capped by ``wall_cap_s`` of wall time."""

    budget_s: float
    wall_cap_s: float
    threads: int
    work0: float
    wall0: float
    busy0: tuple[float, float] | None

    @classmethod
    def start(cls, budget_s: float, wall_cap_s: float, threads: int) -> WorkClock:
        """A clock whose budget starts now."""
        return cls(budget_s, wall_cap_s, threads, work_seconds(threads), time.perf_counter(), _machine_busy())

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

    def others_share(self) -> float | None:
        """The share of the machine's CPU capacity since the start that other processes used (None: unknown)."""
        now, wall = _machine_busy(), self.wall()
        if now is None or self.busy0 is None or wall <= 0:
            return None
        others = (now[0] - self.busy0[0]) - (now[1] - self.busy0[1])
        return max(0.0, others) / (wall * (os.cpu_count() or 1))

    def loaded(self) -> bool:
        """Whether other work competed for the CPUs during the search (``LOADED``)."""
        share = self.others_share()
        return share is not None and share > LOADED


def quiet_openmp(samples: int = 5) -> str:
    """Keep OpenMP's idle threads (torch's) from spinning away the work budget; call before torch is imported.

    A thread that spins at a barrier while the machine is loaded waits for a descheduled sibling and burns CPU
    time, which the budget counts: a textdir build beside two CPU hogs spent 115 work seconds instead of 29 with
    libgomp's default spin. ``GOMP_SPINCOUNT=10000`` keeps an idle build's speed (43.5 s -> 44.7 s wall) and
    cut that to 40; on a loaded machine (other runnable tasks on at least half the CPUs in each of ``samples``
    reads of /proc/loadavg, 10 ms apart) idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``: 29 work seconds, but
    19% slower idle). A user's own setting of either is kept. Returns what it set, for the log.
    """
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return "kept the environment's OpenMP settings"
    os.environ["GOMP_SPINCOUNT"] = "10000"
    others = []
    for _ in range(samples):
        try:  # "0.50 0.40 0.30 3/114 1234": the fourth field counts runnable tasks, this one included
            others.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return "GOMP_SPINCOUNT=10000"
        time.sleep(0.01)
    if min(others) >= max(1, (os.cpu_count() or 1) / 2):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return f"GOMP_SPINCOUNT=10000, OMP_WAIT_POLICY=PASSIVE ({min(others)} other runnable tasks)"
    return "GOMP_SPINCOUNT=10000"
