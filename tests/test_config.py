"""Config loading: every bad YAML, profile or --set names the offending key; precedence, freezing, presets."""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_opt.config.profiles import list_profiles, load_build_config
from deploy_opt.config.setup import SearchSettings
from dopt_common.errors import ConfigError

SHIPPED_PROFILES = {"cpu-server", "ci", "a100", "rtx3090", "v100"}
MINIMAL: dict[str, Any] = {
    "name": "t",
    "model": {
        "factory": "deploy_opt.demo.digits:build_model",
        "inputs": [{"name": "pixels", "shape": ["batch", 64], "dtype": "float32"}],
    },
    "data": {"calibration": "a:b", "evaluation": "a:c"},
}


@pytest.fixture(autouse=True)
def _shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Always read the repo's profiles/, whatever the caller's environment says."""
    monkeypatch.delenv("DEPLOY_OPT_PROFILES", raising=False)


def write_config(folder: Path, edit: Callable[[dict[str, Any]], Any] | None = None) -> Path:
    """Write MINIMAL (after ``edit`` mutates a copy of it) as YAML into ``folder``."""
    data = copy.deepcopy(MINIMAL)
    if edit is not None:
        edit(data)
    path = folder / "build.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _set(section: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that merges ``values`` into ``data[section]`` (creating it)."""

    def edit(data: dict[str, Any]) -> None:
        data.setdefault(section, {}).update(values)

    return edit


# (id, edit of MINIMAL, profile, overrides, regex the ConfigError must match)
BAD_CONFIGS = [
    (
        "unknown-top-level-key",
        lambda d: d.update(colour="blue"),
        None,
        [],
        r"unknown key 'colour'; allowed keys: .*\bbenchmark\b.*\bdata\b.*\bmodel\b.*\bname\b",
    ),
    (
        "unknown-nested-key",
        _set("benchmark", foo=1),
        None,
        [],
        r"unknown key 'benchmark\.foo'; allowed keys in benchmark: .*batch_sizes.*threads",
    ),
    (
        "unknown-key-in-input-spec",
        lambda d: d["model"]["inputs"][0].update(layout="nchw"),
        None,
        [],
        r"unknown key 'model\.inputs\[0\]\.layout'",
    ),
    ("wrong-type", _set("benchmark", threads="two"), None, [], r"benchmark\.threads: expected int, got 'two'"),
    ("bool-is-not-int", _set("benchmark", threads=True), None, [], r"benchmark\.threads: expected int, got True"),
    (
        "bad-literal",
        _set("export", exporter="onnx"),
        None,
        [],
        r"export\.exporter: 'onnx' is not allowed; use one of dynamo, torchscript",
    ),
    (
        "bad-activation-literal",
        _set("quantization", activations="signed"),
        None,
        [],
        r"quantization\.activations: 'signed' is not allowed; use one of symmetric, asymmetric",
    ),
    ("missing-data", lambda d: d.pop("data"), None, [], r"missing required key 'data'"),
    ("missing-name", lambda d: d.pop("name"), None, [], r"missing required key 'name'"),
    (
        "missing-data-evaluation",
        lambda d: d["data"].pop("evaluation"),
        None,
        [],
        r"missing required key 'data\.evaluation'",
    ),
    (
        "factory-and-onnx",
        lambda d: d["model"].update(onnx="model.onnx"),
        None,
        [],
        r"model: set exactly one of 'factory' .*, 'onnx' .* or 'hf'",
    ),
    ("neither-factory-nor-onnx", lambda d: d["model"].pop("factory"), None, [], r"set exactly one of 'factory'"),
    (
        "calibration-is-evaluation",
        lambda d: d["data"].update(evaluation="a:b"),
        None,
        [],
        r"data\.calibration and data\.evaluation are the same source 'a:b'",
    ),
    (
        "unsupported-input-dtype",
        lambda d: d["model"]["inputs"][0].update(dtype="float64"),
        None,
        [],
        r"dtype 'float64' is not supported; use one of float32",
    ),
    (
        "unknown-profile",
        None,
        "h100",
        [],
        r"unknown profile 'h100'; available: .*a100.*ci.*cpu-server.*rtx3090.*v100",
    ),
    (
        "set-without-equals",
        None,
        None,
        ["benchmark.threads"],
        r"--set 'benchmark\.threads' must look like section\.key=value",
    ),
    ("set-without-key", None, None, ["=4"], r"--set '=4' names no key"),
    (
        "set-unknown-key",
        None,
        None,
        ["benchmark.turbo=1"],
        r"unknown key 'benchmark\.turbo'; allowed keys in benchmark",
    ),
    ("set-wrong-type", None, None, ["benchmark.threads=two"], r"benchmark\.threads: expected int, got 'two'"),
    (
        "zero-batch-size",
        _set("benchmark", batch_sizes=[0, 8]),
        None,
        [],
        r"benchmark\.batch_sizes must be positive integers, got \[0, 8\]",
    ),
    (
        "negative-batch-size-via-set",
        None,
        None,
        ["benchmark.batch_sizes=[1,-4]"],
        r"benchmark\.batch_sizes must be positive integers, got \[1, -4\]",
    ),
    ("empty-batch-sizes", _set("benchmark", batch_sizes=[]), None, [], r"benchmark\.batch_sizes must be positive"),
    (
        "zero-calibration-samples",
        _set("calibration", samples=0),
        None,
        [],
        r"calibration\.samples: 0 is out of range; fix: give an integer from 1 to",
    ),
    ("opset-too-old", _set("export", opset=13), None, [], r"export\.opset is 13; deploy_opt needs opset 17"),
    (
        "name-with-slash",
        lambda d: d.update(name="a/b"),
        None,
        [],
        r"name 'a/b' contains a path separator: a run name is one folder name",
    ),
    ("hidden-name", lambda d: d.update(name=".t"), None, [], r"name '\.t' starts with '\.'"),
    ("section-not-a-mapping", lambda d: d.update(benchmark=[1, 2]), None, [], r"benchmark: expected a mapping"),
]


