"""quantization.mode: auto: the search's choices, its record, and calibration.method: auto."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import fragile_config, unmeetable_gate
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.analysis.sensitivity.range_noise import pick_methods, propagated_range_noise
from deploy_opt.autotune.candidates import Candidate, allowed_schemes
from deploy_opt.autotune.intensity import intensity_groups, reduction_lengths
from deploy_opt.autotune.trials import Trial, best_trial, chosen_trial
from deploy_opt.pipeline.build import run_build
from dopt_common import clock as clock_module
from dopt_common.clock import WorkClock


def _trial(drop: float, speedup: float | None, excluded: tuple[str, ...] = (), nodes: int = 4) -> Trial:
    return Trial(
        "placement", Candidate("inputs", "asymmetric", None, excluded), 90.0, drop, None, 1.0, speedup, nodes, 0.1
    )


def test_the_fastest_trial_that_meets_the_gate_and_pays_wins() -> None:
    trials = [_trial(0.2, 1.3), _trial(2.0, 2.5), _trial(0.5, 1.6, ("a",)), _trial(0.1, 1.01)]
    assert best_trial(trials, 1.0, 1.02) is trials[2]
    # Slower than FP32 by the min_gain everywhere: nothing pays, so FP32 ships.
    assert best_trial([_trial(0.1, 0.9), _trial(0.0, 1.01)], 1.0, 1.02) is None
    # A variant with no quantized node is FP32, never the INT8 choice.
    assert best_trial([_trial(0.0, 1.5, nodes=0)], 1.0, 1.02) is None


def test_a_trial_meets_the_gate_only_with_a_standard_error_to_spare() -> None:
    lucky = dataclasses.replace(_trial(5.9, 1.38), drop_error=2.3)  # nudenet 320n on 96 crops: judged 9.4 > 8
    steady = dataclasses.replace(_trial(4.5, 1.33, ("a",)), drop_error=2.2)
    assert not lucky.meets(8.0) and steady.meets(8.0)
    assert best_trial([lucky, steady], 8.0, 1.02) is steady
    assert lucky.to_json()["drop_error"] == 2.3
    # When no candidate meets it with the error to spare, the best that meets it as measured still ships.
    assert best_trial([lucky], 8.0, 1.02) is None and chosen_trial([lucky], 8.0, 1.02) is lucky
    assert chosen_trial([lucky, steady], 8.0, 1.02) is steady


def test_the_standard_error_is_that_of_the_paired_mean_drop() -> None:
    from deploy_opt.evaluation.uncertainty import standard_error

    drops = np.array([0.0, 100.0, 0.0, 0.0])  # one of four detections lost
    assert standard_error(drops) == pytest.approx(np.std(drops, ddof=1) / 2)
    assert standard_error(np.array([3.0])) == 0.0


def test_untimed_the_trial_with_the_fewest_fp32_nodes_wins() -> None:
    trials = [_trial(3.0, None), _trial(0.4, None, ("a", "b")), _trial(0.9, None, ("a",))]
    assert best_trial(trials, 1.0, None) is trials[2]


def test_tensorrt_allows_only_symmetric_activations() -> None:
    assert allowed_schemes(("tensorrt", "ort-cuda"), "asymmetric") == ("symmetric",)
    assert allowed_schemes(("ort-cpu",), "asymmetric") == ("asymmetric", "symmetric")
    assert allowed_schemes(("ort-cpu",), "symmetric") == ("symmetric", "asymmetric")


def _conv_model() -> onnx.ModelProto:
    """A 3x3 stem conv (K = 27), a depthwise 3x3 (K = 9), a pointwise conv (K = 16) and a Gemm (K = 16)."""
    rng = np.random.default_rng(0)
    inits = {
        "w0": rng.normal(size=(16, 3, 3, 3)),
        "w1": rng.normal(size=(16, 1, 3, 3)),
        "w2": rng.normal(size=(16, 16, 1, 1)),
        "wf": rng.normal(size=(10, 16)),
        "axes": np.array([2, 3]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w1"], ["b"], name="depthwise", pads=[1, 1, 1, 1], group=16),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="pointwise"),
        helper.make_node("ReduceMean", ["c", "axes"], ["d"], keepdims=0),
        helper.make_node("Gemm", ["d", "wf"], ["y"], name="head", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(v.astype(np.float32 if v.dtype.kind == "f" else np.int64), k)
            for k, v in inits.items()
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_reduction_lengths_rank_nodes_by_what_int8_can_win() -> None:
    lengths = reduction_lengths(_conv_model(), ("Conv", "Gemm"))
    assert lengths == {"stem": 27, "depthwise": 9, "pointwise": 16, "head": 16}
    groups = intensity_groups(lengths)
    assert groups[0] == (16, ("depthwise",))  # the depthwise conv goes back to FP32 first
    assert all("stem" not in nodes for _, nodes in groups)  # the heaviest node always stays INT8


def _clip_model(downstream: str) -> onnx.ModelProto:
    """x → Relu → r → (Clip to [0, 1] | Mul by 1) → y: whether r's outliers reach the output."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("lo", 0.0), ("hi", 1.0), ("one", 1.0))]
    tail = (
        helper.make_node("Clip", ["r", "lo", "hi"], ["y"], name="tail")
        if downstream == "clip"
        else helper.make_node("Mul", ["r", "one"], ["y"], name="tail")
    )
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), tail],
        "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(("downstream", "expected"), [("clip", "clipped"), ("identity", "minmax")])
