"""The foundation shared by ``deploy_opt``, ``calibrators`` and ``exporters``.

It holds only what every layer needs and none may own, and imports nothing heavy:

- ``errors``: the one error hierarchy (the CLI prints each as one line and exits 2);
- ``deps``: ``require()``, the one way optional dependencies are imported;
- ``files``: atomic writes, hashing and the publish that swaps a staged folder in whole;
- ``runs``: the staged output folder, stage timings and seeding every pipeline shares;
- ``names``: the guard on run names that become paths, and bounded values in messages;
- ``ort``: ONNX Runtime sessions created one way everywhere.
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