@pytest.mark.parametrize(
    ("edit", "profile", "overrides", "match"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_CONFIGS],
)
def test_bad_config_raises_config_error_naming_the_key(
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], Any] | None,
    profile: str | None,
    overrides: list[str],
    match: str,
) -> None:
    path = write_config(tmp_path, edit)
    with pytest.raises(ConfigError, match=match):
        load_build_config(path, profile, overrides)


@pytest.mark.parametrize(
    "text,match",
    [
        ("name: t\nmodel:\n  factory: a:b\n   inputs: []\n", r"broken\.yaml' line 4: invalid YAML"),
        ("name: t\nmodel: [unclosed\ndata: {}\n", r"line \d+: invalid YAML"),  # an unclosed flow sequence
        ("- a\n- b\n", r"must be a mapping of keys, got list"),
        (None, r"cannot read config '.*broken\.yaml'"),  # no such file
    ],
)
def test_a_config_that_cannot_be_read_is_named_in_one_line(tmp_path: Path, text: str | None, match: str) -> None:
    path = tmp_path / "broken.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as info:
        load_build_config(path)
    assert "\n" not in str(info.value)


def test_minimal_config_loads_with_defaults(tmp_path: Path) -> None:
    config, profile = load_build_config(write_config(tmp_path))
    assert profile.name == "cpu-server" and config.profile == "cpu-server"
    assert config.name == "t"
    assert config.model.inputs[0].shape == ("batch", 64)
    assert config.model.inputs[0].dynamic_axes == {0: "batch"}
    assert config.calibration.samples == 512
    assert config.base_dir == str(tmp_path.resolve())