def test_range_methods_are_judged_by_the_error_that_reaches_the_output(downstream: str, expected: str) -> None:
    """r has rare outliers at 40: clipping them at 1 is free when the model clips there anyway, costly if not."""
    rng = np.random.default_rng(1)
    feeds = []
    for _ in range(8):
        x = rng.uniform(0, 1, (1, 64)).astype(np.float32)
        x[0, rng.integers(0, 64)] = 40.0
        feeds.append({"x": x})
    candidates = {"r": {"minmax": (0.0, 40.0), "clipped": (0.0, 1.0)}}
    noise = propagated_range_noise(_clip_model(downstream), candidates, "asymmetric", feeds)
    assert noise is not None and pick_methods(noise)["r"] == expected


def test_the_range_choice_s_samples_are_bounded_by_a_count_of_values_not_by_time() -> None:
    """``values`` caps the activation values the pass taps: 64 a sample here, so 130 pays for two of eight (a
    power of two), whatever the machine's load; the estimate then equals the one over those two samples alone."""
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.uniform(0, 1, (1, 64)).astype(np.float32)} for _ in range(8)]
    candidates = {"r": {"minmax": (0.0, 1.0), "clipped": (0.0, 0.5)}}
    model = _clip_model("identity")
    bounded = propagated_range_noise(model, candidates, "asymmetric", feeds, values=130.0)
    assert bounded == propagated_range_noise(model, candidates, "asymmetric", feeds[:2])
    assert bounded != propagated_range_noise(model, candidates, "asymmetric", feeds)


@pytest.mark.slow
def test_auto_mode_smooths_the_outlier_channel_away(tmp_path: Path) -> None:
    """fc2's input has one huge channel: no placement meets the gate, SmoothQuant does (no FP32 node needed)."""
    config, profile = fragile_config(tmp_path, 0.5)
    assert config.quantization.mode == "auto" and config.calibration.method == "auto"
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.auto
    assert result.gate.passed, result.gate.lines()
    # inputs, outputs and outputs+chain (fc1's bias Add reads a MatMul) for each scheme, then dynamic INT8 (which
    # the outlier channel defeats too: one range per input tensor), then SmoothQuant
    assert [t["step"] for t in auto["trials"]] == ["placement"] * 6 + ["dynamic", "smoothquant"]
    assert auto["trials"][6]["drop"] > 0.5
    assert [t["settings"]["coverage"] for t in auto["trials"][:3]] == ["weighted", "weighted", "chain"]
    assert all(t["drop"] > 0.5 for t in auto["trials"][:6])
    assert auto["chosen"]["smoothing_alpha"] == 0.5 and "fc2" not in auto["chosen"]["excluded"]


