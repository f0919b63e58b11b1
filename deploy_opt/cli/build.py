"""``build``, ``sensitivity`` and ``profiles``: the INT8 build and its presets."""

from __future__ import annotations

import argparse


def cmd_build(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build
    from deploy_opt.report.outcome import outcome as outcome_of

    if len(args.config) > 1:
        return _build_several(args)
    config, profile = load_build_config(args.config[0] if args.config else None, args.profile, args.overrides)
    config = _with_scale_out(config, args)
    result = run_build(config, profile, args.output_dir, progress=not args.quiet, wait=args.wait)
    outcome = outcome_of(result.build)
    shipped = "shipped FP32 (no INT8 node)" if outcome.fp32_ships else "INT8"
    ci = outcome.drop_ci95
    interval = f", 95% CI {ci[0]:.3f} to {ci[1]:.3f}" if ci else ""
    print(
        f"built {result.out_dir}/: {outcome.metric} ORT FP32 {outcome.fp32_score:.3f} → {shipped} "
        f"{outcome.shipped_score:.3f} (drop {outcome.drop:.3f}{interval}, {outcome.samples} judged samples)"
    )
    if outcome.split:
        print(f"  split: {outcome.split}")
    print(f"  size: {outcome.size}")
    if outcome.auto_verdict:
        print(f"  auto: {outcome.auto_verdict}")
    if outcome.qat_line:
        print(f"  qat: {outcome.qat_line}")
    for row in outcome.batches:
        ci = row.speedup_ci95
        print(
            f"  batch {row.size}: FP32 {row.fp32_ms:.3f} ms, {shipped} {row.shipped_ms:.3f} ms (medians), speedup "
            f"{row.speedup:.2f}x" + (f" (95% CI {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else "")
        )
    print("  stages: " + ", ".join(f"{k} {v:.0f} s" for k, v in outcome.timings_s))
    for line in result.gate.lines():
        print(f"  {line}")
    if result.kept is not None:
        print(
            f"  this build failed its gate: it is in {result.out_dir}/; the last passing build is kept in "
            f"{result.kept}/"
        )
    return 0 if result.gate.passed else 1


def _build_several(args: argparse.Namespace) -> int:
    from deploy_opt.pipeline.fleet import FleetSettings, build_fleet, fleet_exit, fleet_table

    settings = FleetSettings(args.profile, tuple(args.overrides), args.output_dir.resolve(), args.wait)
    rows = build_fleet(list(args.config), settings, args.parallel, args.address, args.gpus_per_trial)
    print(fleet_table(rows))
    return fleet_exit(rows)


def _with_scale_out(config, args: argparse.Namespace):
    """The config with --parallel/--address/--gpus-per-trial in its sensitivity section (where they are used)."""
    import dataclasses

    scale = {"parallel": args.parallel, "address": args.address, "gpus_per_task": args.gpus_per_trial}
    return dataclasses.replace(config, sensitivity=dataclasses.replace(config.sensitivity, **scale))


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.sensitivity.analyze import proxy_key
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.sensitivity import publish_sensitivity

    overrides = ["sensitivity.enabled=true", "benchmark.enabled=false", *args.overrides]
    if args.mode:
        overrides.append(f"sensitivity.mode={args.mode}")
    config, profile = load_build_config(args.config or args.config_flag, args.profile, overrides)
    config = _with_scale_out(config, args)
    run = publish_sensitivity(config, profile, args.output_dir, progress=not args.quiet)
    record, build, metric = run.record, run.record.build or {}, run.record.metric
    print(
        f"sensitivity of {config.name} ({record.mode}): {metric.name} FP32 {build['ort_fp32']:.3f} → INT8 "
        f"{build['ort_int8']:.3f} on the build's {build['samples']} evaluation samples"
    )
    print(
        f"  on the subset of {metric.subset_samples} samples: FP32 {metric.fp32:.3f} → INT8 "
        f"{metric.int8:.3f}; {(record.resolution or {}).get('text', '')}"
    )
    for node in record.ranked()[:10]:
        drop = "n/a" if node.drop_both is None else f"{node.drop_both:.3f}"
        print(f"  {node.rank:>3}. {node.name} ({node.op_type}): drop {drop}, proxy SQNR {proxy_key(node.proxy):.1f} dB")
    print(f"report: {run.out_dir}/sensitivity.html")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from deploy_opt.cli.starter import write_starter
    from dopt_common.errors import InputError

    if not args.data:
        raise InputError("init: give the data too: a folder with calibration/ and evaluation/ splits, or two paths")
    made = write_starter(args.model, list(args.data), args.output, force=args.force)
    labels = "with labels" if made.labelled else "without labels"
    print(f"wrote {made.path}: {made.model_kind} model, {made.data_kind} data {labels}, metric {made.metric}")
    print(f"next: python -m deploy_opt build {made.path}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import list_profiles

    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for p in profiles:
        print(f"{p.name:<{width}}  {p.description}")
    return 0
