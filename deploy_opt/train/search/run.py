"""The search driver: hand out parameter sets, collect segment results, tell Optuna, prune, resume.

Three Optuna studies share one SQLite file in the output folder: ``fixed`` (trial 0/1 and the grid, whose
parameters are set, not sampled), and ``tpe`` (stage 2). Each trial carries its deploy_opt number, stage and
parameters as user attributes, and its curve and metrics once it ends. A rerun of the same command opens the
same file: ended trials are kept as they are, a trial that was running continues from its last rung's
checkpoint, and only what is missing runs.
"""

from __future__ import annotations

import logging
import math
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.train.search.space import SearchSpace
from deploy_opt.train.search.trial import TrialSpec, recent_loss, run_segment, steps_to_converge, trial_config
from dopt_common.deps import require
from dopt_common.errors import OutputError, one_line
from dopt_common.executor import make_executor
from dopt_common.files import regular_input
from dopt_common.names import shown

log = logging.getLogger(__name__)

STORAGE_NAME = "search.db"


@dataclass(frozen=True)
class Job:
    """Where the search runs: the executor's settings and the folder."""

    folder: Path
    base: dict[str, Any]  # the user's YAML mapping (with --set applied)
    base_dir: str
    parallel: int
    address: str | None
    gpus_per_trial: float


@dataclass
class Running:
    """A trial between its segments."""

    spec: TrialSpec
    trial: Any  # optuna.trial.Trial
    stops: list[int]
    prunable: bool
    seconds: float = 0.0


def open_studies(folder: Path, space: SearchSpace) -> dict[str, Any]:
    """The ``fixed`` and ``tpe`` studies in ``folder/search.db`` (created, or loaded to resume)."""
    optuna = require("optuna", purpose="train search", extra="search")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage2 = space.stage2
    if stage2.pruner == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=stage2.startup_trials, n_warmup_steps=0)
    elif stage2.pruner == "asha":
        pruner = optuna.pruners.SuccessiveHalvingPruner()
    else:
        pruner = optuna.pruners.NopPruner()
    sampler = optuna.samplers.TPESampler(seed=space.seed, n_startup_trials=3)
    path = folder / STORAGE_NAME
    if path.exists() or path.is_symlink():
        regular_input(path, "search storage")  # a folder, FIFO or device there is refused before SQLite opens it
    return {
        "fixed": _create_study(optuna, path, "fixed"),
        "tpe": _create_study(optuna, path, "tpe", sampler=sampler, pruner=pruner),
    }