@pytest.mark.slow
def test_auto_mode_keeps_the_fragile_layer_float_and_records_every_trial(tmp_path: Path) -> None:
    # recovery off: CLE balances fc1 -> fc2 with no FP32 node (test_recovery_search); this is the fallback's test
    config, profile = fragile_config(tmp_path, 0.5, "auto: {smoothquant_alpha: null, recovery: []}")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.auto
    assert result.gate.passed, result.gate.lines()
    assert "fc2" in auto["chosen"]["excluded"]
    steps = [t["step"] for t in auto["trials"]]
    assert steps[:6] == ["placement"] * 6 and "fallback" in steps and "smoothquant" not in steps
    assert result.build.metrics.drop <= 0.5 and result.build.quantization.quantized_nodes >= 1
    summary = (result.out_dir / "summary.md").read_text(encoding="utf-8")
    assert "## Search" in summary and "| fallback |" in summary
    assert json.loads((result.out_dir / "build.json").read_text())["auto"]["verdict"] == auto["verdict"]


@pytest.mark.slow
def test_when_no_int8_model_meets_the_gate_fp32_ships_and_is_never_called_int8(tmp_path: Path) -> None:
    config, profile = fragile_config(tmp_path, 0.0, "auto: {budget_s: 30}")
    config = unmeetable_gate(config)
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    assert result.build.auto["chosen"] is None and "FP32 ships" in result.build.auto["verdict"]
    assert result.build.quantization.quantized_nodes == 0
    failed = {c.name for c in result.gate.criteria if not c.passed}
    assert "int8_nodes" in failed and not result.gate.passed
    summary = (result.out_dir / "summary.md").read_text(encoding="utf-8")
    assert "quantizes no node" in summary


def test_smoothquant_starts_from_the_most_accurate_base_that_pays() -> None:
    """PP-OCRv4's recogniser: the most accurate placement ran at 0.45x, so smoothing it could not ship."""
    from types import SimpleNamespace

    from deploy_opt.autotune.search import Base, smoothquant_base

    slow, fast = (Candidate("outputs", s, None, (), "chain") for s in ("symmetric", "asymmetric"))
    plain = Candidate("outputs", "asymmetric", None, ())
    trials = [
        Trial("placement", slow, 96.8, 0.05, None, 30.0, 0.45, 40, 9.0),
        Trial("placement", fast, 94.0, 2.8, None, 9.0, 1.73, 40, 9.0),
        Trial("placement", plain, 88.2, 8.6, None, 12.0, 1.31, 40, 9.0),
    ]
    bases = [Base(c, Path("model.onnx"), None, None) for c in (slow, fast, plain)]  # type: ignore[arg-type]
    auto = SimpleNamespace(setup=SimpleNamespace(auto=SimpleNamespace(min_gain=1.02)))
    timed = SimpleNamespace(trials=trials, probe=object(), settings=auto)
    assert smoothquant_base(timed, bases) is bases[1]  # type: ignore[arg-type]
    # Untimed every base pays, and when none pays the most accurate of all is still SmoothQuant's best hope.
    assert smoothquant_base(SimpleNamespace(trials=trials, probe=None, settings=auto), bases) is bases[0]  # type: ignore[arg-type]
    slower = [dataclasses.replace(t, speedup=0.9) for t in trials]
    assert smoothquant_base(SimpleNamespace(trials=slower, probe=object(), settings=auto), bases) is bases[0]  # type: ignore[arg-type]


def _search_state(trials: list[Trial], clock: WorkClock, time_left: bool):  # -> SimpleNamespace
    """What ``_verdict`` reads of a search: ``trials`` under max_drop 1, min_gain 1.02 for ort-cpu, no probe."""
    from types import SimpleNamespace

    settings = SimpleNamespace(
        gate=SimpleNamespace(max_drop=1.0),
        setup=SimpleNamespace(auto=SimpleNamespace(min_gain=1.02), deploy=SimpleNamespace(targets=("ort-cpu",))),
    )
    return SimpleNamespace(
        trials=trials,
        settings=settings,
        baseline_scores=np.zeros(0),
        time_left=lambda extra=0.0: time_left,
        clock=clock,
        probe=None,
    )


