"""The ``model:`` section: where the model comes from, and its declared inputs and outputs."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from dopt_common.errors import ConfigError

DTYPES = ("float32", "float16", "int64", "int32", "bool")
HFTask = Literal["feature-extraction", "text-classification", "image-classification", "object-detection"]
HF_TASKS = typing.get_args(HFTask)


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape (strings are dynamic dims) and dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"model.inputs '{self.name}': dtype '{self.dtype}' is not supported; use one of {', '.join(DTYPES)}"
            )
        for dim in self.shape:
            if isinstance(dim, int) and dim <= 0:
                raise ConfigError(
                    f"model.inputs '{self.name}': dimension {dim} must be positive or a name like 'batch'"
                )

    @property
    def dynamic_axes(self) -> dict[int, str]:
        """Axis index → symbolic name, for every named dimension."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}


@dataclass(frozen=True)
class ModelConfig:
    """Where the model comes from: a torch factory (and checkpoint), an ONNX file, or a local Hugging Face folder
    (``hf`` with ``task``: see build/hf_model.py)."""

    factory: str | None = None
    checkpoint: str | None = None
    onnx: str | None = None
    hf: str | None = None
    task: HFTask | None = None
    inputs: tuple[InputSpec, ...] = ()
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.factory, self.onnx, self.hf)) != 1:
            raise ConfigError(
                "model: set exactly one of 'factory' (\"package.module:function\"), 'onnx' (a path) or 'hf' (a "
                "Hugging Face model folder)"
            )
        if (self.hf is None) != (self.task is None):
            raise ConfigError(f"model.task goes with model.hf (a folder): give both; tasks: {', '.join(HF_TASKS)}")
        if self.checkpoint and not self.factory:
            raise ConfigError("model.checkpoint needs model.factory: a checkpoint is loaded into a torch module")
        if self.factory and not self.inputs:
            raise ConfigError("model.inputs is required with model.factory: declare name, shape and dtype")
