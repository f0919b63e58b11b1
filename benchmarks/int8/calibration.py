"""Entropy calibration cost: deploy_opt's streaming one-pass calibration vs ONNX Runtime's ``Entropy`` calibrater.

Not a test: run by hand. Both sides calibrate the same FP32 ONNX model on the same batches (2048 bins, 128
quantized bins) and the script prints one markdown table of wall time and peak RSS, for

* ``minilm``: all-MiniLM-L6-v2, real sentences tokenised in batches of 16, each batch padded to its own longest
  sentence (so the sequence length changes from batch to batch); tensors of MatMul and Gemm nodes;
* ``demo``: the 6x1024 MLP on sklearn digits (``pixels`` float32 [batch, 64]) in batches of 32; tensors of
  Conv, ConvTranspose, Gemm and MatMul nodes.

Rows, per model and sample count:

* ``deploy_opt entropy``: what ``build`` runs for entropy: ``calibrators.activations.collect.collect`` with a
  ``StreamingObserver`` (min/max and growing |x| histograms in one inference pass), then
  ``calibrators.activations.ranges.entropy_amax`` per tensor; timed from model load (tensor selection included) to
  thresholds.
* ``ORT entropy (one call)``: ORT's documented use, ``create_calibrator`` + one ``collect_data`` over every
  batch + ``compute_data``. ORT holds every activation until the end of ``collect_data``; with variable-length
  batches (MiniLM) ``np.asarray`` of them fails ("inhomogeneous shape") after all of them are held.
* ``ORT entropy (per batch)``: ORT's workaround, one ``collect_data`` call per batch (its histograms merge
  between calls), then ``compute_data``.

Each measurement runs in its own subprocess (a fresh interpreter: imports, data and model load are not timed)
with an address-space cap (``--mem-gb``) and a timeout; a failure is reported as ``crashed: <reason>`` or
``timeout``. Wall time covers the calibration only. Peak RSS is the worker's ``VmHWM`` (/proc/self/status),
not ``ru_maxrss``: on Linux a child's ``ru_maxrss`` starts at its parent's RSS at fork time and survives exec,
so every worker of this (torch-importing, 1.6 GB) parent would read at least 1.6 GB; after a hard kill the
parent's last poll of the worker's ``VmHWM`` is used. The growth is measured from the RSS after imports, data
and model load. ``--threads`` sets the ONNX Runtime threads of deploy_opt's collection (default 2); ORT's
calibrater uses ORT's default, one thread per core. A second table splits each wall time by phase; a third gives
the relative difference of the thresholds (our amax vs max(|lo|, |hi|) of ORT's) on the tensors both sides
calibrated; they differ by design (ORT: signed histogram, windows centred on 0, integer-truncated merges;
deploy_opt: TensorRT's EntropyCalibration2 on |x|).

The FP32 models come from ``deploy_opt build --profile ci`` into ``--reports`` (built here when missing).

    python -m benchmarks.int8.calibration                                   # both models, 128 and 1,280 samples
    python -m benchmarks.int8.calibration --models demo --samples 128 --timeout 120
    python -m benchmarks.int8.calibration --minilm-model /path/to/model.onnx --mem-gb 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.int8.calibration_worker import save_batches, status_mib, worker

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = {
    "minilm": {
        "config": REPO_ROOT / "deploy_opt" / "demo" / "minilm.yaml",
        "overrides": ["benchmark.enabled=false", "data.eval_samples=16"],
        "dir": "minilm",
        "op_types": ["MatMul", "Gemm"],
        "batch": 16,
    },
    "demo": {
        "config": None,  # the demo config (deploy_opt/demo/digits.yaml)
        "overrides": ["benchmark.enabled=false"],
        "dir": "digits-mlp",
        "op_types": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "batch": 32,
    },
}
METHODS = {
    "ours": "deploy_opt entropy",
    "ort-one": "ORT entropy (one call)",
    "ort-batch": "ORT entropy (per batch)",
}


# ----------------------------------------------------------------------------------------------- parent side


def _take(items, n: int):
    """The first ``n`` items, cycling from the start when there are fewer."""
    return [items[i % len(items)] for i in range(n)]


def make_batches(model: str, samples: int) -> tuple[list[dict[str, np.ndarray]], str]:
    """The calibration batches of ``model`` and a line saying where they come from."""
    size = MODELS[model]["batch"]
    if model == "minilm":
        from deploy_opt.demo.minilm import load_sentences, tokenize

        sentences = load_sentences()
        available, source = len(sentences), "real sentences"
        chosen = _take(sentences, samples)
        batches = [tokenize(chosen[i : i + size]) for i in range(0, samples, size)]
        lengths = sorted({b["input_ids"].shape[1] for b in batches})
        shape = f"padded seq len {lengths[0]}..{lengths[-1]} ({len(lengths)} distinct)"
    else:
        from sklearn.datasets import load_digits

        rows = (load_digits().data / 16).astype(np.float32)
        available, source = len(rows), "digit images"
        chosen = _take(list(rows), samples)
        batches = [{"pixels": np.stack(chosen[i : i + size])} for i in range(0, samples, size)]
        shape = "pixels [batch, 64]"
    note = f"REPEATED from the start ({samples - available:,} extra)" if samples > available else "no repetition"
    line = f"{model} @ {samples:,}: first {min(samples, available):,} of {available:,} {source}, {note}; "
    return batches, line + f"{len(batches)} batches of {size}, {shape}"


def ensure_model(model: str, given: Path | None, reports: Path) -> Path:
    """``given``, or the FP32 ONNX of ``deploy_opt build --profile ci`` under ``reports`` (built when missing)."""
    if given is not None:
        return given
    path = reports / MODELS[model]["dir"] / "model.onnx"
    if not path.exists():
        from deploy_opt.config.profiles import load_build_config
        from deploy_opt.pipeline.build import run_build

        print(f"# building {path} (deploy_opt build --profile ci) ...", file=sys.stderr, flush=True)
        config, profile = load_build_config(MODELS[model]["config"], "ci", MODELS[model]["overrides"])
        run_build(config, profile, reports, progress=False)
    return path


def _reason(stderr: str) -> str:
    """The one line of a worker's stderr that says why it failed (its last exception line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Fail)\w*\b", line)]
    text = (errors or lines or ["no message"])[-1]
    return text if len(text) <= 150 else f"{text[:60]} ... {text[-85:]}"


