"""One error hierarchy. The CLI prints any of these as one line and exits 2."""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """An exception's whole message on one line (never cut: the cause is often at its end)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


class DeployOptError(Exception):
    """Base of every error deploy_opt raises on purpose: bad input, missing packages, failed checks."""


class ConfigError(DeployOptError):
    """The YAML config, a profile or a ``--set`` override is invalid."""


class SourceError(DeployOptError):
    """A ``module:function`` reference cannot be imported or called."""


class CheckpointError(DeployOptError):
    """A checkpoint cannot be loaded into the model."""


class InputError(DeployOptError):
    """Data does not match the declared inputs (name, shape or dtype)."""


class ModelError(DeployOptError):
    """An ONNX model is invalid (checker, parity, unreadable)."""


class ExportError(DeployOptError):
    """torch → ONNX export failed."""


class NumericsError(DeployOptError):
    """NaN or Inf where finite numbers are required."""


class CalibrationError(DeployOptError):
    """Calibration data is unusable (empty, degenerate)."""


class ScaleMismatchError(DeployOptError):
    """An artifact carries quantization parameters that differ from the scale file."""


class OutputError(DeployOptError):
    """An output folder or file cannot be written."""


class MissingDependency(DeployOptError):
    """An optional package is not installed."""


class ReportError(DeployOptError):
    """A build report (build.json) is missing, unreadable or lacks a required field."""


class Interrupted(BaseException):
    """SIGTERM (or SIGINT) arrived: a BaseException, like KeyboardInterrupt, so no ``except Exception`` (an
    exporter's, a user's metric's) swallows it, and every ``finally`` still removes its staging folder."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.published: object = None  # the folder a publish completed just before the signal was delivered
