"""The peers deploy_opt is set beside: ONNX Runtime's ``quantize_static``, NVIDIA ModelOpt's ONNX PTQ, NNCF, AIMET.

Each peer quantizes the same ONNX file deploy_opt was given (for a torch model: the FP32 ONNX the build
exported) on the same calibration batches, in its own process, so its wall time and peak memory are its own:

- ``ort-minmax`` / ``ort-entropy``: ``quant_pre_process`` (ORT's recommended step: shape inference, graph
  optimisation such as folding BatchNormalization into Conv), then ``quantize_static``, QDQ, per-channel,
  uint8 activations, int8 weights, ``CalibrationMethod.MinMax`` / ``Entropy``. ``CalibStridedMinMax=1``
  makes ORT collect one batch at a time (histograms merged), so Entropy does not hold every activation of
  every sample at once.
- ``modelopt-entropy`` / ``modelopt-max``: ``python -m modelopt.onnx.quantization --quantize_mode int8`` in
  its own venv (``.cache/modelopt-venv``: nvidia-modelopt[onnx] 0.47.0 pulls onnxruntime-gpu, which must not
  share a folder with onnxruntime), ``--calibration_eps cpu``, ``--high_precision_dtype fp32`` (its default
  turns the rest of the model into fp16, which ORT CPU runs slowly), calibration data as .npy (.npz for several
  inputs) with ``--calibration_shapes`` set to the data's own batch shapes.
- ``nncf`` / ``nncf-ac``: ``nncf.quantize`` / ``nncf.quantize_with_accuracy_control`` in ``.cache/nncf-venv``
  (``nncf_peer.py``; nncf-ac validates candidates with ``scorer.py`` in this environment).
- ``aimet``: AIMET-ONNX CLE, QuantizationSimModel, then AdaRound, SeqMSE or neither, in ``.cache/aimet-venv``
  (``aimet_peer.py``).

The venv peers get the calibration batches as one .npz (``write_batches``; ``read_batches`` in the venv).

    python benchmarks/corpus/peers.py ort CONFIG MODEL OUT --method minmax|entropy   # run.py calls this
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MODELOPT = "nvidia-modelopt[onnx]==0.47.0"
NNCF = "nncf==3.4.0"
AIMET = "aimet-onnx==2.42.0"
TORCH_PIN = "torch==2.13.0"
NOTE_TAG = "peer note:"  # a peer's script prints what it did after this; run.py puts it in the row's outcome
TOOLS = ("deploy_opt", "ort-minmax", "ort-entropy", "modelopt-entropy", "modelopt-max", "nncf", "nncf-ac", "aimet")
BOUNDED = ("nncf-ac", "aimet")  # the peers that search: at most ``BOUND_S`` each by default (--search-timeout)
BOUND_S = 900.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Venv:
    """A peer's own venv, ``.cache/<name>-venv``: what pip installs there, the module that must import, and whether
    it must hold the main environment's onnxruntime and onnx (ModelOpt's pulls onnxruntime-gpu instead)."""

    name: str
    requirements: tuple[str, ...]
    module: str
    same_ort: bool = True

    @property
    def folder(self) -> Path:
        return HERE / ".cache" / f"{self.name}-venv"

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    def install(self) -> list[str]:
        """The pip install command: the requirements, plus the main environment's onnxruntime and onnx pins."""
        return [str(self.python), "-m", "pip", "install", *self.requirements, *(main_pins() if self.same_ort else [])]


MODELOPT_VENV = Venv("modelopt", (MODELOPT, TORCH_PIN), "modelopt.onnx.quantization", same_ort=False)
NNCF_VENV = Venv("nncf", (NNCF,), "nncf")
# torch: aimet-onnx requires it (AdaRound runs in torch); the pin is ModelOpt's and this environment's.
AIMET_VENV = Venv("aimet", (AIMET, TORCH_PIN), "aimet_onnx")
VENVS = {
    "modelopt-entropy": MODELOPT_VENV,
    "modelopt-max": MODELOPT_VENV,
    "nncf": NNCF_VENV,
    "nncf-ac": NNCF_VENV,
    "aimet": AIMET_VENV,
}


