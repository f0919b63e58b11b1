"""``gate``: judge a build.json (and its artifacts) or a quantize_report.json (exit 0 pass, 1 fail, 2 unusable)."""

from __future__ import annotations

import argparse

from dopt_common.errors import DeployOptError, ReportError


def cmd_gate(args: argparse.Namespace) -> int:
    from deploy_opt.report.gate import apply_gate, apply_ppl_gate, load_build, write_junit
    from deploy_opt.report.llm_report import LLMReport
    from deploy_opt.report.outcome import gate_settings
    from deploy_opt.report.trust import trust_criteria, with_criterion

    build = load_build(args.build_json)
    if "perplexity" in build:
        limit = args.max_ppl_increase or gate_settings(build).max_ppl_increase
        if limit is None:
            raise DeployOptError("gate: no criterion to check; pass --max-ppl-increase, e.g. 5%")
        report = LLMReport.from_json(build)
        result = apply_ppl_gate(report, limit)
        for line in result.lines():
            print(line)
        if args.junit:
            write_junit(result, args.junit, report.name)
        return 0 if result.passed else 1
    configured = gate_settings(build)
    max_drop = args.max_drop if args.max_drop is not None else configured.max_drop
    min_speedup = args.min_speedup if args.min_speedup is not None else configured.min_speedup
    batch = args.speedup_batch or configured.speedup_batch
    if args.min_speedup is None and min_speedup is not None and not (build.get("benchmark") or {}).get("batches"):
        # The threshold came from the build's config, not a flag: advise on the build, not on dropping a flag.
        raise ReportError(
            f"gate: '{args.build_json}' has no benchmark (it was built with benchmark.enabled=false), so the "
            f"min_speedup {min_speedup} from its config (gate.min_speedup) cannot be judged; fix: rebuild with "
            "benchmark.enabled=true"
        )
    result = apply_gate(build, max_drop, min_speedup, batch, configured.allow_fp32)
    trusted = trust_criteria(args.build_json, build)  # alignment as recorded, integrity of the files checked now
    if not result.criteria and all(c.passed for c in trusted):
        raise DeployOptError("gate: no criterion to check; pass --max-drop and/or --min-speedup")
    for criterion in trusted:
        result = with_criterion(result, criterion)
    for line in result.lines():
        print(line)
    if args.junit:
        write_junit(result, args.junit, build.get("name", "build"))
    return 0 if result.passed else 1


def cmd_report(args: argparse.Namespace) -> int:
    from deploy_opt.report.folder_page import write_report_page

    print(write_report_page(args.folder))
    return 0