def test_a_budget_cut_short_says_which_faster_model_missed_max_drop() -> None:
    """FP32 shipping because the budget ran out is not 'FP32 is fastest here' alone: the verdict names the fast
    model the fallback never reached, and the setting that lets the search go on."""

    from deploy_opt.autotune.search import _verdict

    slow, fast = (Candidate("outputs", s, None, (), "chain") for s in ("symmetric", "asymmetric"))
    trials = [
        Trial("placement", slow, 96.8, 0.05, None, 30.0, 0.42, 40, 9.0),
        Trial("placement", fast, 94.0, 2.395, None, 9.0, 1.99, 40, 9.0),
    ]
    clock = WorkClock.start(240.0, 1200.0, 2)
    verdict = _verdict(_search_state(trials, clock, time_left=False), None)  # type: ignore[arg-type]
    assert verdict.startswith("FP32 is fastest here within the time budget: ")
    assert "the fastest model measured, outputs+chain asym at 1.99x, missed max_drop with drop 2.395" in verdict
    assert "wall-clock cap" not in verdict
    finished = _search_state(trials, clock, time_left=True)
    assert _verdict(finished, None).endswith("under the 1.02x that INT8 must gain; FP32 ships")  # type: ignore[arg-type]


def test_the_verdict_says_when_the_wall_cap_not_the_work_budget_ended_the_search(monkeypatch) -> None:
    """The budget counts work; a loaded machine that hits the wall cap first is said to have cut the search short,
    and a loaded machine's timings are said to be the one decision load may move."""

    from deploy_opt.autotune.search import _verdict

    trials = [Trial("placement", Candidate("outputs", "asymmetric"), 94.0, 2.4, None, 9.0, 1.5, 40, 9.0)]
    monkeypatch.setattr(clock_module, "_machine_busy", lambda: (100.0, 1.0))  # every process's CPU s, this one's
    monkeypatch.setattr(clock_module.os, "cpu_count", lambda: 2)
    capped = WorkClock.start(240.0, 1e-9, 2)  # no wall time left, the work budget untouched
    capped.wall0 -= 10.0  # started 10 s ago: 20 CPU seconds of capacity on two CPUs
    ctx = _search_state(trials, capped, time_left=False)
    verdict = _verdict(ctx, None)  # type: ignore[arg-type]
    assert "the wall-clock cap (0 s = auto.wall_cap x auto.budget_s) ended the search after" in verdict
    assert "may go the other way" not in verdict  # not timed: nothing load could move
    ctx.probe = object()
    monkeypatch.setattr(clock_module, "_machine_busy", lambda: (110.0, 9.0))  # 10 s used, 8 of them ours
    assert "may go the other way" not in _verdict(ctx, None)  # type: ignore[arg-type]  # others: 2 of 20 s
    monkeypatch.setattr(clock_module, "_machine_busy", lambda: (120.0, 9.0))  # others used 12 of the 20 s
    verdict = _verdict(ctx, None)  # type: ignore[arg-type]
    assert "(other processes used 60% of its CPUs during the search), so INT8 against FP32" in verdict


def test_work_seconds_count_cpu_time_not_a_sleep() -> None:
    """A sleeping search (a loaded machine's wait, as far as this process can tell) spends no work budget."""
    import time

    clock = WorkClock.start(1.0, 100.0, 1)
    time.sleep(0.3)
    assert clock.wall() >= 0.3 and clock.spent() < 0.1
    assert clock.left(0.5) and not clock.left(1.0)
    assert not clock.left(0.0, 100.0)  # the wall cap holds whatever the work