def _create_study(optuna: Any, path: Path, name: str, **kwargs: Any) -> Any:
    """One study in the SQLite file at ``path``; a corrupt or foreign file is an OutputError naming the fix."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return optuna.create_study(
            study_name=name, storage=f"sqlite:///{path}", load_if_exists=True, direction="minimize", **kwargs
        )
    except (SQLAlchemyError, sqlite3.DatabaseError, RuntimeError) as exc:
        raise OutputError(
            f"search storage '{shown(str(path))}' is not a readable Optuna database ({type(exc).__name__}: "
            f"{shown(one_line(exc), 100)}); fix: delete it to start the search afresh, or pick another --name or "
            "--output-dir"
        ) from None


def by_number(study: Any) -> dict[int, Any]:
    """The study's frozen trials keyed by deploy_opt's trial number (the newest attempt of each number)."""
    out: dict[int, Any] = {}
    for frozen in study.get_trials(deepcopy=False):
        number = frozen.user_attrs.get("number")
        if number is not None:
            out[int(number)] = frozen
    return out


def execute(job: Job, studies: dict[str, Any], fixed: list[TrialSpec], sample_tpe: Any, tpe_count: int) -> int:
    """Run every trial not ended yet; returns how many trials this call reused from an earlier run."""
    executor = make_executor(job.parallel, job.address, job.gpus_per_trial)
    threads = 1 if job.parallel > 1 or job.address else None
    running: dict[int, Running] = {}
    queue = _fixed_queue(studies["fixed"], fixed, running)
    reused = len(fixed) - len(queue) - len(running)
    tpe_done = _resume_tpe(studies["tpe"], running, sample_tpe)
    reused += tpe_done
    next_number = len(fixed) + tpe_done + sum(1 for r in running.values() if r.spec.stage == "tpe")
    from tqdm.auto import tqdm

    bar = tqdm(total=len(fixed) + tpe_count, initial=reused, desc="search", unit="trial")
    try:
        for run in running.values():
            _submit(executor, job, run, threads)
        while True:
            while executor.busy() < executor.parallel:
                run = _next_trial(queue, studies, running, fixed, sample_tpe, next_number, tpe_count)
                if run is None:
                    break
                next_number += run.spec.stage == "tpe"
                running[run.spec.number] = run
                _submit(executor, job, run, threads)
            if not executor.busy():
                return reused
            number, outcome = executor.next_result()
            run = running[number]
            if _absorb(run, outcome, studies):
                del running[number]
                bar.update(1)
            else:
                _submit(executor, job, run, threads)
    finally:
        bar.close()
        executor.close()


def _fixed_queue(study: Any, fixed: list[TrialSpec], running: dict[int, Running]) -> list[TrialSpec]:
    """Fixed specs still to start; those left running by a killed search go into ``running`` to continue."""
    optuna = require("optuna", purpose="train search", extra="search")
    seen = by_number(study)
    queue = []
    for spec in fixed:
        frozen = seen.get(spec.number)
        if frozen is not None and frozen.state.name == "RUNNING":
            trial = optuna.trial.Trial(study, frozen._trial_id)
            running[spec.number] = Running(spec, trial, _remaining(spec.steps, [spec.steps], frozen), False)
        elif frozen is None:
            queue.append(spec)
    return queue


def _resume_tpe(study: Any, running: dict[int, Running], sample_tpe: Any) -> int:
    """Stage-2 trials: count the ended ones, put the running ones back to continue."""
    optuna = require("optuna", purpose="train search", extra="search")
    ended = 0
    for number, frozen in sorted(by_number(study).items()):
        if frozen.state.name == "RUNNING":
            spec = TrialSpec(
                number,
                "tpe",
                dict(frozen.user_attrs["params"]),
                int(frozen.user_attrs["steps"]),
                str(frozen.user_attrs.get("label", "")),
            )
            stops = sample_tpe.stops(spec.steps)
            trial = optuna.trial.Trial(study, frozen._trial_id)
            running[number] = Running(spec, trial, _remaining(spec.steps, stops, frozen), True)
        else:
            ended += 1
    return ended


def _remaining(steps: int, stops: list[int], frozen: Any) -> list[int]:
    done = int(frozen.user_attrs.get("step", 0))
    return [s for s in stops if s > done] or [steps]


def _next_trial(
    queue: list[TrialSpec],
    studies: dict[str, Any],
    running: dict[int, Running],
    fixed: list[TrialSpec],
    sample_tpe: Any,
    number: int,
    tpe_count: int,
) -> Running | None:
    """The next trial to start: a fixed one, or (once every fixed one ended) a TPE sample."""
    if queue:
        spec = queue.pop(0)
        trial = studies["fixed"].ask()
        _describe(trial, spec)
        return Running(spec, trial, [spec.steps], False)
    if any(r.spec.stage != "tpe" for r in running.values()):
        return None  # stage 2 starts from the grid's winner: wait for every fixed trial
    if number - len(fixed) >= tpe_count:
        return None
    trial = studies["tpe"].ask()
    spec = sample_tpe.sample(trial, number)
    _describe(trial, spec)
    return Running(spec, trial, sample_tpe.stops(spec.steps), True)


def _describe(trial: Any, spec: TrialSpec) -> None:
    for key, value in (
        ("number", spec.number),
        ("stage", spec.stage),
        ("params", spec.params),
        ("steps", spec.steps),
        ("label", spec.label),
        ("step", 0),
    ):
        trial.set_user_attr(key, value)
    log.info("trial %d (%s): %s", spec.number, spec.stage, spec.label or spec.params)


def _submit(executor: Any, job: Job, run: Running, threads: int | None) -> None:
    data = trial_config(job.base, run.spec.params, run.spec.steps, threads)
    folder = job.folder / "trials" / f"{run.spec.number:03d}"
    if run.trial.user_attrs.get("step", 0) == 0 and folder.exists():
        shutil.rmtree(folder)  # a start that never reached its first rung: begin again
    executor.submit(run.spec.number, run_segment, data, job.base_dir, str(folder), run.stops[0])


def _absorb(run: Running, outcome: dict[str, Any], studies: dict[str, Any]) -> bool:
    """Record a segment; returns True when the trial ended (completed, pruned or failed)."""
    study = studies["tpe" if run.prunable else "fixed"]
    trial = run.trial
    if isinstance(outcome, BaseException):
        trial.set_user_attr("error", f"{type(outcome).__name__}: {outcome}"[:500])
        study.tell(trial, state=_state("FAIL"))
        log.warning("trial %d failed: %s", run.spec.number, outcome)
        return True
    run.seconds += outcome["seconds"]
    curve = outcome["curve"]
    trial.set_user_attr("step", outcome["step"])
    trial.set_user_attr("seconds", run.seconds)
    if outcome["completed"]:
        return _finish(run, outcome, study)
    run.stops.pop(0)
    value = recent_loss(curve)
    if run.prunable and math.isfinite(value):
        trial.report(value, outcome["step"])
        if trial.should_prune():
            _record(trial, outcome)
            study.tell(trial, state=_state("PRUNED"))
            log.info("trial %d pruned at step %d (smoothed loss %.4g)", run.spec.number, outcome["step"], value)
            return True
    return False


def _finish(run: Running, outcome: dict[str, Any], study: Any) -> bool:
    _record(run.trial, outcome)
    value = outcome["metrics"].get("eval_loss", math.nan)
    if math.isfinite(value):
        study.tell(run.trial, value)
        log.info("trial %d done: eval_loss %.4g in %.1f s", run.spec.number, value, run.seconds)
    else:
        study.tell(run.trial, state=_state("FAIL"))
        log.warning("trial %d ended with eval_loss %s: recorded as failed", run.spec.number, value)
    return True


def _record(trial: Any, outcome: dict[str, Any]) -> None:
    curve = outcome["curve"]
    for key, value in (
        ("curve", curve),
        ("metrics", outcome["metrics"]),
        ("state_bytes", outcome["state_bytes"]),
        ("steps_to_converge", steps_to_converge(curve)),
        ("skipped_steps", outcome["skipped_steps"]),
        ("ended", time.time()),
    ):
        trial.set_user_attr(key, value)


def _state(name: str) -> Any:
    optuna = require("optuna", purpose="train search", extra="search")
    return getattr(optuna.trial.TrialState, name)
