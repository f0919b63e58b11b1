"""Score and time ONNX artifacts the same way for every tool: one metric function, one evaluation set, one loop.

- ``load_data``: a config's calibration or evaluation batches, from the functions it names (resolved as the
  build resolves them, relative to the config's folder).
- ``score``: the metric's mean over the evaluation set, per artifact. Data without labels is scored against
  the FP32 ONNX model's first output, as a build does when it has no torch model.
- ``latency``: median milliseconds per artifact at one batch size; the artifacts run interleaved (one run each
  per round), so machine noise hits them alike. ORT CPU, 2 intra-op threads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.stages.benchmark import tiled
from dopt_common.timer import StopRule, median_ms, runner, time_rounds

log = logging.getLogger(__name__)
THREADS = 2
Item = tuple[dict[str, np.ndarray], Any, Any]


def load_config(path: Path) -> dict[str, Any]:
    """The YAML config as a dict (only ``name``, ``model`` and ``data`` are read)."""
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_data(config_path: Path, split: str) -> list[Item]:
    """The ``data.<split>`` batches of the config at ``config_path`` as ``(inputs, label, ids)`` tuples.

    ``test`` is the held-out split no build sees: the function named like the evaluation one with ``test_data``
    for ``evaluation_data`` (``people.py:evaluation_data_single`` → ``people.py:test_data_single``).
    """
    from deploy_opt.data.sources import resolve_callable

    config = load_config(config_path)
    names = [spec["name"] for spec in config["model"]["inputs"]]
    spec = config["data"]["evaluation"].replace("evaluation_data", "test_data") if split == "test" else None
    out = []
    for item in resolve_callable(spec or config["data"][split], config_path.parent, f"data.{split}")():
        inputs = item[0] if isinstance(item[0], dict) else {names[0]: item[0]}
        out.append(({k: np.asarray(v) for k, v in inputs.items()}, item[1], item[2] if len(item) > 2 else None))
    return out


def session(path: Path) -> Any:
    """An ORT CPU session with 2 intra-op threads and default graph optimisations (the project's one opener)."""
    from dopt_common.ort import create_session

    return create_session(path, threads=THREADS)


def score(
    artifacts: dict[str, Path], fp32: str, evaluation: list[Item], metric_name: str, base_dir: Path
) -> tuple[dict[str, float | str], dict[str, list[float]]]:
    """The metric's mean per artifact (a failing artifact gets its error as a string instead), and each
    artifact's per-sample scores in one order (for the paired comparison of two tools on the same samples)."""
    from deploy_opt.evaluation.metrics import resolve_metric

    metric = resolve_metric(metric_name, base_dir)
    sessions: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for name, path in artifacts.items():
        try:
            sessions[name] = session(path)
        except Exception as exc:  # a peer's file ORT cannot load is a result, not a crash of the runner
            cause = exc.__cause__ or exc  # ORT's own error, which the opener wraps in a ModelError
            results[name] = f"ORT cannot load it: {type(cause).__name__}: {str(cause).splitlines()[0][:160]}"
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    for inputs, label, _ in evaluation:
        reference = sessions[fp32].run(None, inputs)[0] if label is None else np.asarray(label)
        for name, s in list(sessions.items()):
            try:
                samples[name].extend(batch_scores(metric, s, inputs, reference))
            except Exception as exc:  # noqa: BLE001 - reported in the row
                results[name] = f"evaluation failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                del sessions[name], samples[name]
    for name in sessions:
        results[name] = sum(samples[name]) / max(len(samples[name]), 1)
    return results, samples


def batch_scores(metric: Any, session: Any, inputs: dict[str, np.ndarray], reference: np.ndarray) -> list[float]:
    """One batch's scores (per sample, or one for a metric that scores the batch): ``metric`` on the session's
    first output against ``reference``, a label or the FP32 model's first output."""
    return [float(v) for v in np.ravel(metric.score(np.asarray(session.run(None, inputs)[0]), reference))]


def fixed_batch(path: Path) -> int | None:
    """The first input's batch dimension when the file fixes it (e.g. 1), else None: the build's own rule."""
    from deploy_opt.stages.benchmark import fixed_batch as model_fixed_batch

    return model_fixed_batch(path)


def latency(
    artifacts: dict[str, Path], feed: dict[str, np.ndarray], settle_s: float = 5.0, budget_s: float = 20.0
) -> dict:
    """Median ms per artifact, interleaved: 2 warm-up rounds, then rounds until ``settle_s`` has passed and at
    least 10 rounds ran (a fast model runs up to 2,000 rounds), or past ``budget_s`` once 5 rounds ran."""
    sessions: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for name, path in artifacts.items():
        try:
            sessions[name] = session(path)
            for _ in range(2):
                sessions[name].run(None, feed)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            results[name] = f"cannot run: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            sessions.pop(name, None)
    rule = StopRule(min_rounds=10, min_seconds=settle_s, max_seconds=budget_s, floor_rounds=5, max_rounds=2000)
    times = time_rounds({name: runner(s.run, None, feed) for name, s in sessions.items()}, rule)
    results |= {name: median_ms(t) for name, t in times.items()}
    log.info(
        "latency at batch %d: %s",
        len(next(iter(feed.values()))),
        ", ".join(f"{k}={v:.2f} ms" for k, v in results.items() if isinstance(v, float)),
    )
    return results


def speedups(artifacts: dict[str, Path], fp32: str, first: dict[str, np.ndarray], sizes: Sequence[int]) -> dict:
    """{artifact: {batch: speedup or error}} at each batch size, FP32 timed in the same loop."""
    out: dict[str, dict[int, Any]] = {name: {} for name in artifacts}
    for size in sizes:
        medians = latency(artifacts, tiled(first, size))
        base = medians.get(fp32)
        for name in artifacts:
            value = medians.get(name)
            out[name][size] = base / value if isinstance(value, float) and isinstance(base, float) else value
    return out
