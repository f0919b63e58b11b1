"""Acceptance runs on five models nobody tuned for: build each with its bare config and print a table.

Each config names only ``name``, ``model`` and ``data``; everything else is the default profile's. For each
model this prepares what the config points at (trains the CNN's checkpoint, copies the packaged OCR model),
runs ``python -m deploy_opt build <yaml> --output-dir .cache/reports`` in a fresh process, and reads the
build's ``build.json``. A build that crashes is a row with its error; its full output is in
``.cache/logs/<model>.log``.

    python benchmarks/unseen/run.py                 # all five
    python benchmarks/unseen/run.py cnn textdir     # some of them
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
REPORTS = CACHE / "reports"
LOGS = CACHE / "logs"


@dataclass(frozen=True)
class Row:
    """One model's outcome, as printed in the table."""

    model: str
    metric: str = "-"
    fp32: str = "-"
    int8: str = "-"
    drop: str = "-"
    speedup_1: str = "-"
    speedup_max: str = "-"
    verdict: str = "-"
    wall_s: float = 0.0


def _prepare_cnn() -> None:
    if not (CACHE / "cnn.pt").is_file():
        _python(["cnn.py", "--train", str(CACHE / "cnn.pt")], LOGS / "cnn.train.log")


def _prepare_textdir() -> None:
    _python(["textdir.py", "--prepare"], LOGS / "textdir.prepare.log")


def _prepare_textrec() -> None:
    _python(["textrec.py", "--prepare"], LOGS / "textrec.prepare.log")


def _prepare_textdet() -> None:
    _python(["textdet.py", "--prepare"], LOGS / "textdet.prepare.log")


def _prepare_nothing() -> None:
    """The encoder reads its weights straight from the installed package."""


# model -> (config, report folder name, preparation step)
MODELS: dict[str, tuple[str, str, Callable[[], None]]] = {
    "cnn": ("cnn.yaml", "unseen-cnn", _prepare_cnn),
    "encoder": ("encoder.yaml", "unseen-encoder", _prepare_nothing),
    "textdir": ("textdir.yaml", "unseen-textdir", _prepare_textdir),
    "textrec": ("textrec.yaml", "unseen-textrec", _prepare_textrec),
    "textdet": ("textdet.yaml", "unseen-textdet", _prepare_textdet),
}


def _python(args: list[str], log: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in this folder; output goes to ``log``; a failure raises with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True, check=False)
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed ({done.returncode}); see {log}")
    return done


def _build(config: str, log: Path) -> tuple[int, str, float]:
    """Run one build; returns its exit code, its last stderr line and its wall time."""
    command = [sys.executable, "-m", "deploy_opt", "build", str(HERE / config), "--output-dir", str(REPORTS)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}", encoding="utf-8")
    errors = [line for line in done.stderr.splitlines() if line.startswith("deploy_opt build:")]
    return done.returncode, errors[-1] if errors else "", wall


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _row_from_report(model: str, report: dict[str, Any], verdict: str, wall: float) -> Row:
    metrics = report["metrics"]
    batches = report["benchmark"]["batches"]
    largest = max(batches, key=int) if batches else None
    return Row(
        model=model,
        metric=metrics["name"],
        fp32=_fmt(metrics.get("ort_fp32")),
        int8=_fmt(metrics.get("ort_int8")),
        drop=_fmt(metrics.get("drop")),
        speedup_1=_fmt(batches.get("1", {}).get("speedup"), ".2f") + "x",
        speedup_max=f"{_fmt(batches[largest].get('speedup'), '.2f')}x @{largest}" if largest else "-",
        verdict=verdict,
        wall_s=wall,
    )


def run_model(model: str) -> Row:
    """Prepare, build and summarise one model; a crash becomes a row, never an exception."""
    config, name, prepare = MODELS[model]
    try:
        prepare()
    except (RuntimeError, OSError) as exc:
        return Row(model, verdict=f"prepare failed: {exc}")
    report_dir = REPORTS / name
    # A crashed build leaves no report: never read the previous run's by mistake.
    shutil.rmtree(report_dir, ignore_errors=True)
    rc, error, wall = _build(config, LOGS / f"{model}.log")
    report_path = report_dir / "build.json"
    if rc not in (0, 1) or not report_path.is_file():
        return Row(model, verdict=f"crash (exit {rc}): {error or 'no build.json'}", wall_s=wall)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    failed = [c["name"] for c in report["gate"]["criteria"] if not c["passed"]]
    verdict = "PASS" if report["gate"]["passed"] else f"FAIL ({', '.join(failed)})"
    return _row_from_report(model, report, verdict, wall)


def format_table(rows: list[Row]) -> str:
    """A Markdown table of the rows."""
    head = "| model | metric | FP32 | INT8 | drop | speedup b1 | speedup max | gate | wall s |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        cells = [r.model, r.metric, r.fp32, r.int8, r.drop, r.speedup_1, r.speedup_max, r.verdict, f"{r.wall_s:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """CLI: build the named models (all by default) and print the results table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"any of {', '.join(MODELS)} (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    rows = []
    for model in args.models or list(MODELS):
        print(f"building {model} ...", file=sys.stderr, flush=True)
        rows.append(run_model(model))
        print(f"  {rows[-1].verdict} ({rows[-1].wall_s:.0f} s)", file=sys.stderr, flush=True)
    print(format_table(rows))


if __name__ == "__main__":
    main()