@pytest.mark.parametrize(
    "work,per_sample,available,expected", [(36.0, 18.3, 16, 1), (36.0, 18.0, 16, 2), (240, 1.0, 16, 16), (1, 9, 16, 1)]
)
def test_the_range_choice_runs_the_samples_its_share_of_the_budget_pays_for(
    work: float, per_sample: float, available: int, expected: int
) -> None:
    from deploy_opt.analysis.sensitivity.range_noise import samples_within

    assert samples_within(work, per_sample, available) == expected


def test_a_confirmed_speedup_must_clear_fp32_beyond_timing_noise() -> None:
    """MobileNet-v2 with 48 of 53 convs float confirmed at 1.07x, above min_gain, but the build's benchmark timed
    it at 0.97x: the confirming timing's interval decides, as the gate's does."""

    from deploy_opt.autotune.search import _verdict

    noisy = dataclasses.replace(_trial(0.0, 1.07), step="confirm", speedup_low=0.97)
    assert not noisy.pays(1.02) and dataclasses.replace(noisy, speedup_low=1.01).pays(1.02)
    assert _trial(0.0, 1.07).pays(1.02)  # a first timing has no interval: min_gain alone
    assert noisy.to_json()["speedup_ci95_low"] == 0.97
    ctx = _search_state([_trial(0.0, 1.03), noisy], WorkClock.start(240.0, 1200.0, 2), time_left=True)
    verdict = _verdict(ctx, None)  # type: ignore[arg-type]
    assert "runs at 1.070x FP32, but its 95% interval reaches down to 0.970x: not surely faster than FP32" in verdict


def test_the_latency_probe_gives_the_speedup_with_its_interval(tmp_path: Path) -> None:
    import tiny_onnx

    from deploy_opt.autotune.latency import LatencyProbe
    from dopt_common.ort import create_session

    path = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    feed = {"x": np.zeros((8, tiny_onnx.FEATURES), np.float32)}
    probe = LatencyProbe(create_session(path, threads=1), feed, 1, min_rounds=20, min_seconds=0.05)
    ms, speed = probe.speedup_interval(path.read_bytes())
    assert ms > 0 and speed.low <= speed.value <= speed.high and 0.2 < speed.value < 5  # the same model twice


def test_a_coarse_metric_s_tie_is_ordered_by_output_fidelity() -> None:
    """Two candidates at the same top-1 drop (64 samples move in 1.56-point steps) are told apart by the output's
    SQNR against FP32; an unmeasured fidelity ranks below any measured one."""
    candidate = Candidate("inputs", "asymmetric")
    noisy = Trial("placement", candidate, 98.4, 1.56, None, None, None, 10, 1.0, fidelity_db=18.0)
    clean = dataclasses.replace(noisy, fidelity_db=31.0)
    assert clean.better_than(noisy) and not noisy.better_than(clean)
    assert noisy.better_than(dataclasses.replace(noisy, fidelity_db=None))
    assert dataclasses.replace(noisy, drop=0.0).better_than(clean)  # the task metric comes first
    assert clean.to_json()["fidelity_db"] == 31.0


def test_the_scorer_s_fidelity_is_the_output_sqnr_against_fp32(tmp_path: Path) -> None:
    from deploy_opt.analysis.sensitivity.analyze import SubsetScorer
    from deploy_opt.data.sources import Batch
    from deploy_opt.evaluation.metrics import resolve_metric
    from deploy_opt.evaluation.numerics import sqnr_db

    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    weight = np.array([[1.0, 2.0], [0.5, -1.0], [0.0, 3.0]], np.float32)

    def model(scale: float) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
            [numpy_helper.from_array(weight * scale, "w")],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    reference = x @ weight
    scorer = SubsetScorer([Batch({"x": x}, None)], [reference], resolve_metric("cosine"), 1)
    scores, same = scorer.scored(model(1.0))
    assert same == float("inf") and scores.shape == (4,)
    _, off = scorer.scored(model(1.1))
    assert off == pytest.approx(sqnr_db(reference, x @ (weight * 1.1)), rel=1e-6)


