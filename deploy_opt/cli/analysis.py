"""``align``, ``scales`` and ``compat``: cross-backend alignment, scale-file conversion, compatibility."""

from __future__ import annotations

import argparse

from dopt_common.errors import DeployOptError


def cmd_align(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.align import verify_alignment
    from dopt_common.files import write_json

    report = verify_alignment(args.build_dir)
    for check in report.checks:
        print(check.line())
    print(f"align: {report.verdict}")
    if args.json:
        write_json(args.json, report.to_json())
    return 0 if report.ok else 1


def cmd_scales(args: argparse.Namespace) -> int:
    from calibrators.scales.format import save_scale_file
    from deploy_opt.analysis.scale_interop import export_scales, import_scales

    if args.scales_command == "import":
        scales = import_scales(args.file, args.format)
        path = save_scale_file(scales, args.to)
        roles = sorted({t.role for t in scales.tensors.values()})
        print(f"imported {len(scales.tensors)} tensors ({', '.join(roles)}) from {args.file} → {path}")
        return 0
    path = export_scales(args.file, args.format, args.out, trt_version=args.trt_version)
    print(f"exported {args.file} as {args.format} → {path}")
    return 0


def cmd_compat(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.compat import check_compat
    from deploy_opt.analysis.compat_report import write_compat

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
