"""``train search``: the plan, a real search on the digits CNN (in-process and on local Ray), the report, best.yaml
reproducing its trial, resuming after a kill without re-running ended trials, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from deploy_opt.train.search import trial as trial_module
from deploy_opt.train.search.pipeline import SearchRequest, SearchResult, run_search
from deploy_opt.train.search.plan import fixed_specs, rung_steps
from deploy_opt.train.search.space import SearchSpace, load_space
from deploy_opt.train.search.trial import steps_to_converge, trial_config
from dopt_common.errors import ConfigError, OutputError

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "model": "deploy_opt.demo.digits_cnn:build_model",
    "data": "deploy_opt.demo.digits_cnn:digits_data",
    "model_type": "cnn",
    "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005, "state": "fp32"},
    "scheduler": {"type": "warmup_cosine", "warmup_ratio": 0.05, "min_lr_ratio": 0.1},
    "steps": 40,
    "batch_size": 32,
    "anomaly_factor": None,
    "seed": 0,
}
SPACE = {
    "stage1": {"optimizers": ["sgd", "adamw"], "lr_decades": [-1, 0], "steps_fraction": 0.5},
    "stage2": {"rungs": 2, "startup_trials": 1},
    "seed": 0,
}


class Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing in the search catches it (as with SIGINT or SIGKILL)."""


def _files(tmp_path: Path) -> tuple[Path, Path]:
    config, space = tmp_path / "digits.yaml", tmp_path / "space.yaml"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    space.write_text(yaml.safe_dump(SPACE), encoding="utf-8")
    return config, space


def _request(config: Path, space: Path, out: Path, trials: int = 9, parallel: int = 1) -> SearchRequest:
    return SearchRequest(config, (), load_space(space), trials, parallel, None, 0.0, out, None)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, SearchResult]:
    """(config, space, output folder, result) of one whole 9-trial search, which two tests read: each ran its own."""
    root = tmp_path_factory.mktemp("search")
    config, space = _files(root)
    return config, space, root / "reports", run_search(_request(config, space, root / "reports"))


def test_plan_has_the_recommender_first_then_the_config_then_the_grid(tmp_path: Path) -> None:
    from deploy_opt.train.config import build_train_config
    from deploy_opt.train.search.plan import recommended_spec

    config = build_train_config(CONFIG)
    rec = recommended_spec(config, samples=1408, memory_gb=16, steps=40)
    assert rec is not None and rec.number == 0 and rec.params["type"] == "sgd"
    assert any("SGD with momentum" in reason for _, reason in rec.reasons)
    specs = fixed_specs(config, rec, SearchSpace(**{"stage1": load_space(_files(tmp_path)[1]).stage1}).stage1, 40)
    assert [s.stage for s in specs] == ["recommended", "default", "grid", "grid", "grid", "grid"]
    assert [s.params["lr"] for s in specs[2:]] == [0.005, 0.05, 0.0001, 0.001]
    assert all(s.steps == 20 for s in specs[2:]) and specs[1].params["lr"] == 0.05
    assert rung_steps(40, 4) == [10, 20, 30, 40] and rung_steps(3, 4) == [1, 2, 3]


def test_trial_config_switches_optimizer_cleanly() -> None:
    base = {**CONFIG, "optimizer": {"type": "adamw", "betas": [0.9, 0.99], "lr": 1e-3}, "epochs": 3}
    del base["steps"]
    data = trial_config(base, {"type": "sgd", "lr": 0.1, "momentum": 0.8}, 12, threads=1)
    assert data["optimizer"] == {"type": "sgd", "lr": 0.1, "momentum": 0.8}
    assert data["steps"] == 12 and "epochs" not in data and data["threads"] == 1 and "model_type" not in data
    assert steps_to_converge([[1, 4.0], [2, 2.0], [3, 1.05], [4, 1.0]]) == 3
    assert steps_to_converge([[1, 1.0], [2, 1.0]]) is None


