"""The argument parser of ``deploy-opt`` / ``python -m deploy_opt``: every command and its flags (no heavy imports).

Flags that several commands share (the config, ``--profile``, ``--set``, ``--output-dir``, ``-v``/``-q``) are added
by one function each, so they read and behave the same everywhere; every command's ``--help`` ends with the exit
codes.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_CODES = """exit codes:
  0    success
  1    a gate failed (the report is written; see its verdict)
  2    bad input: one line on stderr naming what, which value and the fix
  3    an internal error (a bug; -v shows the traceback)
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: the previous report is left as it was"""
GATE_EXIT_CODES = """exit codes:
  0    the build passes
  1    it fails a criterion (each is listed), integrity included: a tampered, missing or unlisted artifact
  2    the report is unusable: unreadable, or not a build.json / quantize_report.json"""


def program_name(argv0: str | None = None) -> str:
    """What the user typed: ``deploy-opt`` for the console script, ``python -m deploy_opt`` for the module."""
    name = Path(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")).name
    return "python -m deploy_opt" if name in ("", "__main__.py", "-c", "-m") else name


def version() -> str:
    """``deploy_opt.__version__``, which pyproject.toml reads too (its one source)."""
    from deploy_opt import __version__

    return __version__


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog or program_name(),
        description="Turn a PyTorch or ONNX model into a verified INT8 deployment artifact.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # -v/-q work before or after the command; SUPPRESS keeps a subcommand's default from overwriting.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _add_verbosity(common)
    _add_verbosity(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    command = functools.partial(_command, common=common)
    _add_build_commands(sub, command)
    _add_llm_commands(sub, command)
    _add_artifact_commands(sub, command)
    train = command(sub, "train", "the training companion: int8 optimizers and their tools")
    _add_train_actions(train.add_subparsers(dest="train_command", metavar="ACTION", required=True), command)
    command(sub, "profiles", "list the hardware presets")
    return parser


SCALE_FORMATS = ["trt-cache", "aimet", "ort-overrides"]
Command = Callable[..., argparse.ArgumentParser]


def _add_scale_out(parser: argparse.ArgumentParser, what: str) -> None:
    """--parallel, --address and --gpus-per-trial: where the command's independent tasks run (Ray)."""
    parser.add_argument(
        "--parallel", type=int, default=1, help=f"{what} at once (> 1 runs them as Ray tasks; default 1, in-process)"
    )
    parser.add_argument("--address", help="a Ray cluster's address (default: a local Ray instance)")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per Ray task (default 0)")


def _add_build_commands(sub: argparse._SubParsersAction, command: Command) -> None:
    """build, sensitivity, gate and report."""
    init = command(sub, "init", "write a commented starter config from a model and its data (no Python needed)")
    init.add_argument("model", type=Path, help="an .onnx file or a local Hugging Face model folder")
    init.add_argument(
        "data",
        type=Path,
        nargs="*",
        help="a folder holding calibration/ and evaluation/ splits, or the two paths (.npz, image folder, .txt)",
    )
    init.add_argument("-o", "--output", type=Path, default=Path("deploy_opt.yaml"), help="default: deploy_opt.yaml")
    init.add_argument("--force", action="store_true", help="replace an existing config")

    build = command(sub, "build", "export, calibrate, quantize, verify, evaluate, benchmark and gate")
    build.add_argument(
        "config",
        nargs="*",
        help="build YAML or an example name (digits, minilm); default: digits. Several: each is built as its own "
        "task and one table is printed; the exit code is the worst build's",
    )
    _add_profile(build, "hardware preset from profiles/ (see 'profiles'), or a path to one")
    _add_overrides(build)
    _add_output_dir(build, "where reports/<name>/ goes")
    build.add_argument(
        "--wait", action="store_true", help="wait for another build of the same name to finish (default: fail at once)"
    )
    _add_scale_out(build, "builds (several configs) or sensitivity evaluations")

    sens = command(sub, "sensitivity", "rank every quantized node by the accuracy its INT8 costs (heatmap)")
    _add_config(sens, "build YAML (default: the demo)")
    _add_profile(sens, "hardware preset from profiles/, or a path to one")
    _add_overrides(sens)
    sens.add_argument("--mode", choices=["exhaustive", "proxy", "proxy+topk"], help="default: the config's")
    _add_scale_out(sens, "sensitivity evaluations")
    _add_output_dir(sens, "where reports/<name>-sensitivity/ goes (never <name>/)")

    gate = command(sub, "gate", "judge a build.json: exit 0 pass, 1 fail, 2 unusable report", GATE_EXIT_CODES)
    gate.add_argument("build_json", type=Path, help="reports/<name>/build.json (or its folder)")
    gate.add_argument(
        "--max-drop", type=_non_negative, help="largest allowed metric drop in points (default: the build's)"
    )
    gate.add_argument(
        "--min-speedup", type=_non_negative, help="smallest allowed INT8 speedup, >= 0 (default: the build's)"
    )
    gate.add_argument("--speedup-batch", type=int, help="batch size whose speedup is gated (default: largest)")
    gate.add_argument("--junit", type=Path, help="also write a JUnit XML report here ('-': standard output)")
    gate.add_argument(
        "--max-ppl-increase", help="for a quantize_report.json: largest perplexity increase, e.g. 5%% (default: its)"
    )

    rep = command(sub, "report", "(re)write report.html of a build, LLM, train or search folder")
    rep.add_argument("folder", type=Path, help="the run's output folder, e.g. reports/digits-mlp")


