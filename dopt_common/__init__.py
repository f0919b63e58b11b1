"""The foundation shared by ``deploy_opt``, ``calibrators`` and ``exporters``.

It holds only what every layer needs and none may own: the error hierarchy, the ``require()``
helper for optional dependencies, and atomic file writes. It imports nothing heavy.
"""

from dopt_common.errors import (
    CalibrationError,
    CheckpointError,
    ConfigError,
    DeployOptError,
    ExportError,
    InputError,
    MissingDependency,
    ModelError,
    NumericsError,
    OutputError,
    ReportError,
    ScaleMismatchError,
    SourceError,
)

__all__ = [
    "CalibrationError",
    "CheckpointError",
    "ConfigError",
    "DeployOptError",
    "ExportError",
    "InputError",
    "MissingDependency",
    "ModelError",
    "NumericsError",
    "OutputError",
    "ReportError",
    "ScaleMismatchError",
    "SourceError",
]