def main_pins() -> list[str]:
    """``onnxruntime==X`` and ``onnx==Y`` as installed here, so a peer's venv runs the ORT that scores it."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("onnxruntime", "onnx")]


@dataclass(frozen=True)
class Run:
    """A finished subprocess: exit code, wall seconds, peak RSS in MiB (None if unknown) and its last line."""

    rc: int
    wall_s: float
    peak_rss_mb: float | None
    last_line: str


def timed_run(
    command: list[str],
    log_path: Path,
    cwd: Path | None = None,
    timeout_s: float | None = None,
    bound: str = "--timeout",
) -> Run:
    """Run ``command`` under ``/usr/bin/time -v`` (when present) for its peak RSS; all output goes to ``log_path``.

    Past ``timeout_s`` the command (its whole process group) is killed and the run has exit code -9 and says
    ``killed after N s (<bound>)``.
    """
    timer = Path("/usr/bin/time")
    full = [str(timer), "-v", *command] if timer.is_file() else command
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # Its own process group, so a timeout kills the command and /usr/bin/time together.
    process = subprocess.Popen(
        full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        log_path.write_text(f"$ {' '.join(command)}\n{stdout}{stderr}\nkilled after {timeout_s} s", encoding="utf-8")
        return Run(-9, time.perf_counter() - start, None, f"killed after {timeout_s:.0f} s ({bound})")
    wall = time.perf_counter() - start
    done = subprocess.CompletedProcess(full, process.returncode, stdout, stderr)
    log_path.write_text(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}", encoding="utf-8")
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    peak = int(match.group(1)) / 1024 if match else None
    skip = ("\t", "Command exited")  # /usr/bin/time's own report
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip() and not ln.startswith(skip)]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln or ln.startswith("deploy_opt build:")]
    return Run(done.returncode, wall, peak, (errors or lines or [""])[-1][:200])


class _Reader:
    """An ORT CalibrationDataReader over whole batches, with the ``set_range`` that CalibStridedMinMax uses."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.batches = batches
        self.set_range(0, len(batches))

    def __len__(self) -> int:
        return len(self.batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.rows = iter(self.batches[start_index:end_index])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.rows, None)

    def rewind(self) -> None:
        self.set_range(0, len(self.batches))


def ort_quantize(config: Path, model: Path, out: Path, method: str) -> str:
    """``quant_pre_process`` then ``quantize_static`` of ``model`` on the config's calibration batches into ``out``.

    A file older than opset 13 is converted to 13 first (per-channel Q/DQ needs it; ORT writes an invalid
    opset-12 model otherwise). Returns what was done. Where the pre-processing fails (its symbolic shape
    inference does not handle every file) the file is quantized without it.
    """
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.shape_inference import quant_pre_process

    sys.path.insert(0, str(HERE))
    import measure

    batches = [inputs for inputs, _, _ in measure.load_data(config, "calibration")]
    calibrate = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy}[method]
    model, steps = _opset_13(model, out.with_name(out.stem + ".opset13.onnx"))
    pre = out.with_name(out.stem + ".pre.onnx")
    try:
        quant_pre_process(str(model), str(pre))
        source = pre
        steps.append("pre-processed (quant_pre_process)")
    except Exception as exc:  # noqa: BLE001 - ORT's own pre-processing is optional; say why it was skipped
        why = ": ".join([type(exc).__name__, *(str(exc).splitlines() or [])[:1]])[:100]
        source = model
        steps.append(f"quant_pre_process failed ({why}), quantized without it")
        log.warning("%s", steps[-1])
    tmp = out.with_name(out.stem + ".tmp.onnx")
    qdq_static(source, tmp, batches, True, calibrate_method=calibrate, extra_options={"CalibStridedMinMax": 1})
    tmp.replace(out)
    for scratch in (pre, out.with_name(out.stem + ".opset13.onnx")):
        scratch.unlink(missing_ok=True)
    return "; ".join(steps)