def run_worker(spec: dict, timeout: float) -> dict:
    """Run one measurement in a fresh interpreter; the result, or ``status`` saying how it failed."""
    result_path = Path(spec["result"])
    with open(spec["result"] + ".out", "w+") as out, open(spec["result"] + ".err", "w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.int8.calibration", "--worker", json.dumps(spec)],
            stdout=out,
            stderr=err,
            cwd=REPO_ROOT,
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        polled: list[float] = []
        stop = threading.Event()

        def poll() -> None:  # the worker's peak, in case it dies without reporting it
            while not stop.wait(0.05):
                peak = status_mib("VmHWM", proc.pid)
                if peak is not None:
                    polled.append(peak)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            stop.set()
            poller.join()
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if result.get("peak_mib") is None and polled:
        result["peak_mib"] = max(polled)  # polled every 50 ms: a lower bound on the true peak
    if timed_out.is_set():
        result["status"] = f"timeout ({timeout:.0f} s)"
    elif code < 0:
        result["status"] = f"crashed: killed by {signal.Signals(-code).name} after {elapsed:.0f} s"
    elif code != 0 or "wall_s" not in result:
        after = f" after {result['failed_after_s']:.1f} s" if "failed_after_s" in result else ""
        result["status"] = f"crashed{after}: {_reason(stderr)}"
    else:
        result["status"] = "ok"
    return result