def _add_llm_commands(sub: argparse._SubParsersAction, command: Command) -> None:
    """quantize-llm and serve."""
    qllm = command(sub, "quantize-llm", "W4A16 GPTQ/AWQ/RTN (or torchao) with perplexity and stability checks")
    _add_config(qllm, "llm YAML (default: SmolLM2, method auto)")
    _add_profile(qllm, "hardware preset whose serve: section applies")
    _add_output_dir(qllm, "where reports/<name>/ goes")
    from deploy_opt.llm.config import add_flags

    add_flags(qllm)

    serve = command(sub, "serve", "serve a quantized checkpoint with lmdeploy (CUDA only)")
    serve.add_argument("checkpoint", type=Path, help="the checkpoint folder quantize-llm wrote")
    _add_profile(serve, "hardware preset whose serve: section applies (port, tp, backend)")
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


def _add_artifact_commands(sub: argparse._SubParsersAction, command: Command) -> None:
    """align, scales and compat: commands that read or convert a build's files."""
    align = command(sub, "align", "prove every artifact of a build carries scales.json")
    align_sub = align.add_subparsers(dest="align_command", metavar="ACTION", required=True)
    verify = command(align_sub, "verify", "read the scales back out of each artifact")
    verify.add_argument("build_dir", type=Path, help="reports/<name>/ (the folder holding scales.json)")
    verify.add_argument("--json", type=Path, help="also write the verdict as JSON here")

    scales = command(sub, "scales", "convert scale files: TensorRT cache, AIMET, ORT")
    scales_sub = scales.add_subparsers(dest="scales_command", metavar="ACTION", required=True)
    imp = command(scales_sub, "import", "a TensorRT cache, AIMET encodings or ORT overrides → scales.json")
    imp.add_argument("file", type=Path, help="the file another tool wrote")
    imp.add_argument("--to", type=Path, required=True, help="the scales.json to write")
    imp.add_argument("--format", choices=SCALE_FORMATS, help="default: detected")
    exp = command(scales_sub, "export", "scales.json → another tool's format")
    exp.add_argument("file", type=Path, help="a deploy_opt scales.json")
    exp.add_argument("--format", choices=SCALE_FORMATS, required=True)
    exp.add_argument("--out", type=Path, help="output path (default: next to the input; '-': standard output)")
    exp.add_argument("--trt-version", default="10.0.1", help="TensorRT version for the cache header")

    compat = command(sub, "compat", "per-node support on ORT CPU/CUDA and TensorRT")
    compat.add_argument("model", type=Path, help="an ONNX model")
    compat.add_argument(
        "--targets", default="ort-cpu,ort-cuda,tensorrt", help="comma-separated: ort-cpu, ort-cuda, tensorrt"
    )
    _add_output_dir(compat, "where compat.json and compat.md go", default=".")


