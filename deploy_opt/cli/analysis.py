"""``align``, ``scales`` and ``compat``: cross-backend alignment, scale-file conversion, compatibility."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dopt_common.errors import DeployOptError, OutputError


def cmd_align(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.align import verify_alignment
    from deploy_opt.report.trust import check_build_folder
    from dopt_common.errors import DeployOptError, ModelError, one_line
    from dopt_common.files import write_json
    from dopt_common.names import shown

    integrity = check_build_folder(args.build_dir)  # first: a damaged artifact may not even parse below
    intact = integrity is None or integrity.ok
    try:
        report = verify_alignment(args.build_dir)
    except Exception as exc:  # only once integrity named the damaged artifact; else unreadable: exit 2
        if intact:
            if isinstance(exc, DeployOptError):
                raise
            raise ModelError(
                f"align verify: an artifact in '{args.build_dir}' cannot be read ({type(exc).__name__}: "
                f"{shown(one_line(exc))}); fix: rebuild it (a build publishes whole, so it was damaged afterwards)"
            ) from exc
        report = None
        print(f"align: not checked, the artifacts fail integrity ({one_line(exc)})")
    if report is not None:
        for check in report.checks:
            print(check.line())
        print(f"align: {report.verdict}")
    for line in integrity.lines() if integrity else ["integrity: not checked (no build.json listing artifacts)"]:
        print(line)
    if args.json and report is not None:
        write_json(args.json, report.to_json() | ({"integrity": integrity.to_json()} if integrity else {}))
    return 0 if report is not None and report.ok and intact else 1


def cmd_scales(args: argparse.Namespace) -> int:
    from calibrators.scales.format import save_scale_file
    from deploy_opt.analysis.scale_interop import export_scales, exported_text, import_scales

    if args.scales_command == "import":
        _refuse_same_file(args.file, args.to)
        scales = import_scales(args.file, args.format)
        path = save_scale_file(scales, args.to)
        roles = sorted({t.role for t in scales.tensors.values()})
        print(f"imported {len(scales.tensors)} tensors ({', '.join(roles)}) from {args.file} → {path}")
        return 0
    if args.out is not None and str(args.out) == "-":  # standard output: the file's text alone
        sys.stdout.write(exported_text(args.file, args.format, trt_version=args.trt_version))
        return 0
    path = export_scales(args.file, args.format, args.out, trt_version=args.trt_version)
    print(f"exported {args.file} as {args.format} → {path}")
    return 0


def _refuse_same_file(source: Path, target: Path) -> None:
    """``scales import X --to X`` would replace the only copy of what it reads: refused before any write."""
    from dopt_common.names import shown

    try:
        same = source.samefile(target)
    except OSError:  # one of them does not exist (yet): compare the spellings
        same = source.resolve() == target.resolve()
    if same:
        raise OutputError(
            f"scales import: --to '{shown(str(target))}' is the input file itself, which the import would overwrite; "
            "fix: pass another path to --to, e.g. scales.json"
        )


def cmd_compat(args: argparse.Namespace) -> int:
    from deploy_opt.analysis.compat import check_compat
    from deploy_opt.analysis.compat_report import write_compat

    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    unknown = sorted(set(targets) - {"ort-cpu", "ort-cuda", "tensorrt"})
    if unknown:
        raise DeployOptError(f"compat --targets: unknown {unknown}; use ort-cpu, ort-cuda, tensorrt")
    report = check_compat(args.model, targets)
    json_path, md_path = write_compat(report, args.output_dir)
    for target, counts in report.summary.items():
        print(f"{target}: {dict(counts)}")
    print(f"report: {md_path} ({json_path.name})")
    return 0