def test_speedups_within_five_percent_rank_as_one_and_the_more_accurate_wins() -> None:
    """Two candidates 3% apart swap places from one timing to the next; the search ranks them as one speed and
    takes the lower drop, so noise and load do not steer it. 10% apart, the faster wins."""
    from deploy_opt.autotune.trials import fastest

    plain, chained = Candidate("outputs", "asymmetric"), Candidate("outputs", "asymmetric", coverage="chain")
    slower_exact = Trial("placement", plain, 99.0, 0.2, None, 10.0, 1.50, 10, 1.0)
    faster_rougher = Trial("placement", chained, 98.5, 0.7, None, 9.7, 1.545, 10, 1.0)
    assert fastest([faster_rougher, slower_exact]) is slower_exact
    much_faster = dataclasses.replace(faster_rougher, speedup=1.65)
    assert fastest([slower_exact, much_faster]) is much_faster


def test_a_further_scheme_is_tried_on_the_best_shape_only_when_all_would_crowd_out_the_rest() -> None:
    """Three 25-work-second placements for a second scheme against 100 seconds left: only the first scheme's
    most accurate shape; the same placements at 1 s each are all tried."""
    from types import SimpleNamespace

    from deploy_opt.autotune.search import _affordable

    shapes = [("inputs", "weighted"), ("outputs", "weighted"), ("outputs", "chain")]
    drops = {("inputs", "weighted"): 13.9, ("outputs", "weighted"): 15.4, ("outputs", "chain"): 23.0}

    def trials(work: float) -> list[Trial]:
        return [
            Trial("placement", Candidate(p, "asymmetric", coverage=c), 0.0, d, None, None, None, 9, work, work_s=work)
            for (p, c), d in drops.items()
        ]

    clock = WorkClock.start(100.0, 500.0, 2)
    first = SimpleNamespace(choice_seconds=5.0)
    slow = SimpleNamespace(trials=trials(25.0), clock=clock)
    assert _affordable(slow, shapes, "symmetric", first) == [("inputs", "weighted")]
    quick = SimpleNamespace(trials=trials(1.0), clock=clock)
    assert _affordable(quick, shapes, "symmetric", first) == shapes


def test_the_verdict_says_when_one_decide_sample_moves_the_metric_more_than_max_drop() -> None:
    from types import SimpleNamespace

    from deploy_opt.autotune.search import _coarse_decisions

    def ctx(samples: int, metric: str = "top1") -> SimpleNamespace:
        settings = SimpleNamespace(gate=SimpleNamespace(max_drop=1.0), setup=SimpleNamespace(metric=metric))
        scores = [100.0] * (samples - 3) + [0.0] * 3 if metric == "top1" else np.linspace(90, 100, samples)
        return SimpleNamespace(baseline_scores=np.array(scores), settings=settings)

    said = _coarse_decisions(ctx(64))
    assert "64 samples" in said and "1.56 points" in said and "at least 100 samples" in said
    assert _coarse_decisions(ctx(256)) == ""  # 0.39-point steps resolve a 1-point gate
    assert _coarse_decisions(ctx(64, "cosine")) == ""  # a continuous metric has no step


def test_a_gpu_profile_s_verdict_says_its_candidates_were_not_timed_where_they_run() -> None:
    from types import SimpleNamespace

    from deploy_opt.autotune.search import _untimed_targets

    def ctx(targets: tuple[str, ...], probe: object = None) -> SimpleNamespace:
        setup = SimpleNamespace(auto=SimpleNamespace(min_gain=1.02), deploy=SimpleNamespace(targets=targets))
        return SimpleNamespace(settings=SimpleNamespace(setup=setup), probe=probe)

    said = _untimed_targets(ctx(("tensorrt", "ort-cuda")))  # type: ignore[arg-type]
    assert said.startswith("candidates were not timed: the targets (tensorrt, ort-cuda) run on GPUs")
    assert _untimed_targets(ctx(("ort-cpu", "tensorrt"), probe=object())) == ""  # type: ignore[arg-type]