def _command(
    group: argparse._SubParsersAction,
    name: str,
    help: str,
    epilog: str = EXIT_CODES,
    *,
    common: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    """A command (or an action of one) with the shared -v/-q flags and the exit codes under its --help."""
    return group.add_parser(
        name, parents=[common], help=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _add_train_actions(train_sub: argparse._SubParsersAction, command: Command) -> None:
    est = command(train_sub, "estimate", "training memory per device, by component")
    est.add_argument("--params", required=True, help="parameter count: 7e9, 7B, 125M")
    est.add_argument("--optimizer", choices=["adamw", "lion", "sgd", "sophia"], default="adamw")
    est.add_argument("--state", choices=["int8", "fp32"], default="int8", help="optimizer state precision")
    est.add_argument("--param-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    est.add_argument("--shards", type=int, default=1, help="data-parallel devices sharing the state (ZeRO)")
    est.add_argument("--shard", choices=["optimizer", "full"], default="optimizer", help="ZeRO-1 or FSDP")
    est.add_argument("--block-size", type=int, default=2048, help="int8 state block size")
    est.add_argument("--json", action="store_true", help="print JSON instead of the table")
    rec = command(train_sub, "recommend", "optimizer, LR range, schedule and state")
    rec.add_argument("--model-type", choices=["cnn", "mlp", "transformer", "llm"], required=True)
    rec.add_argument("--params", required=True, help="parameter count: 7e9, 7B, 125M")
    rec.add_argument("--samples", required=True, help="training samples: 50000, 1.2M")
    rec.add_argument("--memory-gb", type=float, required=True, help="memory per device")
    rec.add_argument("--seq-len", type=int, help="tokens per training sequence (long LLM pre-training: Sophia)")
    rec.add_argument("--json", action="store_true", help="print JSON instead of the lines")
    run = command(train_sub, "run", "train with a train.yaml (int8 optimizer state)")
    _add_config(run, "train YAML (default: the digits CNN)")
    _add_overrides(run)
    run.add_argument("--output-dir", type=Path, help="where checkpoints and train_log.jsonl go")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint there")
    search = command(train_sub, "search", "hyper-parameter search: a grid, then Optuna TPE; trials on Ray")
    _add_config(search, "train YAML (default: the digits CNN)")
    search.add_argument("--space", type=Path, help="search space YAML (default: deploy_opt.train.search.space)")
    search.add_argument("--trials", type=int, default=16, help="trials in all, both stages (default 16)")
    search.add_argument("--parallel", type=int, default=1, help="trials at once (> 1 runs them as Ray tasks)")
    search.add_argument("--address", help="a Ray cluster's address (default: a local Ray instance)")
    search.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial on Ray (default 0)")
    _add_output_dir(search, "parent of <name>-search/")
    search.add_argument("--name", help="run name (default: the config file's name)")
    _add_overrides(search)


def _add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, with module names")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")


def _add_config(parser: argparse.ArgumentParser, what: str) -> None:
    """The config file, as a positional argument or ``--config`` (both land in ``args.config``)."""
    parser.add_argument("config_flag", nargs="?", metavar="CONFIG", help=what)
    parser.add_argument("--config", dest="config", help=f"{what.split(' (')[0]} (same as the positional argument)")


def _add_profile(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--profile", help=what)


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config field, e.g. --set benchmark.threads=4 (repeatable)",
    )


def _add_output_dir(parser: argparse.ArgumentParser, what: str, default: str = "reports") -> None:
    parser.add_argument("--output-dir", default=Path(default), type=Path, help=f"{what} (default: {default})")


def _non_negative(text: str) -> float:
    """A finite number >= 0 (a gate threshold); argparse turns the ValueError into a usage error, exit 2."""
    value = float(text)
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value
