"""The ``sensitivity`` command: its own folder, ``reports/<name>-sensitivity/``, never the build's.

The analysis needs the build's FP32 and Q/DQ models, so the command runs the build pipeline (benchmark off) into a
working folder inside its stage and keeps only the three sensitivity files; ``reports/<name>/`` is never written.
The page quotes the build's FP32 and INT8 figures beside the subset's: those of ``reports/<name>/build.json``
when that build has this config and these very models (so the page shows the figure ``build`` printed), else
those of the build this command ran, saying so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.analysis.sensitivity.heatmap import write_html
from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from deploy_opt.config.build import BuildConfig
from deploy_opt.config.profiles import Profile
from deploy_opt.pipeline.build import run_build
from dopt_common.files import ensure_writable_dir, write_json
from dopt_common.runs import staged_dir

log = logging.getLogger(__name__)
SUFFIX = "-sensitivity"
BUILD_KEYS = ("name", "samples", "reference", "ort_fp32", "ort_int8", "drop")
ARTIFACTS = ("model.onnx", "model.int8.onnx")  # a build that quotes its figures must have shipped these bytes


@dataclass(frozen=True)
class SensitivityRun:
    """Where the sensitivity report landed and its record (sensitivity.json)."""

    out_dir: Path
    record: SensitivityRecord  # its ``build`` holds the build figures it quotes


def sensitivity_dir(output_root: Path, name: str) -> Path:
    """``<output_root>/<name>-sensitivity``: beside the build's folder, never it."""
    return Path(output_root) / f"{name}{SUFFIX}"


def build_figures(published: dict[str, Any] | None, built: dict[str, Any], where: Path) -> dict[str, Any]:
    """The ``build`` section: the metric figures of ``published`` (build.json at ``where``) when it is the build of
    the same config and models as ``built`` (the build this command ran), else ``built``'s, with the reason."""
    reason = _differs(published, built)
    chosen = built if reason else published or {}
    figures = {key: (chosen.get("metrics") or {}).get(key) for key in BUILD_KEYS}
    if reason is None:
        return {**figures, "source": str(where)}
    log.info("sensitivity: quoting its own build's figures: %s", reason)
    return {**figures, "source": "the build this command ran (benchmark off)", "why": reason}


def _differs(published: dict[str, Any] | None, built: dict[str, Any]) -> str | None:
    """Why ``published`` is not the build of ``built``'s config and models, or None when it is."""
    if published is None:
        return "no build.json of this name to quote"
    if _settings(published) != _settings(built):
        return "build.json was built from another config"
    for artifact in ARTIFACTS:
        if _sha(published, artifact) is None or _sha(published, artifact) != _sha(built, artifact):
            return f"build.json's {artifact} is not the model analyzed here"
    return None


def _settings(build: dict[str, Any]) -> dict[str, Any]:
    """The build's resolved config less what the command sets itself and how many threads ran (neither changes a
    model or a figure), as build.json holds it (a JSON round trip: tuples become lists). ``runtime`` is left out as
    ``benchmark`` is: its threads were ``benchmark.threads`` before it existed, and build.json before it lacks it."""
    left_out = ("sensitivity", "benchmark", "runtime")
    settings = {k: v for k, v in (build.get("config") or {}).items() if k not in left_out}
    return json.loads(json.dumps(settings, default=str))


def _sha(build: dict[str, Any], artifact: str) -> str | None:
    entry = (build.get("artifacts") or {}).get(artifact)
    return entry.get("sha256") if isinstance(entry, dict) else None


def _read_build(path: Path) -> dict[str, Any] | None:
    """``path`` as a dict, or None when it is missing or unreadable (then the command's own build is quoted)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def publish_sensitivity(
    config: BuildConfig, profile: Profile, output_root: Path, progress: bool = True
) -> SensitivityRun:
    """Analyze ``config``'s model and publish sensitivity.json/.png/.html whole in ``<name>-sensitivity/``."""
    out_dir = sensitivity_dir(ensure_writable_dir(output_root), config.name)
    with staged_dir(out_dir, kind="sensitivity") as stage:
        built = run_build(config, profile, stage / ".build", progress=progress)  # a working folder: dropped
        analysis = json.loads((built.out_dir / "sensitivity.json").read_text(encoding="utf-8"))
        published = Path(output_root) / config.name / "build.json"
        figures = build_figures(_read_build(published), built.build.to_json(), published)
        record = dataclasses.replace(SensitivityRecord.from_json(analysis), build=figures)
        write_json(stage / "sensitivity.json", record.to_json())
        shutil.copyfile(built.out_dir / "sensitivity.png", stage / "sensitivity.png")
        write_html(record.to_json(), stage / "sensitivity.png", stage / "sensitivity.html")
    return SensitivityRun(out_dir, record)