def test_profile_file_set_precedence(tmp_path: Path) -> None:
    # The ci profile alone sets calibration.samples to 128 (the dataclass default is 512).
    config, _ = load_build_config(write_config(tmp_path), "ci")
    assert config.calibration.samples == 128
    assert config.benchmark.repeats == 15  # set by ci, untouched by the file

    # The file beats the profile...
    path = write_config(tmp_path, _set("calibration", samples=256))
    config, _ = load_build_config(path, "ci")
    assert config.calibration.samples == 256
    assert config.benchmark.repeats == 15  # a sibling section from the profile survives the merge

    # ... and --set beats both.
    config, _ = load_build_config(path, "ci", ["calibration.samples=64"])
    assert config.calibration.samples == 64


def test_profile_named_in_the_file_and_cli_profile_wins(tmp_path: Path) -> None:
    path = write_config(tmp_path, lambda d: d.update(profile="ci"))
    config, profile = load_build_config(path)
    assert profile.name == "ci" and config.calibration.samples == 128
    config, profile = load_build_config(path, "cpu-server")
    assert profile.name == "cpu-server" and config.profile == "cpu-server"
    assert config.calibration.samples == 512


def test_set_profile_is_rejected_with_the_right_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--profile a100"):
        load_build_config(write_config(tmp_path), None, ["profile=a100"])


def test_base_dir_is_not_a_user_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'base_dir'"):
        load_build_config(write_config(tmp_path), None, ["base_dir=/etc"])


def test_later_set_overrides_win_and_values_parse_as_yaml(tmp_path: Path) -> None:
    config, _ = load_build_config(
        write_config(tmp_path),
        None,
        [
            "benchmark.batch_sizes=[1,8]",
            "benchmark.threads=3",
            "benchmark.threads=4",
            "gate.min_speedup=null",
            "benchmark.enabled=false",
        ],
    )
    assert config.benchmark.batch_sizes == (1, 8)
    assert config.benchmark.threads == 4
    assert config.gate.min_speedup is None
    assert config.benchmark.enabled is False


@pytest.mark.parametrize(
    "overrides,stages,timing",
    [
        ([], 2, 2),  # the default: runtime.threads null is benchmark.threads
        (["benchmark.threads=4"], 4, 4),  # a config from before the runtime section: one count drives both
        (["runtime.threads=8"], 8, 2),  # the build's work at 8 threads, the benchmark still timed at 2
        (["benchmark.threads=1", "runtime.threads=3"], 3, 1),
    ],
)
def test_runtime_threads_default_to_benchmark_threads(
    tmp_path: Path, overrides: list[str], stages: int, timing: int
) -> None:
    config, _ = load_build_config(write_config(tmp_path), None, overrides)
    assert config.stage_runtime.threads == stages and config.benchmark.threads == timing
    settings = SearchSettings.of(config)  # what the stages are handed
    assert settings.setup.runtime.threads == stages and settings.benchmark.threads == timing
    assert config.runtime.threads == (None if not any("runtime" in o for o in overrides) else stages)


def test_runtime_threads_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.threads must be positive or null, got 0"):
        load_build_config(write_config(tmp_path), None, ["runtime.threads=0"])


def test_int_is_accepted_for_a_float_field(tmp_path: Path) -> None:
    config, _ = load_build_config(write_config(tmp_path), None, ["gate.max_drop=2"])
    assert config.gate.max_drop == 2.0 and isinstance(config.gate.max_drop, float)


