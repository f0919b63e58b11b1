"""``train search`` end to end: config → plan → trials (Ray or in-process) → report.

    python -m deploy_opt train search --config train.yaml --trials 16 --parallel 2

The output folder is ``<output-dir>/<name>-search/`` (name: the config file's stem). Run the same command again
after a kill and it resumes: ended trials stay, running ones continue from their last rung.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.loader import merge, parse_override, read_yaml
from deploy_opt.train.config import build_train_config
from deploy_opt.train.data import batch_size_of, load_train_data
from deploy_opt.train.loop import count_train_steps
from deploy_opt.train.search.plan import fixed_specs, recommended_spec
from deploy_opt.train.search.report import full_length_best, trial_rows, write_report
from deploy_opt.train.search.run import Job, execute, open_studies
from deploy_opt.train.search.space import SearchSpace
from deploy_opt.train.search.stage2 import TpeSampling
from dopt_common.errors import ConfigError, OutputError
from dopt_common.files import ensure_writable_dir
from dopt_common.names import run_dir
from dopt_common.runs import report_lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchRequest:
    """What ``train search`` was asked: config, space, trial counts and where to run."""

    config: Path
    overrides: tuple[str, ...]
    space: SearchSpace
    trials: int
    parallel: int
    address: str | None
    gpus_per_trial: float
    output_dir: Path
    name: str | None


@dataclass(frozen=True)
class SearchResult:
    """Where the report is, the best and default trials, and how many trials were reused from an earlier run."""

    folder: Path
    best: dict[str, Any] | None
    default: dict[str, Any] | None
    trials: int
    reused: int
    seconds: float
    paths: dict[str, Path]


def run_search(request: SearchRequest) -> SearchResult:
    """Plan, run (or resume) and report one search."""
    started = time.perf_counter()
    if request.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {request.trials}")
    base = read_yaml(request.config, "training config")
    for text in request.overrides:
        base = merge(base, parse_override(text))
    base_dir = str(request.config.resolve().parent)
    config = build_train_config(base, base_dir)
    data = load_train_data(config.data, config.batch_size, config.seed, config.base_dir)
    steps = count_train_steps(config, data)
    samples = sum(batch_size_of(target, inputs) for inputs, target in data.train(0))
    recommended = recommended_spec(config, samples, _memory_gb(config), steps)
    fixed = fixed_specs(config, recommended, request.space.stage1, steps)
    tpe_count = request.trials - len(fixed)
    if tpe_count < 1:
        raise ConfigError(
            f"--trials {request.trials} leaves no stage-2 trial: trial 0/1 and the {len(fixed) - 1}-cell grid take "
            f"{len(fixed)}; fix: --trials {len(fixed) + 4} or more, or a smaller grid in --space"
        )
    name = f"{request.name or request.config.stem}-search"
    folder = ensure_writable_dir(run_dir(request.output_dir, name, "--name"))
    job = Job(folder, base, base_dir, request.parallel, request.address, request.gpus_per_trial)
    with report_lock(folder):
        studies = open_studies(folder, request.space)
        _check_same_search(studies["fixed"], base, request, folder)
        sampling = TpeSampling(request.space.stage2, steps, studies["fixed"], config.optimizer.state)
        reused = execute(job, studies, fixed, sampling, tpe_count)
        rows = trial_rows(studies)
        summary = _summary(request, rows, steps, recommended, fixed, sampling, time.perf_counter() - started)
        threads = 1 if request.parallel > 1 or request.address else None
        paths = write_report(folder, summary, base, threads)
    return SearchResult(
        folder, summary["best"], summary["default"], len(rows), reused, time.perf_counter() - started, paths
    )


def _check_same_search(study: Any, base: dict[str, Any], request: SearchRequest, folder: Path) -> None:
    """A folder holds one search: resuming with another config or space would mix two searches' trials."""
    key = {"config": base, "space": request.space.to_dict(), "trials": request.trials}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    saved = study.user_attrs.get("search")
    if saved is None:
        study.set_user_attr("search", digest)
    elif saved != digest:
        raise OutputError(
            f"'{folder}' holds a search with another config, space or --trials; fix: rerun with the same ones to "
            "resume it, pick another --name, or delete the folder"
        )
    else:
        log.info("resuming the search in %s", folder)


def _summary(
    request: SearchRequest,
    rows: list[dict[str, Any]],
    steps: int,
    recommended: Any,
    fixed: list[Any],
    sampling: TpeSampling,
    seconds: float,
) -> dict[str, Any]:
    # The config as given; when it equals the recommender's choice, that one trial (0) is both.
    default_number = next((s.number for s in fixed if s.stage == "default"), 0)
    by_number = {r["number"]: r for r in rows}
    states = [r["state"] for r in rows]
    return {
        "name": request.name or request.config.stem,
        "config": str(request.config),
        "space": request.space.to_dict(),
        "steps": steps,
        "trials_total": request.trials,
        "parallel": request.parallel,
        "address": request.address,
        "seconds": seconds,
        "completed": states.count("complete"),
        "pruned": states.count("pruned"),
        "failed": states.count("fail"),
        "reasons": [list(pair) for pair in recommended.reasons] if recommended is not None else [],
        "stage1_winner": sampling.winner,
        "default_number": default_number,
        "default": by_number.get(default_number),
        "best": full_length_best(rows, steps),
        "trials": rows,
    }


def _memory_gb(config: Any) -> float:
    from deploy_opt.train.loop import machine_memory_gb

    return config.memory_gb or machine_memory_gb()
