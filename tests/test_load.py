"""Machine load does not change the auto search's decisions: its budget counts CPU work, not wall time
(``dopt_common/clock.py``), its candidates are ranked on one thread's CPU time (``autotune/latency.py``), and
OpenMP's idle threads do not spin the budget away beside other work (``quiet_openmp``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from conftest import HERE, write_config

HOG = "while True: pass"


@contextmanager
def _cpu_hogs(count: int):
    """``count`` busy-looping processes for the duration of the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        time.sleep(0.3)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _build(tmp_path: Path, config: Path, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    command = [sys.executable, "-m", "deploy_opt", "build", str(config), "--output-dir", str(tmp_path / out), "-q"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return json.loads((tmp_path / out / "unbalanced" / "build.json").read_text())["auto"]


def _decisions(auto: dict) -> list[tuple]:
    return [(t["step"], t["label"], round(t["drop"], 6)) for t in auto["trials"]]


def test_a_build_beside_two_cpu_hogs_makes_the_decisions_an_idle_one_makes(tmp_path: Path) -> None:
    """The same config and data, once alone and once beside two busy loops on the cores it may use (load 1
    against load 3; under pytest -n 2 that is one pinned core): the same trials in the same order with the same
    drops, the same choice, and about the same work."""
    model = __import__("unbalanced_onnx").make_model(tmp_path / "unbalanced.onnx")
    source = HERE / "unbalanced_onnx.py"
    config = write_config(
        tmp_path,
        f"""
name: unbalanced
model: {{onnx: {model.name}}}
data: {{calibration: "{source}:calibration", evaluation: "{source}:evaluation", metric: cosine}}
quantization: {{op_types: [Conv], keep_head: false}}
benchmark: {{enabled: false}}
gate: {{max_drop: 0.05}}
auto: {{recovery: [cle, bias, adaround], budget_s: 30}}
""",
    )
    idle = _build(tmp_path, config, "idle")
    with _cpu_hogs(2):
        loaded = _build(tmp_path, config, "loaded")
    assert len(idle["trials"]) >= 4, idle["trials"]  # placements, recovery: a search with choices to make
    assert _decisions(loaded) == _decisions(idle), (idle["verdict"], loaded["verdict"])
    assert loaded["chosen"] == idle["chosen"]


def test_openmp_threads_sleep_on_a_loaded_machine_and_a_user_s_setting_is_kept() -> None:
    """Beside two busy loops, ``quiet_openmp`` sets OMP_WAIT_POLICY=PASSIVE (spinning threads would burn the
    budget); an OMP_WAIT_POLICY the user set is left as it is."""
    probe = "import os; from dopt_common.clock import quiet_openmp as q; q(); print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    with _cpu_hogs(2):
        loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert loaded.stdout.strip() == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    kept = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert kept.stdout.strip() == "ACTIVE"


def test_the_search_s_ranking_clock_is_one_thread_s_cpu_time(tmp_path: Path) -> None:
    """``LatencyProbe.speedup`` times both models in this thread's CPU time: a model against itself is ~1x,
    whether or not two busy loops compete for the CPUs."""
    import tiny_onnx

    from deploy_opt.autotune.latency import LatencyProbe
    from dopt_common.ort import create_session

    path = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    feed = {"x": np.random.default_rng(0).normal(size=(256, tiny_onnx.FEATURES)).astype(np.float32)}
    single = create_session(path, threads=1)
    probe = LatencyProbe(create_session(path, threads=2), feed, 2, min_rounds=40, min_seconds=0.2, fp32_single=single)
    _, idle = probe.speedup(path.read_bytes())
    with _cpu_hogs(2):
        _, loaded = probe.speedup(path.read_bytes())
    assert 0.8 < idle < 1.25 and 0.8 < loaded < 1.25, (idle, loaded)
