"""The gate criteria that no metric measures: the artifacts are what the build wrote (``integrity``) and they
carry scales.json bit for bit (``alignment``). ``apply_gate`` judges the numbers; these are added beside it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from deploy_opt.report.gate import Criterion, GateResult, load_build
from deploy_opt.report.integrity import IntegrityReport, check_integrity
from deploy_opt.report.manifest import is_build_folder


def integrity_criterion(report: IntegrityReport) -> Criterion:
    """'integrity': fails when any artifact build.json lists is missing, unreadable or changed."""
    return Criterion("integrity", float(len(report.problems)), 0.0, report.ok, f"integrity: {report.summary()}")


def alignment_criterion(ok: bool, verdict: str) -> Criterion:
    """'alignment': fails when ``align verify`` found an artifact that disagrees with scales.json."""
    return Criterion("alignment", 0.0 if ok else 1.0, 0.0, ok, f"align verify: {verdict}")


def recorded_alignment(build: dict[str, Any]) -> Criterion | None:
    """The 'alignment' criterion from build.json's recorded align verdict; None when none was recorded."""
    verdict = (build.get("alignment") or {}).get("verdict")
    if not isinstance(verdict, str):
        return None
    recorded = alignment_criterion(not verdict.startswith("FAIL"), verdict)
    return dataclasses.replace(recorded, text=f"align verify, as the build recorded it: {verdict}")


def with_criterion(result: GateResult, criterion: Criterion) -> GateResult:
    """``result`` with one more criterion; it passes only when both did."""
    return GateResult(result.passed and criterion.passed, (*result.criteria, criterion))


def check_build_folder(path: str | Path) -> IntegrityReport | None:
    """Integrity of a build folder (or its build.json); None without a build.json, or for a report written by
    hand alone in its folder (``manifest.is_build_folder``)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if not (folder / "build.json").is_file():
        return None
    build = load_build(folder / "build.json")
    return check_integrity(folder, build) if is_build_folder(folder, build) else None


def trust_criteria(path: str | Path, build: dict[str, Any]) -> tuple[Criterion, ...]:
    """For ``gate``: 'alignment' as build.json recorded it, and 'integrity' checked now (of any build folder)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    found = [recorded_alignment(build)]
    if is_build_folder(folder, build):
        found.append(integrity_criterion(check_integrity(folder, build)))
    return tuple(c for c in found if c is not None)
