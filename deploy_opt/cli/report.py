"""``gate``: judge a build.json (and its artifacts) or a quantize_report.json (exit 0 pass, 1 fail, 2 unusable)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from dopt_common.errors import DeployOptError

if TYPE_CHECKING:
    from deploy_opt.report.gate import GateResult

STDOUT = "-"  # --junit - writes the XML to standard output (and the criteria lines to standard error)


def cmd_gate(args: argparse.Namespace) -> int:
    from deploy_opt.report.build_record import BuildRecord
    from deploy_opt.report.gate import apply_gate, apply_ppl_gate, load_build
    from deploy_opt.report.llm_report import LLMReport
    from deploy_opt.report.outcome import GateSettings, gate_settings
    from deploy_opt.report.trust import trust_criteria, with_criterion

    build = load_build(args.build_json)
    if "perplexity" in build:
        limit = args.max_ppl_increase or gate_settings(build).max_ppl_increase
        if limit is None:
            raise DeployOptError("gate: no criterion to check; pass --max-ppl-increase, e.g. 5%")
        report = LLMReport.from_json(build)
        return _show(apply_ppl_gate(report, limit), args.junit, report.name)
    configured = gate_settings(build)
    max_drop = args.max_drop if args.max_drop is not None else configured.max_drop
    min_speedup = args.min_speedup if args.min_speedup is not None else configured.min_speedup
    batch = args.speedup_batch or configured.speedup_batch
    # A build without a benchmark gets "speed not measured" (not judged), as its own gate left speed out, whether
    # min_speedup comes from the config or the command line: the issue says so (gate judges any build it reads).
    thresholds = GateSettings(max_drop, min_speedup, batch, configured.allow_fp32)
    result = apply_gate(BuildRecord.from_json(build), thresholds)
    trusted = trust_criteria(args.build_json, build)  # alignment as recorded, integrity of the files checked now
    if not result.criteria and all(c.passed for c in trusted):
        raise DeployOptError("gate: no criterion to check; pass --max-drop and/or --min-speedup")
    for criterion in trusted:
        result = with_criterion(result, criterion)
    return _show(result, args.junit, build.get("name", "build"))


def _show(result: GateResult, junit: object, suite: str) -> int:
    """Print the criteria and the verdict, write the JUnit report if asked; the exit code (0 pass, 1 fail)."""
    from deploy_opt.report.gate import junit_xml, write_junit

    to_stdout = junit is not None and str(junit) == STDOUT
    for line in result.lines():
        print(line, file=sys.stderr if to_stdout else sys.stdout)
    if to_stdout:
        sys.stdout.write(junit_xml(result, suite))
    elif junit:
        write_junit(result, junit, suite)
    return 0 if result.passed else 1


def cmd_report(args: argparse.Namespace) -> int:
    from deploy_opt.report.folder_page import write_report_page

    print(write_report_page(args.folder))
    return 0