@pytest.mark.slow
def test_search_runs_reports_and_best_yaml_reproduces_its_trial(searched: tuple, tmp_path: Path) -> None:
    _, _, reports, result = searched
    folder = reports / "digits-search"
    assert result.folder == folder and result.trials == 9 and result.reused == 0
    summary = json.loads((folder / "search.json").read_text())
    stages = [t["stage"] for t in summary["trials"]]
    assert stages == ["recommended", "default", "grid", "grid", "grid", "grid", "tpe", "tpe", "tpe"]
    assert summary["stage1_winner"]["type"] in ("sgd", "adamw")
    winner = summary["stage1_winner"]["type"]
    assert all(t["params"]["type"] == winner for t in summary["trials"] if t["stage"] == "tpe")
    for t in summary["trials"]:
        assert t["state"] in ("complete", "pruned") and t["curve"] and t["state_bytes"] > 0
    best = summary["best"]
    assert best["eval_loss"] <= summary["default"]["eval_loss"]
    html = (folder / "search.html").read_text()
    assert "SGD with momentum" in html and "data:image/png;base64," in html
    assert (folder / "curves.png").stat().st_size > 10_000
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    again = train(load_train_config(folder / "best.yaml"), tmp_path / "again", progress=False)
    assert again.metrics["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-6)


@pytest.mark.slow
def test_a_killed_search_resumes_without_rerunning_ended_trials(tmp_path: Path, monkeypatch) -> None:
    config, space = _files(tmp_path)
    real = trial_module.run_segment
    calls: list[str] = []

    def dying(data, base_dir, out, stop_at):
        calls.append(Path(out).name)
        if calls == ["000", "001", "002", "003"]:
            raise Killed  # the search is killed while trial 3 runs
        return real(data, base_dir, out, stop_at)

    monkeypatch.setattr("deploy_opt.train.search.run.run_segment", dying)
    with pytest.raises(Killed):
        run_search(_request(config, space, tmp_path / "reports"))
    assert calls == ["000", "001", "002", "003"]
    calls.clear()
    result = run_search(_request(config, space, tmp_path / "reports"))
    assert result.reused == 3
    assert "000" not in calls and "001" not in calls and "002" not in calls
    assert calls[0] == "003" and result.trials == 9


@pytest.mark.slow
def test_a_tpe_trial_cut_between_rungs_continues_from_its_checkpoint(tmp_path: Path, monkeypatch) -> None:
    config, space = _files(tmp_path)
    real = trial_module.run_segment
    calls: list[tuple[str, int]] = []

    def dying(data, base_dir, out, stop_at):
        calls.append((Path(out).name, stop_at))
        if Path(out).name == "006" and stop_at == 40:
            raise Killed  # trial 6 passed its first rung (20), killed on the way to 40
        return real(data, base_dir, out, stop_at)

    monkeypatch.setattr("deploy_opt.train.search.run.run_segment", dying)
    with pytest.raises(Killed):
        run_search(_request(config, space, tmp_path / "reports"))
    calls.clear()
    monkeypatch.setattr("deploy_opt.train.search.run.run_segment", real)
    result = run_search(_request(config, space, tmp_path / "reports"))
    assert result.reused == 6
    log = (tmp_path / "reports" / "digits-search" / "trials" / "006" / "train_log.jsonl").read_text().splitlines()
    assert json.loads(log[0])["event"] == "start" and any(json.loads(x)["event"] == "resume" for x in log)


@pytest.mark.slow
def test_search_on_local_ray_with_two_trials_at_once(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    config, space = _files(tmp_path)
    result = run_search(_request(config, space, tmp_path / "reports", parallel=2))
    summary = json.loads((result.folder / "search.json").read_text())
    assert summary["parallel"] == 2 and summary["completed"] + summary["pruned"] == 9
    assert "threads: 1" in (result.folder / "best.yaml").read_text()


def test_search_errors_name_the_fix(searched: tuple, tmp_path: Path) -> None:
    config, space, reports, _ = searched
    with pytest.raises(ConfigError, match=r"--trials 10 or more"):
        run_search(_request(config, space, tmp_path / "reports", trials=6))
    bad = tmp_path / "bad.yaml"
    bad.write_text("stage1: {optimizers: [adam]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="use some of adamw, lion, sgd, sophia"):
        load_space(bad)
    bad.write_text("stage3: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="stage3"):
        load_space(bad)
    with pytest.raises(OutputError, match="another config, space or --trials"):  # the search above: 9 trials
        run_search(_request(config, space, reports, trials=10))


def test_parallel_without_ray_names_the_extra() -> None:
    code = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("ray", "optuna"):
                    raise ImportError("blocked for the test")
        sys.meta_path.insert(0, Block())
        from dopt_common.executor import make_executor
        assert type(make_executor(1, None, 0.0)).__name__ == "InProcessExecutor"
        try:
            make_executor(2, None, 0.0)
        except Exception as e:
            print(type(e).__name__, e)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "MissingDependency" in result.stdout and "deploy_opt[search]" in result.stdout, result.stderr
