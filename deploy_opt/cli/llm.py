"""``quantize-llm`` and ``serve``: W4A16 checkpoints and lmdeploy."""

from __future__ import annotations

import argparse
from pathlib import Path

from dopt_common.errors import InputError


def cmd_quantize_llm(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import load_profile
    from deploy_opt.llm.config import flags_to_mapping, load_llm_config
    from deploy_opt.llm.pipeline import run_quantize_llm

    profile = load_profile(args.profile).sections if args.profile else None
    config = load_llm_config(args.config or args.config_flag, flags_to_mapping(args), profile)
    result = run_quantize_llm(config, args.output_dir, progress=not args.quiet)
    report = result.report
    ppl = report.perplexity
    print(
        f"quantized {config.model.path} with {report.method} → {result.out_dir}/: perplexity "
        f"{ppl.before:.3f} → {ppl.after:.3f} ({ppl.increase:+.1%}), stability {_stability_word(report.stable)}"
    )
    print(f"  scheme: {(report.scheme or {}).get('reason', '')}")
    if ppl.original.get("protocol"):
        print(f"  perplexity protocol: {ppl.original['protocol']}")
    if "reference_gptq" in report.sections:
        from deploy_opt.llm.reference_gptq import reference_line

        print(f"  {reference_line(report.sections['reference_gptq'])}")
    for line in result.gate.lines():
        print(f"  {line}")
    serve = report.serve or {}
    if serve.get("servable"):
        print(f"  serve: {' '.join(serve['command'])}")
    elif serve:
        print(f"  serve: refused: {serve['reason']}")
    return 0 if result.gate.passed else 1


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses

    from deploy_opt.config.loader import build_dataclass
    from deploy_opt.config.profiles import load_profile
    from deploy_opt.config.serve import ServeConfig
    from deploy_opt.llm.serve import check_host, launch, serve_command

    if not Path(args.checkpoint).is_dir():
        raise InputError(
            f"checkpoint '{args.checkpoint}' does not exist or is not a folder; pass quantize-llm's checkpoint/ folder"
        )
    section = (load_profile(args.profile).sections.get("serve") or {}) if args.profile else {}
    serve = build_dataclass(ServeConfig, section, "serve")
    keys = ("port", "tp", "backend", "session_len", "kv_cache")
    given = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
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


def _stability_word(stable: bool | None) -> str:
    return "not run" if stable is None else "ok" if stable else "FLAGGED"
