"""scales.schema.json and the consistency rules: real files pass, broken entries are named by tensor and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from calibrators.scales.format import ScaleFile, TensorScale, load_scale_file, save_scale_file, validate_scale_data
from calibrators.scales.schema import SCHEMA_PATH
from dopt_common.errors import ConfigError


def _document() -> dict[str, Any]:
    tensors = {
        "conv1.weight": TensorScale("conv1.weight", "weight", "int8", (0.01, 0.02, 0.03), (0, 0, 0), 0, 3.8),
        "conv1.bias": TensorScale(
            "conv1.bias", "bias", "int32", (1e-4, 2e-4, 3e-4), (0, 0, 0), 0, method="derived", derived_from=("x",)
        ),
        "x": TensorScale("x", "activation", "uint8", (0.02,), (130,), None, 2.6, (-2.6, 2.5), "minmax"),
    }
    provenance = {
        "model_sha256": "a" * 64,
        "opset": 17,
        "calibration": {"method": "minmax", "overrides": [], "weights": "absmax", "samples": 8, "sample_hash": "ab"},
        "deploy_opt_version": "0.1.0",
        "extra_key": {"anything": True},
    }
    return ScaleFile("asymmetric", tensors, provenance, ("node_a",)).to_json()


def test_the_schema_is_valid_draft_2020_12_and_accepts_what_the_writer_writes(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    data = _document()
    jsonschema.Draft202012Validator(schema).validate(data)  # the library's own verdict, not ours
    validate_scale_data(data, "scales.json")
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(data))
    assert set(load_scale_file(path).tensors) == {"conv1.weight", "conv1.bias", "x"}


def _set(data: dict, path: tuple, value: Any) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()
W = ("tensors", "conv1.weight")


@pytest.mark.parametrize(
    "path,value,match",
    [
        (W + ("scale_hex", 2), "xyz", r"tensor 'conv1.weight': field 'scale_hex'\[2\] 'xyz' does not match"),
        (W + ("scale_hex", 0), "3C23D70A", r"tensor 'conv1.weight': field 'scale_hex'\[0\] '3C23D70A' does not"),
        (W + ("role",), "gradient", r"tensor 'conv1.weight': field 'role' 'gradient' is not one of"),
        (W + ("dtype",), "int4", r"tensor 'conv1.weight': field 'dtype' 'int4' is not one of"),
        (W + ("scale", 1), -0.5, r"tensor 'conv1.weight': field 'scale'\[1\] -0.5 is less than or equal to"),
        (W + ("zero_point", 0), 0.5, r"tensor 'conv1.weight': field 'zero_point'\[0\] 0.5 is not of type 'integer'"),
        (W + ("zero_point", 0), "0", r"tensor 'conv1.weight': field 'zero_point'\[0\] '0' is not of type 'integer'"),
        (W + ("scale", 0), "0.1", r"tensor 'conv1.weight': field 'scale'\[0\] '0.1' is not of type 'number'"),
        (W + ("scale", 2), 0, r"tensor 'conv1.weight': field 'scale'\[2\] 0 is less than or equal to the minimum"),
        (W + ("scale_hex", 1), 7, r"tensor 'conv1.weight': field 'scale_hex'\[1\] 7 is not of type 'string'"),
        (W + ("colour",), "red", r"tensor 'conv1.weight': Additional properties are not allowed \('colour'"),
        (W + ("scale_hex",), _DELETE, r"tensor 'conv1.weight': 'scale_hex' is a required property"),
        (("tensors", "x", "range"), [1.0], r"tensor 'x': field 'range' \[1.0\] is too short"),
        (("activations",), "both", r"scales.json: field 'activations' 'both' is not one of"),
        (("provenance", "model_sha256"), "abc", r"scales.json: field 'provenance'.'model_sha256' 'abc' does not match"),
        (("provenance", "calibration", "samples"), -1, r"field 'provenance'.'calibration'.'samples' -1 is less than"),
        (("excluded",), "node_a", r"scales.json: field 'excluded' 'node_a' is not of type 'array'"),
    ],
)
def test_schema_errors_name_the_tensor_and_field(path: tuple, value: Any, match: str) -> None:
    data = _set(_document(), path, value)
    with pytest.raises(ConfigError, match=match):
        validate_scale_data(data, "scales.json")
    # The full schema, run by jsonschema itself, rejects it too (per-value rules are checked in Python for speed).
    assert not jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).is_valid(data)


@pytest.mark.parametrize(
    "path,value,match",
    [
        (
            W + ("zero_point",),
            [0, 0],
            r"tensor 'conv1.weight': fields 'scale', 'scale_hex' and 'zero_point' .* 3, 3 and 2",
        ),
        (W + ("scale_hex",), ["3c23d70a"] * 2, r"3, 2 and 3"),
        (W + ("axis",), None, r"tensor 'conv1.weight': 3 per-channel scales need field 'axis'"),
        (
            W + ("symmetric",),
            False,
            r"tensor 'conv1.weight': field 'symmetric' is false but dtype int8 .* is symmetric",
        ),
        (("tensors", "x", "symmetric"), True, r"tensor 'x': field 'symmetric' is true but dtype uint8"),
        (("tensors", "x", "zero_point"), [256], r"tensor 'x': field 'zero_point'\[0\] 256 is outside the uint8 range"),
    ],
)
def test_consistency_errors_name_the_tensor_and_field(path: tuple, value: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate_scale_data(_set(_document(), path, value), "scales.json")


def test_load_scale_file_validates(tmp_path: Path) -> None:
    data = _set(_document(), W + ("scale_hex", 1), "nothex!!")
    (tmp_path / "scales.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"scales.json tensor 'conv1.weight': field 'scale_hex'\[1\]"):
        load_scale_file(tmp_path / "scales.json")


def test_many_problems_are_counted_and_a_fix_is_given() -> None:
    data = _set(_set(_document(), W + ("dtype",), "int4"), ("tensors", "x", "role"), "nope")
    with pytest.raises(ConfigError, match=r"\(and 1 more problems\); fix: .*scales.schema.json"):
        validate_scale_data(data, "scales.json")


def test_saved_files_round_trip_through_the_validator(tmp_path: Path) -> None:
    path = save_scale_file(ScaleFile("symmetric", {}, {}), tmp_path / "empty.json")
    assert load_scale_file(path).tensors == {}
