"""benchmarks/corpus/results.py's bar: deploy_opt loses no more than the best peer, where a gap within one
standard error of the paired per-sample difference is noise, not a loss."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import corpus_modules


@pytest.fixture(scope="module")
def results():  # noqa: ANN201 - the benchmark harness module, imported by path
    (module,) = corpus_modules("results")
    return module


def _row(results, tool: str, correct: list[int], outcome: str = "exit 0, ships INT8"):  # noqa: ANN001, ANN202
    value = 100.0 * sum(correct) / len(correct)
    scores = [100.0 * c for c in correct]
    return results.Row("m", tool, "top1", 97.27, value, {"1": 1.0}, outcome=outcome, sample_scores=scores)


def test_one_flipped_sample_above_fp32_is_noise_and_five_are_a_loss(results) -> None:
    fp32 = [1] * 249 + [0] * 7  # 97.27 top-1 on 256 test samples, as the FP32 model that ships
    ours = _row(results, "deploy_opt", fp32, "exit 1, ships FP32 (no node quantized)")
    lucky = _row(results, "ort-minmax", [1] * 250 + [0] * 6)  # one more right: 97.66
    line = results.verdict([ours, lucky])
    assert "holds within noise" in line and "0.39 ± 0.39" in line and "256 test samples" in line
    better = _row(results, "ort-minmax", [1] * 254 + [0] * 2)  # five more right: a real gap
    assert "LOSES MORE" in results.verdict([ours, better])
    # rows stored before per-sample scores: the plain rule
    unpaired = dataclasses.replace(_row(results, "ort-minmax", [1] * 250 + [0] * 6), sample_scores=None)
    assert "LOSES MORE" in results.verdict([ours, unpaired])
    worse = _row(results, "ort-minmax", fp32[2:] + [0, 0])
    assert "drop 0.00 vs best peer ort-minmax 0.79: holds;" in results.verdict([ours, worse])


def test_a_partial_run_keeps_the_committed_rows_of_the_models_it_did_not_run(results, tmp_path: Path) -> None:
    """A fresh machine's store holds only the models it ran; the others come back from the committed RESULTS.md
    (every cell but the per-sample scores, which the table never printed)."""
    import json

    committed = tmp_path / "RESULTS.md"
    earlier = [_row(results, "deploy_opt", [1] * 3 + [0]), _row(results, "ort-minmax", [1] * 2 + [0] * 2)]
    earlier = [dataclasses.replace(r, model="old", measured="2026-12-03T15:16:00", cpu="AVX-512 VNNI") for r in earlier]
    committed.write_text("Written 2026-12-06\n\n" + results.table([earlier]) + "\n", encoding="utf-8")
    store = tmp_path / "results.json"
    fresh = dataclasses.asdict(dataclasses.replace(_row(results, "deploy_opt", [1] * 4), model="new"))
    store.write_text(json.dumps({"new": [fresh]}), encoding="utf-8")
    loaded = results.load(["old", "new"], store, committed)
    assert [[r.model for r in rows] for rows in loaded] == [["old", "old"], ["new"]]
    # a rerun of one tool on a committed model keeps that model's other tools' rows
    rerun = dataclasses.asdict(dataclasses.replace(_row(results, "deploy_opt", [1] * 4), model="old"))
    store.write_text(json.dumps({"old": [rerun]}), encoding="utf-8")
    (mixed,) = results.load(["old"], store, committed)
    assert [(r.tool, r.value) for r in mixed] == [("deploy_opt", 100.0), ("ort-minmax", 50.0)]
    back = [dataclasses.replace(r, sample_scores=None) for r in earlier]
    assert results.table([loaded[0]]) == results.table([back])
    assert loaded[0][0].speedup == {"1": 1.0} and loaded[0][1].value == 50.0


def test_a_row_measured_here_outdates_a_committed_failed_preparation(results, tmp_path: Path) -> None:
    import json

    failed = results.Row("m", "prepare", outcome="prepare failed: KeyError: 'm'")
    committed = tmp_path / "RESULTS.md"
    committed.write_text("Written 2026-12-06\n\n" + results.table([[failed]]) + "\n", encoding="utf-8")
    store = tmp_path / "results.json"
    assert [r.tool for r in results.load(["m"], store, committed)[0]] == ["prepare"]  # nothing measured here yet
    fresh = dataclasses.asdict(dataclasses.replace(_row(results, "deploy_opt", [1] * 4), model="m"))
    store.write_text(json.dumps({"m": [fresh]}), encoding="utf-8")
    assert [r.tool for r in results.load(["m"], store, committed)[0]] == ["deploy_opt"]
