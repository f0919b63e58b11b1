"""The scales.json schema check: ``scales.schema.json`` (JSON Schema 2020-12) plus what a schema cannot say.

Errors name the tensor and the field, e.g. ``scales.json tensor 'conv1.weight': field 'scale_hex'[2] 'xyz' does
not match '^[0-9a-f]{8}$'``. The per-value rules of the three per-channel arrays (``scale``, ``scale_hex``,
``zero_point``) are checked here in plain Python, with the schema's wording: ``jsonschema`` takes ~15 µs a value,
0.6 s for MiniLM's 42k values, and a large model has millions.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dopt_common.errors import ConfigError
from dopt_common.names import shown

SCHEMA_PATH = Path(__file__).with_name("scales.schema.json")
# The integer range of each quantized type, inclusive.
QDTYPES = {"int8": (-127, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}
ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}
FIX = "fix: correct the entry or rebuild the file with deploy_opt (schema: calibrators/scales/scales.schema.json)"
PER_VALUE = ("scale", "scale_hex", "zero_point")
_HEX = re.compile(r"[0-9a-f]{8}")


def load_schema() -> dict[str, Any]:
    """The scales.json JSON Schema (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema  # a declared dependency; imported here to keep `import calibrators` light

    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    fast = copy.deepcopy(schema)
    for key in PER_VALUE:  # checked by _value_problem, much faster
        del fast["$defs"]["tensor"]["properties"][key]["items"]
    return jsonschema.Draft202012Validator(fast)


def validate_scale_data(data: Any, source: str = "scales.json") -> None:
    """Raise ``ConfigError`` naming the tensor and field when ``data`` is not a valid scales.json document."""
    errors = sorted(_validator().iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise ConfigError(f"{_describe(errors[0], source)}{more}; {FIX}")
    for name, entry in data["tensors"].items():
        problem = _inconsistency(entry)
        if problem:
            raise ConfigError(f"{source} tensor '{name}': {problem}; {FIX}")
    both = sorted(set(data.get("dynamic", {})) & set(data["tensors"]))
    if both:  # a tensor has a stored scale or a run-time one, never both
        raise ConfigError(f"{source} tensor '{both[0]}': listed under both 'tensors' and 'dynamic'; {FIX}")


def _describe(error: Any, source: str) -> str:
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] in ("tensors", "dynamic"):
        where = f"{source} tensor '{path[1]}'"
        rest = path[2:]
    else:
        where, rest = source, path
    value = error.instance
    if isinstance(value, float) and not math.isfinite(value):  # jsonschema's "nan is less than ..." says little
        message = f"is {value}, not a finite number"
    else:
        message = shown(error.message)
    if rest:
        field = f"'{rest[0]}'" + "".join(f"[{p}]" if isinstance(p, int) else f".'{p}'" for p in rest[1:])
        return f"{where}: field {field} {message}"
    return f"{where}: {message}"


def _inconsistency(entry: Mapping[str, Any]) -> str | None:
    """What the schema cannot check: matching lengths, the symmetric flag, zero point ranges, per-channel axis."""
    scale: Sequence[float] = entry["scale"]
    bits: Sequence[str] = entry["scale_hex"]
    zero: Sequence[int] = entry["zero_point"]
    problem = _value_problem(scale, bits, zero)
    if problem:
        return problem
    if not len(scale) == len(bits) == len(zero):
        return (
            f"fields 'scale', 'scale_hex' and 'zero_point' must have one value per channel, "
            f"got {len(scale)}, {len(bits)} and {len(zero)}"
        )
    dtype = entry["dtype"]
    low, high = ZERO_POINT_RANGE[dtype]
    bad = next((i for i, z in enumerate(zero) if not low <= z <= high), None)
    if bad is not None:
        return f"field 'zero_point'[{bad}] {zero[bad]} is outside the {dtype} range [{low}, {high}]"
    symmetric = dtype != "uint8" and all(z == 0 for z in zero)
    if entry["symmetric"] != symmetric:
        return (
            f"field 'symmetric' is {str(entry['symmetric']).lower()} but dtype {dtype} with zero points "
            f"{list(zero)[:4]} is {'symmetric' if symmetric else 'asymmetric'}"
        )
    if len(scale) > 1 and entry["axis"] is None:
        return f"{len(scale)} per-channel scales need field 'axis' (the channel dimension), got null"
    return None


def _value_problem(scale: Sequence[Any], bits: Sequence[Any], zero: Sequence[Any]) -> str | None:
    """The schema's ``items`` rules of the per-channel arrays, in jsonschema's words."""
    for i, s in enumerate(scale):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            return f"field 'scale'[{i}] {s!r} is not of type 'number'"
        if not math.isfinite(s):
            return f"field 'scale'[{i}] is {s}, not a finite number"
        if not s > 0:
            return f"field 'scale'[{i}] {s!r} is less than or equal to the minimum of 0"
    for i, b in enumerate(bits):
        if not isinstance(b, str):
            return f"field 'scale_hex'[{i}] {b!r} is not of type 'string'"
        if not _HEX.fullmatch(b):
            return f"field 'scale_hex'[{i}] {b!r} does not match '^[0-9a-f]{{8}}$'"
    for i, z in enumerate(zero):
        if isinstance(z, bool) or not (isinstance(z, int) or isinstance(z, float) and z.is_integer()):
            return f"field 'zero_point'[{i}] {z!r} is not of type 'integer'"
    return None
