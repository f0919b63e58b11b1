"""Calibration inside the build: every method, agreement with ONNX Runtime's calibrators, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_onnx
from conftest import write_config
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

from calibrators.scales.format import load_scale_file
from deploy_opt.config.profiles import load_build_config
from deploy_opt.config.setup import QuantSetup
from deploy_opt.pipeline.build import run_build
from deploy_opt.stages.calibrate import calibrate_activations
from deploy_opt.stages.calibration_set import choose_calibration
from dopt_common.errors import CalibrationError, InputError, NumericsError

TINY = """
name: tiny
model: {{onnx: {model}}}
data: {{calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation"}}
quantization: {{op_types: [MatMul]}}
benchmark: {{enabled: false}}
gate: {{max_drop: 100}}
calibration:
{calibration}
"""


def _config(tmp_path: Path, model: Path, calibration: str = "  method: minmax", overrides: list[str] | None = None):
    path = write_config(tmp_path, TINY.format(model=model.name, calibration=calibration))
    return load_build_config(path, "ci", overrides or [])


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def _ort_ranges(model: Path, tmp_path: Path, method: CalibrationMethod, **options: object) -> dict:
    feeds = [inputs for inputs, _ in tiny_onnx.calibration()]
    calibrator = create_calibrator(
        model,
        ["MatMul"],
        augmented_model_path=str(tmp_path / "aug.onnx"),
        calibrate_method=method,
        extra_options=options,
    )
    calibrator.collect_data(_Reader(feeds))  # one call: ORT's histogram over the global range
    return {k: tuple(float(np.ravel(v)[0]) for v in d.range_value) for k, d in calibrator.compute_data().data.items()}


def _our_ranges(tmp_path: Path, model: Path, calibration: str) -> dict:
    config, _ = _config(tmp_path, model, calibration)
    chosen = choose_calibration(config.calibration, config.data, config.base_dir, config.model.inputs or _specs(model))
    return calibrate_activations(QuantSetup.of(config), model, chosen).chosen


def _specs(model: Path):
    from deploy_opt.stages.export import input_specs_from_onnx

    return input_specs_from_onnx(onnx.load(str(model)))


@pytest.mark.parametrize("percentile", [99.99, 99.9])
@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_percentile_ranges_equal_onnxruntime(tmp_path: Path, tiny_model: Path, percentile: float, scheme: str) -> None:
    calibration = f"  method: percentile\n  percentile: {percentile}\n  stratify: none"
    # Guards off: this compares the bare method with ORT's (the guard would give the graph input min/max).
    overrides = [f"quantization.activations={scheme}", "calibration.guards=false"]
    config, _ = _config(tmp_path, tiny_model, calibration, overrides)
    ours = calibrate_activations(
        QuantSetup.of(config),
        tiny_model,
        choose_calibration(config.calibration, config.data, config.base_dir, _specs(tiny_model)),
    ).chosen
    # ORT's own default is symmetric=True (|x| percentile); its symmetric=False cuts each tail.
    ort = _ort_ranges(
        tiny_model,
        tmp_path,
        CalibrationMethod.Percentile,
        num_bins=2048,
        percentile=percentile,
        symmetric=scheme == "symmetric",
    )
    common = sorted(set(ours) & set(ort))
    assert len(common) >= 3
    for name in common:
        np.testing.assert_allclose(ours[name], ort[name], rtol=1e-5, err_msg=name)


def test_minmax_ranges_equal_onnxruntime(tmp_path: Path, tiny_model: Path) -> None:
    ours = _our_ranges(tmp_path, tiny_model, "  method: minmax\n  stratify: none")
    ort = _ort_ranges(tiny_model, tmp_path, CalibrationMethod.MinMax)
    assert len(set(ours) & set(ort)) >= 3  # the comparison below is over real tensors, never an empty set
    for name in set(ours) & set(ort):
        np.testing.assert_allclose(ours[name], ort[name], rtol=1e-5, err_msg=name)


def test_entropy_thresholds_against_onnxruntime(tmp_path: Path, tiny_model: Path) -> None:
    config, _ = _config(tmp_path, tiny_model, "  method: entropy\n  stratify: none\n  guards: false")
    ranges = calibrate_activations(
        QuantSetup.of(config),
        tiny_model,
        choose_calibration(config.calibration, config.data, config.base_dir, _specs(tiny_model)),
    )
    ort = _ort_ranges(tiny_model, tmp_path, CalibrationMethod.Entropy, num_bins=2048, num_quantized_bins=128)
    assert len(set(ranges.chosen) & set(ort)) >= 3
    for name in set(ranges.chosen) & set(ort):
        mine, theirs = max(map(abs, ranges.chosen[name])), max(map(abs, ort[name]))
        low, high = ranges.observed[name]
        assert mine <= max(-low, high) + 1e-6
        if low < 0:
            # Signed data: both search the KL-optimal cut of the same distribution; TensorRT's |x| histogram
            # and ORT's signed, zero-centred windows land close (within 15% on 8k values).
            assert abs(mine - theirs) / theirs < 0.15, (name, mine, theirs)
        else:
            # A ReLU output: ORT's zero-centred window spends half its bins on the empty negative side, so its
            # candidate resolution is halved and it cuts lower; TensorRT's |x| histogram does not.
            assert mine >= theirs, (name, mine, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_every_method_builds_and_is_recorded(tmp_path: Path, tiny_model: Path, method: str) -> None:
    # Full-range weights: 7-bit ones (auto, on CPUs without VNNI) always take absmax (tested in test_weight_range).
    overrides = ["quantization.weight_range=full", "calibration.guards=false"]
    config, profile = _config(tmp_path, tiny_model, f"  method: {method}\n  weights: mse", overrides)
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    scales = load_scale_file(result.out_dir / "scales.json")
    activations = [t for t in scales.tensors.values() if t.role == "activation"]
    assert activations and {t.method for t in activations} == {method}
    assert {t.method for t in scales.tensors.values() if t.role == "weight"} == {"mse"}
    assert scales.provenance["calibration"]["method"] == method
    tensors = result.build.quantization.tensors
    for entry in tensors.values():
        low, high = entry["range"]
        assert entry["observed"][0] <= low <= high <= entry["observed"][1]
    assert (result.out_dir / "calibration.png").stat().st_size > 10_000
    assert result.build.metrics.drop < 10


@pytest.mark.slow
def test_method_overrides_by_pattern(tmp_path: Path, tiny_model: Path) -> None:
    config, profile = _config(
        tmp_path, tiny_model, "  method: entropy\n  overrides:\n    - {pattern: 'x', method: minmax}"
    )
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    methods = {n: e["method"] for n, e in result.build.quantization.tensors.items()}
    assert methods["x"] == "minmax" and methods["h2"] == "entropy"


def test_stratified_choice_is_seeded_and_recorded(tmp_path: Path, tiny_model: Path) -> None:
    hashes = {}
    for seed in (0, 0, 1):
        config, _ = _config(tmp_path, tiny_model, f"  samples: 60\n  seed: {seed}")
        chosen = choose_calibration(config.calibration, config.data, config.base_dir, _specs(tiny_model))
        assert sum(b.size for b in chosen.batches) == 60 and chosen.stratify == "label"
        hashes.setdefault(seed, set()).add(chosen.selection.sample_hash)
        assert sum(chosen.selection.counts.values()) == 60
    assert len(hashes[0]) == 1 and hashes[0] != hashes[1]


@pytest.mark.slow
def test_stratum_below_minimum_is_an_error(tmp_path: Path, tiny_model: Path) -> None:
    config, profile = _config(tmp_path, tiny_model, "  min_per_stratum: 100")
    with pytest.raises(CalibrationError, match=r"calibration stratum '\d' has \d+ candidates, fewer than"):
        run_build(config, profile, tmp_path / "reports", progress=False)
    assert list((tmp_path / "reports").iterdir()) == []


def _config_calibrating_from(tmp_path: Path, tiny_model: Path, source: str, code: str, calibration: str):
    """The tiny model's config with ``calibration`` in its section, calibrating from ``source``:calibration, a file
    of ``code`` beside it."""
    (tmp_path / source).write_text(code, encoding="utf-8")
    text = TINY.format(model=tiny_model.name, calibration=calibration).replace(
        '"@TINY@:calibration"', f'"{source}:calibration"'
    )
    return load_build_config(write_config(tmp_path, text), "ci", [])[0]


def test_label_stratify_without_labels_is_an_error(tmp_path: Path, tiny_model: Path) -> None:
    code = (
        "import tiny_onnx\ndef calibration():\n    return [(x, None) for x, _ in tiny_onnx.calibration()]\n"
        "def evaluation():\n    return tiny_onnx.evaluation()\n"
    )
    config = _config_calibrating_from(tmp_path, tiny_model, "nolabels.py", code, "  stratify: label")
    with pytest.raises(CalibrationError, match="stratify is 'label' but data.calibration yields no labels"):
        choose_calibration(config.calibration, config.data, config.base_dir, _specs(tiny_model))


def test_nondeterministic_calibration_source_is_an_error(tmp_path: Path, tiny_model: Path) -> None:
    code = (
        "import numpy as np\nimport tiny_onnx\n"
        "def calibration():\n"
        "    x = np.random.default_rng().normal(size=(64, 16)).astype('float32')\n"
        "    return [({'x': x[i:i + 16]}, np.zeros(16, 'int64')) for i in range(0, 64, 16)]\n"
    )
    config = _config_calibrating_from(tmp_path, tiny_model, "shuffled.py", code, "  samples: 20")
    with pytest.raises(CalibrationError, match="yielded different samples when called again"):
        choose_calibration(config.calibration, config.data, config.base_dir, _specs(tiny_model))


def _nan_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("Sqrt", ["x"], ["root"]), helper.make_node("MatMul", ["root", "w"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.slow
def test_nan_activation_names_the_tensor_and_the_sample(tmp_path: Path) -> None:
    model = _nan_model(tmp_path / "nan.onnx")
    (tmp_path / "nandata.py").write_text(
        "import numpy as np\n"
        "def calibration():\n"
        "    x = np.ones((8, 4), 'float32'); x[5, 2] = -1.0\n"
        "    return [({'x': x[:4]}, None), ({'x': x[4:]}, None)]\n"
        "def evaluation():\n    return [({'x': np.full((2, 4), 2.0, 'float32')}, None)]\n",
        encoding="utf-8",
    )
    text = f"""
name: nan
model: {{onnx: {model.name}}}
data: {{calibration: "nandata.py:calibration", evaluation: "nandata.py:evaluation", metric: mse}}
quantization: {{op_types: [MatMul]}}
benchmark: {{enabled: false}}
"""
    config, profile = load_build_config(write_config(tmp_path, text), "ci", [])
    with pytest.raises(NumericsError, match=r"tensor 'root' is NaN or Inf for sample 5 \(batch 1\)"):
        run_build(config, profile, tmp_path / "reports", progress=False)
    assert list((tmp_path / "reports").iterdir()) == []  # no partial artifact


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad,message",
    [
        ("{'y': x}", r"input names \['y'\] do not match model.inputs \['x'\]"),
        ("{'x': x[:, :8]}", r"input 'x' has shape \[16, 8\], declared \['batch', 16\]"),
        ("{'x': x.astype('float64')}", r"input 'x' has dtype float64, declared float32"),
    ],
)
def test_bad_calibration_inputs_fail_the_build_cleanly(tmp_path: Path, tiny_model: Path, bad: str, message: str):
    (tmp_path / "bad.py").write_text(
        "import tiny_onnx\n"
        "def calibration():\n"
        f"    return [({bad}, y) for (inputs, y) in tiny_onnx.calibration() for x in [inputs['x']]]\n",
        encoding="utf-8",
    )
    text = TINY.format(model=tiny_model.name, calibration="  method: minmax").replace(
        '"@TINY@:calibration"', '"bad.py:calibration"'
    )
    config, profile = load_build_config(write_config(tmp_path, text), "ci", [])
    with pytest.raises(InputError, match=message):
        run_build(config, profile, tmp_path / "reports", progress=False)
    assert list((tmp_path / "reports").iterdir()) == []


@pytest.mark.slow
def test_build_json_records_the_calibration(tmp_path: Path, tiny_model: Path) -> None:
    config, profile = _config(tmp_path, tiny_model, "  samples: 100\n  mode: proportional")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    record = json.loads((result.out_dir / "build.json").read_text())["calibration"]
    assert record["chosen"] == 100 and record["candidates"] == 128 and record["stratify"] == "label"
    assert sum(record["per_stratum"].values()) == 100
    assert (
        record["sample_hash"]
        == load_scale_file(result.out_dir / "scales.json").provenance["calibration"]["sample_hash"]
    )


def test_auto_measures_both_schemes_in_one_pass_and_rescheme_reuses_it(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """method auto's propagated noise is measured for both activation schemes at once: rescheme then chooses
    the other scheme's ranges without running the model again, exactly as a fresh choice for that scheme."""
    from deploy_opt.stages import calibrate

    def config_for(scheme: str):  # noqa: ANN202 - a BuildConfig
        config, _ = _config(tmp_path, tiny_model, "  method: auto", [f"quantization.activations={scheme}"])
        return config

    asym, symm = config_for("asymmetric"), config_for("symmetric")
    chosen = choose_calibration(asym.calibration, asym.data, asym.base_dir, _specs(tiny_model))
    first = calibrate_activations(QuantSetup.of(asym), tiny_model, chosen)
    assert set(first.noise) == {"asymmetric", "symmetric"} and first.evidence  # measured, and the choice shown
    fresh = calibrate_activations(
        QuantSetup.of(symm),
        tiny_model,
        choose_calibration(symm.calibration, symm.data, symm.base_dir, _specs(tiny_model)),
    )

    def no_second_pass(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("rescheme ran the propagated-noise pass again")

    monkeypatch.setattr(calibrate, "propagated_range_noise", no_second_pass)
    again = calibrate.rescheme(first, QuantSetup.of(symm), tiny_model, chosen)
    assert again is not None
    assert again.methods == fresh.methods and again.chosen == fresh.chosen and again.evidence == fresh.evidence