def qdq_static(
    source: Path, out: Path, batches: list[dict[str, np.ndarray]], per_channel: bool, **options: Any
) -> None:
    """ORT's ``quantize_static`` of ``source`` into ``out``: QDQ, uint8 activations, int8 weights, calibrated on
    ``batches`` in order (also ``unseen/peer_static.py``'s)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(
        str(source),
        str(out),
        _Reader(batches),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        **options,
    )


def _opset_13(model: Path, out: Path) -> tuple[Path, list[str]]:
    """``model`` converted to opset 13 when older (ORT's per-channel Q/DQ needs ``axis``), with what was done."""
    import onnx
    from onnx import version_converter

    loaded = onnx.load(str(model))
    opset = next((o.version for o in loaded.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model, []
    onnx.save(version_converter.convert_version(loaded, 13), str(out))
    return out, [f"opset {opset} converted to 13 (onnx.version_converter)"]


def ensure_venv(venv: Venv, log_path: Path) -> str | None:
    """Create ``venv`` on first use; return None when it works, else why not (one line)."""
    if not venv.python.is_file():
        for step in ([sys.executable, "-m", "venv", str(venv.folder)], venv.install()):
            run = timed_run(step, log_path)
            if run.rc != 0:
                shutil.rmtree(venv.folder, ignore_errors=True)
                return f"{venv.name} venv: {' '.join(step[-3:])} failed ({run.rc}): {run.last_line}"
    probe = f"import {venv.module}"
    if venv.same_ort:
        probe += "; import importlib.metadata as m; print(*(m.version(n) for n in ('onnxruntime', 'onnx')))"
    check = subprocess.run([str(venv.python), "-c", probe], capture_output=True, text=True)
    if check.returncode != 0:
        return (
            f"{venv.module} does not import in {venv.folder}: {(check.stderr.strip().splitlines() or [''])[-1][:160]}"
        )
    if venv.same_ort and check.stdout.split() != [pin.split("==")[1] for pin in main_pins()]:
        return f"{venv.folder} holds onnxruntime, onnx {check.stdout.strip()}, not {', '.join(main_pins())}: remove it"
    return None


def write_batches(batches: list[dict[str, np.ndarray]], path: Path) -> Path:
    """The calibration batches, as they are, in one .npz (``read_batches`` reads them back in a peer's venv)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{f"{i:05d}/{name}": array for i, batch in enumerate(batches) for name, array in batch.items()})
    return path


def read_batches(path: Path) -> list[dict[str, np.ndarray]]:
    """``write_batches``'s batches, in order."""
    batches: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            index, name = key.split("/", 1)
            batches.setdefault(int(index), {})[name] = data[key]
    return [batches[i] for i in sorted(batches)]


def write_modelopt_data(batches: list[dict[str, np.ndarray]], folder: Path) -> tuple[Path, str]:
    """The calibration samples as .npy (one input) or .npz, and the ``--calibration_shapes`` of one batch."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(batches[0])
    stacked = {name: np.concatenate([b[name] for b in batches]) for name in names}
    shapes = ",".join(f"{name}:{'x'.join(str(d) for d in batches[0][name].shape)}" for name in names)
    if len(names) == 1:
        path = folder / "calibration.npy"
        np.save(path, stacked[names[0]])
    else:
        path = folder / "calibration.npz"
        np.savez(path, **stacked)
    return path, shapes


def modelopt_command(model: Path, data: Path, shapes: str, method: str, out: Path) -> list[str]:
    """The ModelOpt ONNX PTQ command line (int8, CPU calibration, fp32 for what stays unquantized)."""
    return [
        str(MODELOPT_VENV.python),
        "-m",
        "modelopt.onnx.quantization",
        "--onnx_path",
        str(model),
        "--quantize_mode",
        "int8",
        "--calibration_method",
        method,
        "--calibration_data_path",
        str(data),
        "--calibration_shapes",
        shapes,
        "--calibration_eps",
        "cpu",
        "--high_precision_dtype",
        "fp32",
        "--output_path",
        str(out),
    ]


def nncf_command(
    model: Path, data: Path, out: Path, scorer: list[str] | None = None, max_drop: float = 1.0
) -> list[str]:
    """``nncf_peer.py`` in the NNCF venv: plain ``nncf.quantize``, or with ``scorer`` (the command of a
    ``scorer.py`` process that scores candidates on the evaluation split) ``quantize_with_accuracy_control``."""
    command = [str(NNCF_VENV.python), str(HERE / "nncf_peer.py"), str(model), str(data), str(out)]
    if scorer is None:
        return command
    return [*command, "--max-drop", str(max_drop), "--scorer", json.dumps(scorer)]


def aimet_command(model: Path, data: Path, out: Path, budget_s: float) -> list[str]:
    """``aimet_peer.py`` in the AIMET venv, finishing within ``budget_s`` (a plain model is made first)."""
    return [
        str(AIMET_VENV.python),
        str(HERE / "aimet_peer.py"),
        str(model),
        str(data),
        str(out),
        f"--budget-s={budget_s:.0f}",
    ]


def main() -> None:
    """CLI: ``ort CONFIG MODEL OUT --method M`` quantizes with ORT (run.py runs it in its own process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["ort"])
    parser.add_argument("config", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--method", choices=["minmax", "entropy"], required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    how = ort_quantize(args.config.resolve(), args.model.resolve(), args.out.resolve(), args.method)
    print(f"{NOTE_TAG} {how}")


if __name__ == "__main__":
    main()
