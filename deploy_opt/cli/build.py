"""``build``, ``sensitivity`` and ``profiles``: the INT8 build and its presets."""

from __future__ import annotations

import argparse


def cmd_build(args: argparse.Namespace) -> int:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build
    from deploy_opt.report.record import size_line

    config, profile = load_build_config(args.config, args.profile, args.overrides)
    result = run_build(config, profile, args.output_dir, progress=not args.quiet, wait=args.wait)
    build = result.build
    metrics = build["metrics"]
    fp32_ships = (build.get("quantization") or {}).get("quantized_nodes") == 0
    shipped = "shipped FP32 (no INT8 node)" if fp32_ships else "INT8"
    ci = metrics.get("drop_ci95")
    interval = f", 95% CI {ci[0]:.3f} to {ci[1]:.3f}" if ci else ""
    print(
        f"built {result.out_dir}/: {metrics['name']} ORT FP32 {metrics['ort_fp32']:.3f} → "
        f"{shipped} {metrics['ort_int8']:.3f} (drop {metrics['drop']:.3f}{interval}, {metrics['samples']} judged "
        "samples)"
    )
    if metrics.get("split"):
        print(f"  split: {metrics['split']}")
    print(f"  size: {size_line(build.get('artifacts') or {})}")
    if build.get("auto"):
        print(f"  auto: {build['auto']['verdict']}")
    qat = build.get("qat")
    if qat:
        print(f"  qat: {qat['shipped'] + ' ships; ' + qat['why'] if qat['ran'] else 'not run: ' + qat['why']}")
    for size, row in ((build.get("benchmark") or {}).get("batches") or {}).items():
        ci = row.get("speedup_ci95")
        print(
            f"  batch {size}: FP32 {row['ort_fp32']['median_ms']:.3f} ms, {shipped} "
            f"{row['ort_int8']['median_ms']:.3f} ms (medians), speedup {row['speedup']:.2f}x"
            + (f" (95% CI {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else "")
        )
    print("  stages: " + ", ".join(f"{k} {v:.0f} s" for k, v in (build.get("timings_s") or {}).items()))
    for line in result.gate.lines():
        print(f"  {line}")
    if result.kept is not None:
        print(
            f"  this build failed its gate: it is in {result.out_dir}/; the last passing build is kept in "
            f"{result.kept}/"
        )
    return 0 if result.gate.passed else 1


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.sensitivity.analyze import proxy_key
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.sensitivity import publish_sensitivity

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
