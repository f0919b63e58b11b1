"""The argument parser of ``python -m deploy_opt``: every command and its flags (no heavy imports)."""

from __future__ import annotations

import argparse
from pathlib import Path


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy_opt",
        description="Turn a PyTorch or ONNX model into a verified INT8 deployment artifact.",
    )
    # -v/-q work before or after the command; SUPPRESS keeps a subcommand's default from overwriting.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    build = sub.add_parser(
        "build", parents=[common], help="export, calibrate, quantize, verify, evaluate, benchmark and gate"
    )
    build.add_argument("config", nargs="?", help="build YAML or an example name (digits, minilm); default: digits")
    build.add_argument("--profile", help="hardware preset from profiles/ (see 'profiles'), or a path to one")
    build.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config field, e.g. --set benchmark.threads=4 (repeatable)",
    )
    build.add_argument("--output-dir", default="reports", type=Path, help="where reports/<name>/ goes")
    build.add_argument(
        "--wait", action="store_true", help="wait for another build of the same name to finish (default: fail at once)"
    )

    sens = sub.add_parser(
        "sensitivity", parents=[common], help="rank every quantized node by the accuracy its INT8 costs (heatmap)"
    )
    sens.add_argument("config_flag", nargs="?", metavar="CONFIG", help="build YAML (default: the demo)")
    sens.add_argument("--config", dest="config", help="build YAML (same as the positional argument)")
    sens.add_argument("--profile", help="hardware preset from profiles/, or a path to one")
    sens.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    sens.add_argument("--mode", choices=["exhaustive", "proxy", "proxy+topk"], help="default: the config's")
    sens.add_argument(
        "--output-dir", default="reports", type=Path, help="where reports/<name>-sensitivity/ goes (never <name>/)"
    )

    gate = sub.add_parser("gate", parents=[common], help="judge a build.json: exit 0 pass, 1 fail, 2 unusable report")
    gate.add_argument("build_json", type=Path, help="reports/<name>/build.json (or its folder)")
    gate.add_argument("--max-drop", type=_non_negative,
                      help="largest allowed metric drop in points (default: the build's)")
    gate.add_argument("--min-speedup", type=_positive, help="smallest allowed INT8 speedup (default: the build's)")
    gate.add_argument("--speedup-batch", type=int, help="batch size whose speedup is gated (default: largest)")
    gate.add_argument("--junit", type=Path, help="also write a JUnit XML report here")
    gate.add_argument(
        "--max-ppl-increase", help="for a quantize_report.json: largest perplexity increase, e.g. 5%% (default: its)"
    )

    rep = sub.add_parser(
        "report", parents=[common], help="(re)write report.html of a build, LLM, train or search folder"
    )
    rep.add_argument("folder", type=Path, help="the run's output folder, e.g. reports/digits-mlp")

    qllm = sub.add_parser(
        "quantize-llm", parents=[common], help="W4A16 GPTQ/AWQ/RTN (or torchao) with perplexity and stability checks"
    )
    qllm.add_argument("config_flag", nargs="?", metavar="CONFIG", help="llm YAML (default: SmolLM2, method auto)")
    qllm.add_argument("--config", dest="config", help="llm YAML (same as the positional argument)")
    qllm.add_argument("--profile", help="hardware preset whose serve: section applies")
    qllm.add_argument("--output-dir", default="reports", type=Path, help="where reports/<name>/ goes")
    from deploy_opt.llm.config import add_flags

    add_flags(qllm)

    serve = sub.add_parser("serve", parents=[common], help="serve a quantized checkpoint with lmdeploy (CUDA only)")
    serve.add_argument("checkpoint", type=Path, help="the checkpoint folder quantize-llm wrote")
    serve.add_argument("--profile", help="hardware preset whose serve: section applies (port, tp, backend)")
    serve.add_argument("--port", type=int, help="server port (default: the profile's, else 23333)")
    serve.add_argument("--tp", type=int, help="tensor-parallel GPUs (default: the profile's, else 1)")
    serve.add_argument(
        "--backend",
        choices=["auto", "turbomind", "pytorch"],
        help="lmdeploy engine (auto: TurboMind if it serves the checkpoint, else the PyTorch engine)",
    )
    serve.add_argument("--session-len", type=int, help="max context length (default: lmdeploy's)")
    serve.add_argument(
        "--kv-cache", choices=["none", "int8", "int4"], help="quantize the KV cache (lmdeploy --quant-policy 8|4)"
    )
    serve.add_argument("--lmdeploy", default="lmdeploy", help="the lmdeploy executable (its own venv)")
    serve.add_argument("--dry-run", action="store_true", help="print the command and exit")

    align = sub.add_parser("align", parents=[common], help="prove every artifact of a build carries scales.json")
    align_sub = align.add_subparsers(dest="align_command", metavar="ACTION", required=True)
    verify = align_sub.add_parser("verify", parents=[common], help="read the scales back out of each artifact")
    verify.add_argument("build_dir", type=Path, help="reports/<name>/ (the folder holding scales.json)")
    verify.add_argument("--json", type=Path, help="also write the verdict as JSON here")

    scales = sub.add_parser("scales", parents=[common], help="convert scale files: TensorRT cache, AIMET, ORT")
    scales_sub = scales.add_subparsers(dest="scales_command", metavar="ACTION", required=True)
    imp = scales_sub.add_parser(
        "import", parents=[common], help="a TensorRT cache, AIMET encodings or ORT overrides → scales.json"
    )
    imp.add_argument("file", type=Path, help="the file another tool wrote")
    imp.add_argument("--to", type=Path, required=True, help="the scales.json to write")
    imp.add_argument("--format", choices=["trt-cache", "aimet", "ort-overrides"], help="default: detected")
    exp = scales_sub.add_parser("export", parents=[common], help="scales.json → another tool's format")
    exp.add_argument("file", type=Path, help="a deploy_opt scales.json")
    exp.add_argument("--format", choices=["trt-cache", "aimet", "ort-overrides"], required=True)
    exp.add_argument("--out", type=Path, help="output path (default: next to the input)")
    exp.add_argument("--trt-version", default="10.0.1", help="TensorRT version for the cache header")

    compat = sub.add_parser("compat", parents=[common], help="per-node support on ORT CPU/CUDA and TensorRT")
    compat.add_argument("model", type=Path, help="an ONNX model")
    compat.add_argument(
        "--targets", default="ort-cpu,ort-cuda,tensorrt", help="comma-separated: ort-cpu, ort-cuda, tensorrt"
    )
    compat.add_argument("--output-dir", type=Path, default=Path("."), help="where compat.json and compat.md go")

    train = sub.add_parser("train", parents=[common], help="the training companion: int8 optimizers and their tools")
    train_sub = train.add_subparsers(dest="train_command", metavar="ACTION", required=True)
    est = train_sub.add_parser("estimate", parents=[common], help="training memory per device, by component")
    est.add_argument("--params", required=True, help="parameter count: 7e9, 7B, 125M")
    est.add_argument("--optimizer", choices=["adamw", "lion", "sgd", "sophia"], default="adamw")
    est.add_argument("--state", choices=["int8", "fp32"], default="int8", help="optimizer state precision")
    est.add_argument("--param-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    est.add_argument("--shards", type=int, default=1, help="data-parallel devices sharing the state (ZeRO)")
    est.add_argument("--shard", choices=["optimizer", "full"], default="optimizer", help="ZeRO-1 or FSDP")
    est.add_argument("--block-size", type=int, default=2048, help="int8 state block size")
    est.add_argument("--json", action="store_true", help="print JSON instead of the table")
    rec = train_sub.add_parser("recommend", parents=[common], help="optimizer, LR range, schedule and state")
    rec.add_argument("--model-type", choices=["cnn", "mlp", "transformer", "llm"], required=True)
    rec.add_argument("--params", required=True, help="parameter count: 7e9, 7B, 125M")
    rec.add_argument("--samples", required=True, help="training samples: 50000, 1.2M")
    rec.add_argument("--memory-gb", type=float, required=True, help="memory per device")
    rec.add_argument("--seq-len", type=int, help="tokens per training sequence (long LLM pre-training: Sophia)")
    rec.add_argument("--json", action="store_true", help="print JSON instead of the lines")
    run = train_sub.add_parser("run", parents=[common], help="train with a train.yaml (int8 optimizer state)")
    run.add_argument("config_flag", nargs="?", metavar="CONFIG", help="train YAML (default: the digits CNN)")
    run.add_argument("--config", dest="config", help="train YAML (same as the positional argument)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    run.add_argument("--output-dir", type=Path, help="where checkpoints and train_log.jsonl go")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint there")
    search = train_sub.add_parser(
        "search", parents=[common], help="hyper-parameter search: a grid, then Optuna TPE; trials on Ray"
    )
    search.add_argument("config_flag", nargs="?", metavar="CONFIG", help="train YAML (default: the digits CNN)")
    search.add_argument("--config", dest="config", help="train YAML (same as the positional argument)")
    search.add_argument("--space", type=Path, help="search space YAML (default: deploy_opt.train.search.space)")
    search.add_argument("--trials", type=int, default=16, help="trials in all, both stages (default 16)")
    search.add_argument("--parallel", type=int, default=1, help="trials at once (> 1 runs them as Ray tasks)")
    search.add_argument("--address", help="a Ray cluster's address (default: a local Ray instance)")
    search.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial on Ray (default 0)")
    search.add_argument("--output-dir", type=Path, default=Path("reports"), help="parent of <name>-search/")
    search.add_argument("--name", help="run name (default: the config file's name)")
    search.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")

    sub.add_parser("profiles", parents=[common], help="list the hardware presets")
    return parser


def _non_negative(text: str) -> float:
    """A finite number >= 0 (a gate threshold); argparse turns the ValueError into a usage error, exit 2."""
    value = float(text)
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _positive(text: str) -> float:
    """A finite number > 0."""
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value
