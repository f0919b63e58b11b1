"""``python -m deploy_opt``: build, sensitivity, gate, align, scales, compat and profiles.

Exit codes: 0 success, 1 a gate failed, 2 bad input (one line on stderr naming what, which value and the fix),
3 an internal error (a bug; ``-v`` shows the traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dopt_common.errors import DeployOptError

log = logging.getLogger("deploy_opt")


def _parser() -> argparse.ArgumentParser:
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
    build.add_argument("config", nargs="?", help="build YAML (default: the digits demo, configs/digits.yaml)")
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

    sens = sub.add_parser(
        "sensitivity", parents=[common], help="rank every quantized node by the accuracy its INT8 costs (heatmap)"
    )
    sens.add_argument("config_flag", nargs="?", metavar="CONFIG", help="build YAML (default: the demo)")
    sens.add_argument("--config", dest="config", help="build YAML (same as the positional argument)")
    sens.add_argument("--profile", help="hardware preset from profiles/, or a path to one")
    sens.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    sens.add_argument("--mode", choices=["exhaustive", "proxy", "proxy+topk"], help="default: the config's")
    sens.add_argument("--output-dir", default="reports", type=Path, help="where reports/<name>/ goes")

    gate = sub.add_parser("gate", parents=[common], help="judge a build.json: exit 0 pass, 1 fail, 2 unusable report")
    gate.add_argument("build_json", type=Path, help="reports/<name>/build.json (or its folder)")
    gate.add_argument("--max-drop", type=float, help="largest allowed metric drop in points (default: the build's)")
    gate.add_argument("--min-speedup", type=float, help="smallest allowed INT8 speedup (default: the build's)")
    gate.add_argument("--speedup-batch", type=int, help="batch size whose speedup is gated (default: largest)")
    gate.add_argument("--junit", type=Path, help="also write a JUnit XML report here")
    gate.add_argument(
        "--max-ppl-increase", help="for a quantize_report.json: largest perplexity increase, e.g. 5%% (default: its)"
    )

    qllm = sub.add_parser(
        "quantize-llm", parents=[common], help="W4A16 GPTQ/AWQ/RTN (or torchao) with perplexity and stability checks"
    )
    qllm.add_argument("config_flag", nargs="?", metavar="CONFIG", help="llm YAML (default: SmolLM2, GPTQ)")
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
        "--backend", choices=["auto", "turbomind", "pytorch"], help="lmdeploy engine (auto: TurboMind if it accepts)"
    )
    serve.add_argument("--session-len", type=int, help="max context length (default: lmdeploy's)")
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
    est.add_argument("--optimizer", choices=["adamw", "lion", "sgd"], default="adamw")
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
    rec.add_argument("--json", action="store_true", help="print JSON instead of the lines")
    run = train_sub.add_parser("run", parents=[common], help="train with a train.yaml (int8 optimizer state)")
    run.add_argument("config_flag", nargs="?", metavar="CONFIG", help="train YAML (default: the digits CNN)")
    run.add_argument("--config", dest="config", help="train YAML (same as the positional argument)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    run.add_argument("--output-dir", type=Path, help="where checkpoints and train_log.jsonl go")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint there")

    sub.add_parser("profiles", parents=[common], help="list the hardware presets")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("onnx_ir", "onnxscript", "torch.onnx", "torch._dynamo", "torch.export"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING) if args.verbose else logging.ERROR)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        commands = {
            "build": _build,
            "sensitivity": _sensitivity,
            "gate": _gate,
            "align": _align,
            "scales": _scales,
            "compat": _compat,
            "quantize-llm": _quantize_llm,
            "serve": _serve,
            "train": _train,
            "profiles": _profiles,
        }
        return commands[args.command](args)
    except DeployOptError as exc:
        print(f"deploy_opt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, ours or in user code: never exit 1, which means "gate failed"
        log.debug("traceback", exc_info=True)
        print(
            f"deploy_opt {args.command}: internal error: {type(exc).__name__}: {exc} (rerun with -v for the traceback)",
            file=sys.stderr,
        )
        return 3


def _build(args: argparse.Namespace) -> int:
    from deploy_opt.pipeline import run_build
    from deploy_opt.profiles import load_build_config

    config, profile = load_build_config(args.config, args.profile, args.overrides)
    result = run_build(config, profile, args.output_dir, progress=not args.quiet)
    metrics = result.build["metrics"]
    print(
        f"built {result.out_dir}/: {metrics['name']} ORT FP32 {metrics['ort_fp32']:.3f} → "
        f"INT8 {metrics['ort_int8']:.3f} (drop {metrics['drop']:.3f})"
    )
    for size, row in ((result.build.get("benchmark") or {}).get("batches") or {}).items():
        print(
            f"  batch {size}: FP32 {row['ort_fp32']['median_ms']:.3f} ms, INT8 {row['ort_int8']['median_ms']:.3f} ms,"
            f" speedup {row['speedup']:.2f}x"
        )
    for line in result.gate.lines():
        print(f"  {line}")
    return 0 if result.gate.passed else 1


def _sensitivity(args: argparse.Namespace) -> int:
    from deploy_opt.pipeline import run_build
    from deploy_opt.profiles import load_build_config

    overrides = ["sensitivity.enabled=true", "benchmark.enabled=false", *args.overrides]
    if args.mode:
        overrides.append(f"sensitivity.mode={args.mode}")
    config, profile = load_build_config(args.config or args.config_flag, args.profile, overrides)
    result = run_build(config, profile, args.output_dir, progress=not args.quiet)
    from deploy_opt.sensitivity import proxy_key

    summary = result.build["sensitivity"]
    metric = summary["metric"]
    print(
        f"sensitivity of {config.name} ({summary['mode']}, {metric['subset_samples']} samples): {metric['name']} "
        f"FP32 {metric['fp32']:.3f}, INT8 {metric['int8']:.3f}"
    )
    for node in summary["top"]:
        drop = "n/a" if node["drop_both"] is None else f"{node['drop_both']:.3f}"
        print(
            f"  {node['rank']:>3}. {node['name']} ({node['op_type']}): drop {drop}, "
            f"proxy SQNR {proxy_key(node['proxy']):.1f} dB"
        )
    print(f"report: {result.out_dir}/sensitivity.html")
    return 0


def _gate(args: argparse.Namespace) -> int:
    from deploy_opt.gate import apply_gate, apply_ppl_gate, load_build, write_junit

    build = load_build(args.build_json)
    if "perplexity" in build:
        limit = args.max_ppl_increase or ((build.get("config") or {}).get("gate") or {}).get("max_ppl_increase")
        if limit is None:
            raise DeployOptError("gate: no criterion to check; pass --max-ppl-increase, e.g. 5%")
        result = apply_ppl_gate(build, limit)
        for line in result.lines():
            print(line)
        if args.junit:
            write_junit(result, args.junit, build.get("name", "quantize-llm"))
        return 0 if result.passed else 1
    configured = (build.get("config") or {}).get("gate") or {}
    max_drop = args.max_drop if args.max_drop is not None else configured.get("max_drop")
    min_speedup = args.min_speedup if args.min_speedup is not None else configured.get("min_speedup")
    batch = args.speedup_batch or configured.get("speedup_batch")
    result = apply_gate(build, max_drop, min_speedup, batch)
    if not result.criteria:
        raise DeployOptError("gate: no criterion to check; pass --max-drop and/or --min-speedup")
    for line in result.lines():
        print(line)
    if args.junit:
        write_junit(result, args.junit, build.get("name", "build"))
    return 0 if result.passed else 1


def _align(args: argparse.Namespace) -> int:
    from deploy_opt.align import verify_alignment
    from dopt_common.files import write_json

    report = verify_alignment(args.build_dir)
    for check in report.checks:
        print(check.line())
    print(f"align: {report.verdict}")
    if args.json:
        write_json(args.json, report.to_json())
    return 0 if report.ok else 1


def _scales(args: argparse.Namespace) -> int:
    from calibrators.scale_file import save_scale_file
    from deploy_opt.scale_interop import export_scales, import_scales

    if args.scales_command == "import":
        scales = import_scales(args.file, args.format)
        path = save_scale_file(scales, args.to)
        roles = sorted({t.role for t in scales.tensors.values()})
        print(f"imported {len(scales.tensors)} tensors ({', '.join(roles)}) from {args.file} → {path}")
        return 0
    path = export_scales(args.file, args.format, args.out, trt_version=args.trt_version)
    print(f"exported {args.file} as {args.format} → {path}")
    return 0


def _compat(args: argparse.Namespace) -> int:
    from deploy_opt.compat import check_compat, write_compat

    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    unknown = sorted(set(targets) - {"ort-cpu", "ort-cuda", "tensorrt"})
    if unknown:
        raise DeployOptError(f"compat --targets: unknown {unknown}; use ort-cpu, ort-cuda, tensorrt")
    report = check_compat(args.model, targets)
    json_path, md_path = write_compat(report, args.output_dir)
    for target, counts in (report.get("summary") or {}).items():
        print(f"{target}: {counts}")
    print(f"report: {md_path} ({json_path.name})")
    return 0


def _quantize_llm(args: argparse.Namespace) -> int:
    from deploy_opt.llm.config import flags_to_mapping, load_llm_config
    from deploy_opt.llm.pipeline import run_quantize_llm
    from deploy_opt.profiles import load_profile

    profile = load_profile(args.profile).sections if args.profile else None
    config = load_llm_config(args.config or args.config_flag, flags_to_mapping(args), profile)
    result = run_quantize_llm(config, args.output_dir, progress=not args.quiet)
    ppl = result.report["perplexity"]
    print(
        f"quantized {config.model.path} with {config.quantization.method} → {result.out_dir}/: perplexity "
        f"{ppl['original']['ppl']:.3f} → {ppl['quantized']['ppl']:.3f} ({ppl['increase']:+.1%}), "
        f"stability {'ok' if result.report['stability']['ok'] else 'FLAGGED'}"
    )
    for line in result.gate.lines():
        print(f"  {line}")
    if result.report.get("serve_command"):
        print(f"  serve: {' '.join(result.report['serve_command'])}")
    return 0 if result.gate.passed else 1


def _serve(args: argparse.Namespace) -> int:
    import dataclasses

    from deploy_opt.config import build_dataclass
    from deploy_opt.llm.config import ServeConfig
    from deploy_opt.llm.serve import check_host, launch, serve_command
    from deploy_opt.profiles import load_profile

    section = (load_profile(args.profile).sections.get("serve") or {}) if args.profile else {}
    serve = build_dataclass(ServeConfig, section, "serve")
    given = {k: getattr(args, k) for k in ("port", "tp", "backend", "session_len") if getattr(args, k) is not None}
    serve = dataclasses.replace(serve, **given)
    if args.dry_run:
        print(" ".join(serve_command(args.checkpoint, serve, args.lmdeploy)))
        return 0
    executable = check_host(args.lmdeploy, serve.tp)  # first: without a GPU nothing else matters
    command = serve_command(args.checkpoint, serve, executable)
    process = launch(command, serve.port, serve.ready_timeout_s)
    print(f"serving {args.checkpoint} at http://127.0.0.1:{serve.port}/v1 (OpenAI API); Ctrl-C stops it")
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return 0


def _train(args: argparse.Namespace) -> int:
    import json

    if args.train_command == "estimate":
        from deploy_opt.train.memory import estimate_memory, format_estimate, parse_count

        estimate = estimate_memory(
            parse_count(args.params),
            args.optimizer,
            args.state,
            args.param_dtype,
            shards=args.shards,
            block_size=args.block_size,
            shard=args.shard,
        )
        print(json.dumps(estimate.to_json(), indent=1) if args.json else format_estimate(estimate))
        return 0
    if args.train_command == "recommend":
        from deploy_opt.train.memory import parse_count
        from deploy_opt.train.recommend import format_recommendation, recommend

        if not args.verbose:  # the printed lines carry the reasons; the log copy is for training runs
            logging.getLogger("deploy_opt.train.recommend").setLevel(logging.WARNING)
        rec = recommend(args.model_type, parse_count(args.params), parse_count(args.samples), args.memory_gb)
        print(json.dumps(rec.to_json(), indent=1) if args.json else format_recommendation(rec))
        return 0
    from deploy_opt.profiles import REPO_ROOT
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    path = args.config or args.config_flag or REPO_ROOT / "configs" / "train_digits.yaml"
    config = load_train_config(path, args.overrides)
    result = train(config, args.output_dir, resume=args.resume, progress=not args.quiet)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in result.metrics.items())
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    print(
        f"trained {result.steps}/{result.total_steps} steps ({result.skipped_steps} skipped) in {result.seconds:.1f} s:"
        f" final loss {loss}; {metrics}; optimizer state {result.optimizer_state_bytes:,} bytes"
    )
    print(f"  log: {result.log}; checkpoint: {result.checkpoint}")
    return 0


def _profiles(args: argparse.Namespace) -> int:
    from deploy_opt.profiles import list_profiles

    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for p in profiles:
        print(f"{p.name:<{width}}  {p.description}")
    return 0
