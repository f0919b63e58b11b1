"""``build``, ``sensitivity`` and ``profiles``: the INT8 build and its presets."""

from __future__ import annotations

import argparse


def cmd_build(args: argparse.Namespace) -> int:
    from deploy_opt.build.pipeline import run_build
    from deploy_opt.config.profiles import load_build_config

    config, profile = load_build_config(args.config, args.profile, args.overrides)
    result = run_build(config, profile, args.output_dir, progress=not args.quiet, wait=args.wait)
    metrics = result.build["metrics"]
    fp32_ships = (result.build.get("quantization") or {}).get("quantized_nodes") == 0
    shipped = "shipped FP32 (no INT8 node)" if fp32_ships else "INT8"
    print(
        f"built {result.out_dir}/: {metrics['name']} ORT FP32 {metrics['ort_fp32']:.3f} → "
        f"{shipped} {metrics['ort_int8']:.3f} (drop {metrics['drop']:.3f})"
    )
    if result.build.get("auto"):
        print(f"  auto: {result.build['auto']['verdict']}")
    qat = result.build.get("qat")
    if qat:
        print(f"  qat: {qat['shipped'] + ' ships; ' + qat['why'] if qat['ran'] else 'not run: ' + qat['why']}")
    for size, row in ((result.build.get("benchmark") or {}).get("batches") or {}).items():
        print(
            f"  batch {size}: FP32 {row['ort_fp32']['median_ms']:.3f} ms, {shipped} "
            f"{row['ort_int8']['median_ms']:.3f} ms, speedup {row['speedup']:.2f}x"
        )
    for line in result.gate.lines():
        print(f"  {line}")
    return 0 if result.gate.passed else 1


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.sensitivity.analyze import proxy_key
    from deploy_opt.analysis.sensitivity.publish import publish_sensitivity
    from deploy_opt.config.profiles import load_build_config

    overrides = ["sensitivity.enabled=true", "benchmark.enabled=false", *args.overrides]
    if args.mode:
        overrides.append(f"sensitivity.mode={args.mode}")
    config, profile = load_build_config(args.config or args.config_flag, args.profile, overrides)
    run = publish_sensitivity(config, profile, args.output_dir, progress=not args.quiet)
    record, build = run.record, run.record["build"]
    metric = record["metric"]
    print(
        f"sensitivity of {config.name} ({record['mode']}): {metric['name']} FP32 {build['ort_fp32']:.3f} → INT8 "
        f"{build['ort_int8']:.3f} on the build's {build['samples']} evaluation samples"
    )
    print(
        f"  on the subset of {metric['subset_samples']} samples: FP32 {metric['fp32']:.3f} → INT8 "
        f"{metric['int8']:.3f}; {record['resolution']['text']}"
    )
    for node in sorted(record["nodes"], key=lambda n: n["rank"])[:10]:
        drop = "n/a" if node["drop_both"] is None else f"{node['drop_both']:.3f}"
        print(
            f"  {node['rank']:>3}. {node['name']} ({node['op_type']}): drop {drop}, "
            f"proxy SQNR {proxy_key(node['proxy']):.1f} dB"
        )
    print(f"report: {run.out_dir}/sensitivity.html")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import list_profiles

    profiles = list_profiles()
    width = max(len(p.name) for p in profiles)
    for p in profiles:
        print(f"{p.name:<{width}}  {p.description}")
    return 0