def _relative(ours: dict[str, float], theirs: dict[str, float]) -> tuple[int, float, float, str] | None:
    """Common tensors, median and max of |ours - theirs| / |theirs|, and the tensor of the max."""
    common = sorted(set(ours) & set(theirs))
    if not common:
        return None
    diffs = {n: abs(ours[n] - theirs[n]) / max(abs(theirs[n]), 1e-12) for n in common}
    worst = max(diffs, key=diffs.__getitem__)
    return (
        len(common),
        statistics.median(diffs.values()),
        diffs[worst],
        f"{worst} ({ours[worst]:.4g} vs {theirs[worst]:.4g})",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--samples", nargs="+", type=int, default=[128, 1280])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    parser.add_argument("--mem-gb", type=float, default=12.0, help="address-space cap of each worker, GiB")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads of deploy_opt's collection")
    parser.add_argument("--reports", type=Path, default=Path("/tmp/bench_reports"), help="where models are built")
    parser.add_argument("--minilm-model", type=Path, help="FP32 ONNX of MiniLM (default: built under --reports)")
    parser.add_argument("--demo-model", type=Path, help="FP32 ONNX of the demo (default: built under --reports)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return

    rows, diffs, notes = [], [], []
    with tempfile.TemporaryDirectory(prefix="deploy_opt.bench.calib.") as tmp:
        for model in args.models:
            given = args.minilm_model if model == "minilm" else args.demo_model
            path = ensure_model(model, given, args.reports)
            for samples in args.samples:
                batches, line = make_batches(model, samples)
                notes.append(line)
                print(f"# {line}", file=sys.stderr, flush=True)
                data = Path(tmp) / f"{model}-{samples}.npz"
                save_batches(data, batches)
                results = {}
                for method in METHODS:
                    spec = {
                        "method": method,
                        "model": str(path),
                        "data": str(data),
                        "op_types": MODELS[model]["op_types"],
                        "threads": args.threads,
                        "mem_gb": args.mem_gb,
                        "result": str(Path(tmp) / f"{model}-{samples}-{method}.json"),
                    }
                    results[method] = result = run_worker(spec, args.timeout)
                    shown = f"{result['wall_s']:.1f} s" if result["status"] == "ok" else result["status"]
                    print(f"#   {METHODS[method]}: {shown}", file=sys.stderr, flush=True)
                rows.append((model, samples, results))
                ours = results["ours"].get("thresholds")
                for method in ("ort-one", "ort-batch"):
                    theirs = results[method].get("thresholds")
                    if ours and theirs:
                        diffs.append((model, samples, f"deploy_opt vs {METHODS[method]}", _relative(ours, theirs)))
                one, per = results["ort-one"].get("thresholds"), results["ort-batch"].get("thresholds")
                if one and per:
                    diffs.append((model, samples, "ORT per batch vs ORT one call", _relative(per, one)))
    print_tables(rows, diffs, notes, args)


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def print_tables(rows: list, diffs: list, notes: list[str], args: argparse.Namespace) -> None:
    print(f"\n{len(rows)} configurations; {args.threads} threads; cap {args.mem_gb:g} GiB, timeout {args.timeout:g} s")
    for line in notes:
        print(f"- {line}")
    print("\n| model | samples | method | tensors | wall s | peak RSS MiB | RSS growth MiB | speedup vs ORT |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for model, samples, results in rows:
        ours = results["ours"]
        ours_wall = ours.get("wall_s") if ours["status"] == "ok" else None
        reference = next((m for m in ("ort-one", "ort-batch") if results[m]["status"] == "ok"), None)
        for method, label in METHODS.items():
            r = results[method]
            ok = r["status"] == "ok"
            wall = r.get("wall_s") if ok else None
            # Calibrated (thresholds returned); after a failure, the number it had selected.
            tensors = len(r["thresholds"]) if ok else r.get("selected")
            peak = r.get("peak_mib")
            growth = peak - r["baseline_mib"] if peak is not None and "baseline_mib" in r else None
            peak_text = _num(peak, ",.0f") + ("" if ok or peak is None else " (at failure)")
            growth_text = _num(growth, ",.0f") + ("" if ok or growth is None else " (at failure)")
            if method == "ours":
                ref_wall = results[reference]["wall_s"] if reference else None
                speedup = f"{ref_wall / ours_wall:.1f}x vs {reference}" if ref_wall and ours_wall else "—"
            else:
                speedup = f"{wall / ours_wall:.1f}x" if wall and ours_wall else "—"
            wall_text = f"{wall:.2f}" if ok else r["status"]
            print(
                f"| {model} | {samples:,} | {label} | {_num(tensors, 'd')} | {wall_text} | {peak_text} "
                f"| {growth_text} | {speedup} |"
            )
    print(
        "\nspeedup: ORT wall / deploy_opt wall (on the deploy_opt row: against the one-call ORT run, or the "
        "per-batch one when that failed). Peak RSS: the worker's VmHWM; growth: peak minus the RSS after imports, data "
        "and model load."
    )
    print("\n| model | samples | method | time by phase, s |")
    print("|---|---:|---|---|")
    for model, samples, results in rows:
        for method, label in METHODS.items():
            phases = results[method].get("phases", {})
            shown = ", ".join(f"{name} {value:.2f}" for name, value in phases.items()) or "—"
            if results[method]["status"] != "ok":
                shown += " (then failed)"
            print(f"| {model} | {samples:,} | {label} | {shown} |")
    if diffs:
        print("\n| model | samples | A vs B | common tensors | median rel diff A/B | max rel diff | at (A vs B) |")
        print("|---|---:|---|---:|---:|---:|---|")
        for model, samples, what, stats in diffs:
            if stats is None:
                print(f"| {model} | {samples:,} | {what} | 0 | — | — | — |")
            else:
                common, median, worst, where = stats
                print(f"| {model} | {samples:,} | {what} | {common} | {median:.2%} | {worst:.2%} | {where} |")


if __name__ == "__main__":
    main()
