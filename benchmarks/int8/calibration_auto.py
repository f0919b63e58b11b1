"""The cost of ``calibration.method: auto`` on one build config: collection, then the propagated-error choice.

Not a test: run by hand, on an idle machine. For the config's calibration sample it times, in this process,
``calibrate_activations`` with the method ``auto`` over every tensor the widest search candidate quantizes
(``outputs+chain``), and splits the time into the streaming collection pass and the range choice, which runs
``AUTO_SAMPLES`` samples through the torch evaluator with Hutchinson probes (both schemes in one pass).
Each phase is given per tensor × sample, the unit in which it is linear, and again with the choice run on half
the samples, so the table shows the scaling rather than asserting it.

    python benchmarks/int8/calibration_auto.py benchmarks/corpus/yolo-nudenet.yaml  # after run.py --prepare-only
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import re
import time
from pathlib import Path

from deploy_opt.autotune.candidates import Candidate, configured
from deploy_opt.config.profiles import load_build_config
from deploy_opt.config.setup import QuantSetup
from deploy_opt.stages import calibrate
from deploy_opt.stages.inputs import load_inputs


def cpu_flags() -> str:
    """The CPU model and whether it has AVX2 and AVX-512 VNNI (int8 speed depends on them)."""
    text = Path("/proc/cpuinfo").read_text(encoding="utf-8") if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.+)", text)
    flags = set(re.search(r"flags\s*:\s*(.+)", text).group(1).split()) if "flags" in text else set()
    wanted = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags]
    return f"{model.group(1) if model else platform.processor()} ({', '.join(wanted) or 'no AVX2'})"


def timed_calibration(config_path: Path, samples: int) -> tuple[float, float, int, int]:
    """(collection s, choice s, tensors, calibration samples) with the choice run on ``samples`` samples."""
    config, _ = load_build_config(config_path, None, [])
    config = dataclasses.replace(config, calibration=dataclasses.replace(config.calibration, method="auto"))
    setup = configured(QuantSetup.of(config), Candidate("outputs", config.quantization.activations, None, (), "chain"))
    inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
    fp32 = Path(config.base_dir) / str(config.model.onnx)
    calibrate.AUTO_SAMPLES = samples
    choose = calibrate.scheme_noise
    spent = {"choice": 0.0}

    def timed_choose(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the same call, timed
        started = time.perf_counter()
        try:
            return choose(*args, **kwargs)
        finally:
            spent["choice"] += time.perf_counter() - started

    calibrate.scheme_noise = timed_choose
    try:
        started = time.perf_counter()
        ranges = calibrate.calibrate_activations(setup, fp32, inputs.calibration)
        total = time.perf_counter() - started
    finally:
        calibrate.scheme_noise = choose
    return total - spent["choice"], spent["choice"], len(ranges.chosen), ranges.samples


def main() -> None:
    """Print one markdown table: the choice on AUTO_SAMPLES and on half as many samples."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="a build config whose model is an ONNX file")
    args = parser.parse_args()
    print(f"CPU: {cpu_flags()}\n")
    print("| choice samples | tensors | collection s (all samples) | choice s | choice ms per tensor × sample |")
    print("|---:|---:|---:|---:|---:|")
    for samples in (calibrate.AUTO_SAMPLES, calibrate.AUTO_SAMPLES // 2):
        collection, choice, tensors, calibrated = timed_calibration(args.config, samples)
        per = 1000 * choice / max(tensors * samples, 1)
        print(f"| {samples} | {tensors} | {collection:.1f} ({calibrated}) | {choice:.1f} | {per:.2f} |")


if __name__ == "__main__":
    main()
