"""The measuring side of ``benchmarks/int8/calibration.py``: one calibration in a fresh, memory-capped interpreter.

``calibration.py --worker SPEC`` runs :func:`worker`, which loads the batches saved by :func:`save_batches`,
calibrates with deploy_opt (``ours``) or ONNX Runtime's entropy calibrater (``ort-one``, ``ort-batch``) and writes
wall time, per-phase times, peak RSS and thresholds as JSON to ``spec['result']``.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

BINS, QUANTIZED_BINS = 2048, 128


def status_mib(field: str, pid: int | str = "self") -> float | None:
    """``VmRSS`` (current) or ``VmHWM`` (peak) resident set size of a process, MiB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return None


def load_batches(path: str) -> list[dict[str, np.ndarray]]:
    """The batches saved by :func:`save_batches`, in order."""
    with np.load(path) as archive:
        keys = sorted(archive.files)
        batches: dict[int, dict[str, np.ndarray]] = {}
        for key in keys:
            index, name = key.split(".", 1)
            batches.setdefault(int(index), {})[name] = archive[key]
    return [batches[i] for i in sorted(batches)]


def _calibrate_ours(spec: dict, batches: list[dict[str, np.ndarray]], model, note) -> dict[str, float]:
    from calibrators.activations.collect import collect, select_tensors
    from calibrators.activations.ranges import entropy_amax
    from calibrators.activations.streaming import StreamingObserver

    clock = _Phases(note)
    names = select_tensors(model, spec["op_types"])
    note(selected=len(names))
    clock.done("select")
    observer = StreamingObserver(set(names), BINS)
    collect(spec["model"], batches, names, observer, threads=spec["threads"])
    hists = observer.abs_histograms()
    clock.done("one pass (min/max + histograms)")
    amax = {name: entropy_amax(hist, QUANTIZED_BINS) for name, hist in hists.items()}
    clock.done("entropy")
    return amax


class _Phases:
    """Wall time of consecutive phases, recorded as they end."""

    def __init__(self, note) -> None:
        self._note, self._last, self.phases = note, time.perf_counter(), {}

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self._last
        self._last = now
        self._note(phases=self.phases)


def _calibrate_ort(spec: dict, batches: list[dict[str, np.ndarray]], tmp: str, note) -> dict[str, float]:
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self, items: list[dict[str, np.ndarray]]) -> None:
            self._items = iter(items)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._items, None)

    clock = _Phases(note)
    calibrator = create_calibrator(
        spec["model"],
        op_types_to_calibrate=spec["op_types"],
        augmented_model_path=str(Path(tmp) / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options={"num_bins": BINS, "num_quantized_bins": QUANTIZED_BINS},
    )
    note(selected=len(calibrator.tensors_to_calibrate))
    clock.done("create_calibrator")
    if spec["method"] == "ort-one":
        calibrator.collect_data(Reader(batches))
    else:
        for batch in batches:
            calibrator.collect_data(Reader([batch]))
    clock.done("collect_data")
    data = calibrator.compute_data()
    clock.done("compute_data")
    ranges = {name: value.range_value for name, value in data.items()}
    return {name: max(abs(float(lo)), abs(float(hi))) for name, (lo, hi) in ranges.items()}


def worker(spec: dict) -> None:
    """One measurement; writes its result (and, first, its baseline) as JSON to ``spec['result']``."""
    cap = int(spec["mem_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import onnx
    import onnxruntime.quantization.calibrate  # noqa: F401  (imported before the baseline on both sides)

    import calibrators.activations.collect  # noqa: F401
    import calibrators.activations.ranges  # noqa: F401

    batches = load_batches(spec["data"])
    model = onnx.load(spec["model"])
    result = {"baseline_mib": status_mib("VmRSS")}

    def note(**values) -> None:
        """Record partial results, so that a crash still reports them."""
        result.update(values)
        Path(spec["result"]).write_text(json.dumps(result))

    note()
    with tempfile.TemporaryDirectory(prefix="deploy_opt.bench.ort.") as tmp:
        start = time.perf_counter()
        try:
            if spec["method"] == "ours":
                thresholds = _calibrate_ours(spec, batches, model, note)
            else:
                thresholds = _calibrate_ort(spec, batches, tmp, note)
        except BaseException as exc:
            # Catchable failures (ORT's one-call ValueError, MemoryError) still report their peak and time.
            note(peak_mib=status_mib("VmHWM"), failed_after_s=time.perf_counter() - start)
            raise SystemExit(f"{type(exc).__qualname__}: {exc}") from exc
        wall = time.perf_counter() - start
    note(wall_s=wall, peak_mib=status_mib("VmHWM"), thresholds=thresholds)


def save_batches(path: Path, batches: list[dict[str, np.ndarray]]) -> None:
    """Save ``batches`` into one ``.npz`` (keys ``<batch index>.<input name>``) for :func:`load_batches`."""
    np.savez(path, **{f"{i:05d}.{name}": value for i, batch in enumerate(batches) for name, value in batch.items()})