def test_config_is_frozen(tmp_path: Path) -> None:
    config, _ = load_build_config(write_config(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.benchmark.threads = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.inputs[0].dtype = "float16"  # type: ignore[misc]
    assert isinstance(config.benchmark.batch_sizes, tuple)
    assert isinstance(config.model.inputs, tuple)


def test_tensorrt_profile_forces_symmetric_activations(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_config(tmp_path, _set("quantization", activations="asymmetric"))
    with caplog.at_level(logging.WARNING, logger="deploy_opt.config.build"):
        config, profile = load_build_config(path, "a100")
    assert profile.name == "a100"
    assert "tensorrt" in config.deploy.targets
    assert config.quantization.activations == "symmetric"
    assert any("tensorrt" in r.getMessage() and "symmetric" in r.getMessage() for r in caplog.records)


def test_tensorrt_target_from_the_file_forces_symmetric_too(tmp_path: Path) -> None:
    path = write_config(tmp_path, _set("deploy", targets=["ort-cpu", "tensorrt"]))
    config, _ = load_build_config(path, "cpu-server")  # cpu-server itself is asymmetric
    assert config.quantization.activations == "symmetric"


def test_gate_speedup_batch_is_benchmarked_too(tmp_path: Path) -> None:
    # The gate reads its speedup at that batch: a build that did not time it failed after minutes of work.
    path = write_config(tmp_path, _set("gate", speedup_batch=8))
    config, _ = load_build_config(path, "cpu-server")
    assert config.benchmark.batch_sizes == (1, 8, 32) and config.gate.speedup_batch == 8
    config, _ = load_build_config(write_config(tmp_path), "cpu-server")
    assert config.benchmark.batch_sizes == (1, 32)


def test_cpu_profile_keeps_asymmetric(tmp_path: Path) -> None:
    config, _ = load_build_config(write_config(tmp_path), "cpu-server")
    assert config.quantization.activations == "asymmetric"


def test_every_shipped_profile_loads_and_has_a_one_line_description(tmp_path: Path) -> None:
    profiles = list_profiles()
    assert SHIPPED_PROFILES <= {p.name for p in profiles}
    path = write_config(tmp_path)
    for profile in profiles:
        assert profile.description and "\n" not in profile.description, profile.name
        config, loaded = load_build_config(path, profile.name)
        assert loaded.name == profile.name == config.profile


def test_profile_with_an_unknown_section_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "odd.yaml").write_text("description: odd\nmodel: {onnx: x.onnx}\n", encoding="utf-8")
    monkeypatch.setenv("DEPLOY_OPT_PROFILES", str(tmp_path))
    with pytest.raises(ConfigError, match=r"unknown key 'model'; allowed: description, export"):
        list_profiles()


def test_profile_without_description_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nodesc.yaml"
    path.write_text("benchmark: {threads: 4}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"needs a one-line 'description'"):
        load_build_config(write_config(tmp_path), str(path))


def test_profile_with_a_bad_value_names_the_profile_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("description: bad\nbenchmark: {threads: 0}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"profile '.*bad\.yaml': benchmark: threads and repeats must be positive"):
        load_build_config(write_config(tmp_path), str(path))


def test_cli_lists_profiles(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deploy_opt", "profiles"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert SHIPPED_PROFILES <= listed
    for line in proc.stdout.splitlines():
        assert re.match(r"^\S+\s{2,}\S", line), line  # name, then its description


def test_exponent_floats_without_a_dot_are_floats() -> None:
    # YAML 1.1 reads `5e-5` as a string; in a float field it is the number people meant, and junk still fails.
    from deploy_opt.config.profiles import example_config
    from deploy_opt.train.config import load_train_config

    config = load_train_config(example_config("train_minilm"), ["optimizer.lr=5e-5", "optimizer.rho=4E-2"])
    assert config.optimizer.lr == 5e-5 and config.optimizer.rho == 0.04
    with pytest.raises(ConfigError, match="optimizer.lr: expected float, got '5e-5x'"):
        load_train_config(example_config("train_minilm"), ["optimizer.lr=5e-5x"])


@pytest.mark.parametrize(
    ("channels", "mean", "message"),
    [
        ("L", (0.5, 0.5), r"preprocess.mean has 2 values; give 1 value \(channels L has one\)$"),
        ("RGB", (0.5, 0.5), r"preprocess.mean has 2 values; give 1 value or 3 \(one a channel\)$"),
    ],
)
def test_a_mean_of_the_wrong_length_names_the_lengths_allowed(channels: str, mean: tuple, message: str) -> None:
    from deploy_opt.config.data import PreprocessConfig

    with pytest.raises(ConfigError, match=message):
        PreprocessConfig(channels=channels, mean=mean, std=(1.0,))
