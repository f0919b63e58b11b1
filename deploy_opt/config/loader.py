"""The generic YAML -> frozen dataclass loader: every error names the field, the value and what is allowed.

Used by the build config, the LLM and training configs and the profiles alike.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from dopt_common.errors import ConfigError
from dopt_common.names import shown

CONFIG_CAP = 16 * 2**20  # bytes; a config is a few KiB, anything near this is a wrong path

_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

# Every integer setting that sizes memory or time, in every config (build, LLM, training, profiles), has bounds
# checked at load: ``calibration.bins: 1e9`` once grew to 22 GB before the OOM killer ended it. Keyed by the
# field's own name; the dataclasses' own checks stay for tighter, setting-specific rules.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "seed": (0, 2**32 - 1),  # numpy's and torch's seed range
    "bins": (16, 1 << 16),  # histogram bins per tensor (TensorRT's entropy uses 2048)
    "samples": (1, 1_000_000),
    "eval_samples": (1, 1_000_000),
    "min_per_stratum": (1, 100_000),
    "batch_size": (1, 65_536),
    "steps": (0, 100_000_000),  # 0 reaches the section's own check, which says what a step count must be
    "epochs": (0, 1_000_000),
    "repeats": (1, 100_000),
    "warmup": (0, 100_000),
    "threads": (0, 1_024),
    "top_k": (1, 100_000),
    "parity_batches": (1, 10_000),
    "external_data_mb": (0, 1 << 20),  # 0: every initializer external
    "max_seq_len": (1, 1 << 20),
    "eval_seq_len": (1, 1 << 20),
    "eval_tokens": (1, 1 << 30),
    "session_len": (1, 1 << 24),
    "generations": (0, 10_000),
    "max_new_tokens": (1, 1 << 16),
    "block_size": (1, 1 << 24),
    "min_numel": (0, 1 << 40),
    "speedup_batch": (1, 65_536),
}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check and convert one YAML value to the annotated type, or raise ConfigError naming ``where``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        allowed = f"{where}: {shown(value, quote=True)} is not allowed; use {_type_name(tp)}"
        raise ConfigError(errors[-1] if len(errors) == 1 else allowed)
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(f"{where}: {shown(value, quote=True)} is not allowed; use one of {', '.join(map(str, args))}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {shown(value, quote=True)}")
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, where)
    if tp is float and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 5e-5 (no dot) as a string; people write it that way
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # YAML's .nan/.inf: a NaN threshold passes every comparison it meets
            raise ConfigError(f"{where}: {value} is not a finite number; give a finite value")
        return float(value)
    if tp is int and type(value) is int:
        return _bounded(value, where)
    if tp in (str, bool) and type(value) is tp:
        return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {shown(value, quote=True)}")


def _bounded(value: int, where: str) -> int:
    low, high = INT_BOUNDS.get(where.rsplit(".", 1)[-1].split("[")[0], (-(2**63), 2**63 - 1))
    if not low <= value <= high:
        raise ConfigError(f"{where}: {shown(value, 40)} is out of range; fix: give an integer from {low} to {high}")
    return value


def section_field(cls: type) -> Any:
    """A config's section: a field defaulting to ``cls()`` (each config gets its own)."""
    return dataclasses.field(default_factory=cls)


def base_dir_field() -> Any:
    """A top-level config's ``base_dir``: set by the loader (the config file's folder), never by the user, so
    ``build_dataclass`` neither reads nor lists it."""
    return dataclasses.field(default=".", metadata={"internal": True})


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """Build a frozen dataclass from a mapping; unknown or missing keys name the allowed ones."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of keys, got {shown(data, quote=True)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    prefix = f"{where}." if where else ""
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"unknown key '{prefix}{key}'; allowed keys{' in ' + where if where else ''}: "
                f"{', '.join(sorted(fields))}"
            )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key '{prefix}{name}'")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if where and not str(exc).startswith(where.split("[")[0]):
            raise ConfigError(f"{where}: {exc}") from exc
        raise


def read_config_text(path: Path, what: str = "config") -> str:
    """The UTF-8 text of a regular file of at most ``CONFIG_CAP`` bytes (16 MiB), else a ConfigError.

    The file is opened non-blocking and checked on its descriptor, so a FIFO or a device (``/dev/zero``) is
    refused before any read, and nothing can swap the file between the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read {what} '{shown(str(path))}': {exc.strerror}; fix: check the path") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{what} '{shown(str(path))}' is not a regular file; fix: pass a YAML file")
        if info.st_size > CONFIG_CAP:
            raise ConfigError(
                f"{what} '{shown(str(path))}' is {info.st_size:,} bytes, over the {CONFIG_CAP:,}-byte cap for a "
                "config; fix: pass the YAML config, not a data file"
            )
        os.set_blocking(fd, True)
        raw = handle.read(CONFIG_CAP + 1)
    if len(raw) > CONFIG_CAP:
        raise ConfigError(f"{what} '{shown(str(path))}' grew past the {CONFIG_CAP:,}-byte cap while being read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} '{shown(str(path))}' is not UTF-8 text (byte {exc.start}); fix: pass a YAML file saved as UTF-8"
        ) from None


def read_yaml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """Read a YAML mapping, turning syntax errors into one-line ConfigErrors."""
    path = Path(path)
    text = read_config_text(path, what)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what} '{path}'{line}: invalid YAML ({problem}); fix the syntax") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} '{path}' must be a mapping of keys, got {type(data).__name__}")
    return data


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two mappings; values in ``top`` win, nested mappings merge."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """Turn ``section.key=value`` into a nested mapping; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set '{text}' must look like section.key=value, e.g. benchmark.threads=4")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"--set '{text}' names no key; use section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set '{text}': the value is not valid YAML; quote it") from exc
    if keys == ["profile"]:
        raise ConfigError(f"--set '{text}': choose the preset with --profile {value}, not --set")
    nested: dict[str, Any] = {keys[-1]: value}
    for key in reversed(keys[:-1]):
        nested = {key: nested}
    return nested
