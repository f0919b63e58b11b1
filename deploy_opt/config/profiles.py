"""Hardware presets: YAML files in the ``profiles`` package (shipped in the wheel) that overlay the build config.

The example configs ship the same way, inside ``deploy_opt.demo``; both are read with ``importlib.resources``,
so a non-editable install runs its defaults from any folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from deploy_opt.config import build as cfg
from deploy_opt.config.loader import build_dataclass, read_yaml
from deploy_opt.config.serve import ServeConfig
from dopt_common.errors import ConfigError

# Sections a profile may set; the model, data and name belong to the build, not to the hardware.
PROFILE_SECTIONS = {
    "export": cfg.ExportConfig,
    "calibration": cfg.CalibrationConfig,
    "quantization": cfg.QuantizationConfig,
    "auto": cfg.AutoConfig,
    "sensitivity": cfg.SensitivityConfig,
    "deploy": cfg.DeployConfig,
    "benchmark": cfg.BenchmarkConfig,
    "runtime": cfg.RuntimeConfig,
    "gate": cfg.GateConfig,
}
# Sections for the LLM path (``quantize-llm``, ``serve``), not applied to INT8 builds.
LLM_SECTIONS = {"serve"}


@dataclass(frozen=True)
class Profile:
    """A named preset: its description and the config sections it sets."""

    name: str
    description: str
    path: Path
    sections: dict[str, Any]


def profiles_dir() -> Path:
    """The folder holding the presets: ``$DEPLOY_OPT_PROFILES``, else (unset, empty or blank) the installed
    ``profiles`` package."""
    override = os.environ.get("DEPLOY_OPT_PROFILES", "").strip()
    if not override:
        return Path(str(resources.files("profiles")))
    folder = Path(override)
    if not folder.is_dir():
        raise ConfigError(
            f"DEPLOY_OPT_PROFILES='{override}' is not a folder; fix: point it at a folder of profile YAML files, "
            "or unset it for the built-in presets"
        )
    return folder


def list_profiles() -> list[Profile]:
    """Every preset in the profiles folder, sorted by name."""
    folder = profiles_dir()
    if not folder.is_dir():
        raise ConfigError(f"profiles folder '{folder}' not found; fix: reinstall deploy_opt or set DEPLOY_OPT_PROFILES")
    return [load_profile(path) for path in sorted(folder.glob("*.yaml"))]


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a preset by name (``cpu-server``) or by path, validating every section it sets."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = profiles_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(p.stem for p in sorted(profiles_dir().glob("*.yaml")))
            raise ConfigError(f"unknown profile '{name_or_path}'; available: {known} (or a path to a .yaml)")
    raw = read_yaml(path, what="profile")
    description = raw.pop("description", None)
    if not isinstance(description, str) or not description.strip() or "\n" in description.strip():
        raise ConfigError(f"profile '{path}' needs a one-line 'description'")
    sections = {**PROFILE_SECTIONS, "serve": ServeConfig}
    for key, value in raw.items():
        if key not in sections:
            raise ConfigError(f"profile '{path}': unknown key '{key}'; allowed: description, {', '.join(sections)}")
        try:
            build_dataclass(sections[key], value, key)
        except ConfigError as exc:
            raise ConfigError(f"profile '{path}': {exc}") from exc
    return Profile(name=path.stem, description=description.strip(), path=path, sections=raw)


EXAMPLES = ("digits", "minilm", "train_digits", "train_minilm")


def example_config(name: str) -> Path:
    """The path of an example config shipped in ``deploy_opt.demo`` (one of ``EXAMPLES``)."""
    if name not in EXAMPLES:
        raise ConfigError(f"unknown example config '{name}'; available: {', '.join(EXAMPLES)} (or a path to a .yaml)")
    return Path(str(resources.files("deploy_opt.demo") / f"{name}.yaml"))


def config_path(path: str | Path | None, default: str) -> Path:
    """A config argument: a YAML path, an example's name, or (None) the ``default`` example."""
    if path is None:
        return example_config(default)
    if Path(path).suffix not in (".yaml", ".yml") and not Path(path).exists() and str(path) in EXAMPLES:
        return example_config(str(path))
    return Path(path)


def load_build_config(
    path: str | Path | None, profile: str | None = None, overrides: list[str] | None = None
) -> tuple[cfg.BuildConfig, Profile]:
    """Read a build YAML (or an example's name; the demo when None), apply its profile and ``--set`` overrides."""
    path = config_path(path, "digits")
    raw = read_yaml(path)
    name = profile or raw.get("profile") or "cpu-server"
    if not isinstance(name, str):
        raise ConfigError(f"profile must be a name like cpu-server, got {name!r}")
    preset = load_profile(name)
    raw["profile"] = preset.name
    build_sections = {k: v for k, v in preset.sections.items() if k not in LLM_SECTIONS}
    config = cfg.resolve_config(raw, build_sections, list(overrides or []), str(path.resolve().parent))
    return config, preset
