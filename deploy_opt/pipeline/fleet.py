"""``build a.yaml b.yaml c.yaml``: several builds, each its own task, one summary table, the worst verdict.

Each config is a whole ``run_build`` in a task (``dopt_common/executor.py``): in this process one after another
(``--parallel 1`` without Ray), or as Ray tasks with one CPU each on a local instance (``--parallel N``) or a
cluster (``--address``). On a cluster the configs, their data and the output folder must be on storage every node
sees. A build that fails with a deploy_opt error is a row with exit 2; the others still run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetSettings:
    """What every build of the fleet shares: the profile and overrides, the output root and --wait."""

    profile: str | None
    overrides: tuple[str, ...]
    output_dir: Path
    wait: bool = False


@dataclass(frozen=True)
class FleetRow:
    """One build's line in the table: exit 0 pass, 1 gate failed, 2 could not build (``error`` says why)."""

    config: str
    name: str
    metric: str = ""
    drop: float | None = None
    speedup: float | None = None
    verdict: str = ""
    path: str = ""
    exit_code: int = 2
    error: str = ""


def build_one(settings: FleetSettings, config_path: str) -> FleetRow:
    """Build one config (in a worker or here) and summarise it; a deploy_opt error becomes an exit-2 row."""
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build
    from deploy_opt.report.outcome import outcome as outcome_of
    from dopt_common.errors import DeployOptError

    try:
        config, profile = load_build_config(config_path, settings.profile, list(settings.overrides))
        result = run_build(config, profile, settings.output_dir, progress=False, wait=settings.wait)
    except DeployOptError as exc:
        return FleetRow(config=config_path, name=Path(config_path).stem, error=f"{Path(config_path).name}: {exc}")
    outcome = outcome_of(result.build)
    speedup = outcome.batches[0].speedup if outcome.batches else None
    return FleetRow(
        config=config_path,
        name=outcome.name,
        metric=outcome.metric,
        drop=outcome.drop,
        speedup=speedup,
        verdict=result.gate.verdict,
        path=str(result.out_dir),
        exit_code=0 if result.gate.passed else 1,
    )


def build_fleet(
    paths: list[str], settings: FleetSettings, parallel: int, address: str | None, gpus_per_build: float = 0.0
) -> list[FleetRow]:
    """Every config built as its own task; rows in the order the configs were given."""
    from dopt_common.errors import InputError
    from dopt_common.executor import make_executor, scatter

    if len(set(paths)) != len(paths):
        raise InputError("build: a config is given twice; fix: name each config once")
    executor = make_executor(parallel, address, gpus_per_build)
    absolute = [str(Path(p).resolve()) if Path(p).exists() else p for p in paths]  # workers may run elsewhere
    try:
        return scatter(executor, build_one, settings, absolute)
    finally:
        executor.close()


def fleet_table(rows: list[FleetRow]) -> str:
    """The summary as a markdown table: config, metric, drop, speedup, verdict, path."""
    lines = ["| build | metric | drop | speedup | verdict | path |", "|---|---|---:|---:|---|---|"]
    for row in rows:
        drop = "-" if row.drop is None else f"{row.drop:.3f}"
        speedup = "-" if row.speedup is None else f"{row.speedup:.2f}x"
        verdict = row.verdict or f"ERROR: {row.error}"
        lines.append(f"| {row.name} | {row.metric or '-'} | {drop} | {speedup} | {verdict} | {row.path or '-'} |")
    return "\n".join(lines)


def fleet_exit(rows: list[FleetRow]) -> int:
    """The worst exit code of the fleet: 2 if any build could not run, else 1 if any gate failed, else 0."""
    return max(row.exit_code for row in rows)
