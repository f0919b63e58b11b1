"""The ``data:`` section: where calibration, evaluation, validation and training samples come from, and the metric.

A source is a ``module:function`` (the data contract in ``data/sources.py``) or a path, read by its type
(``data/files.py``): an ``.npy``/``.npz`` of arrays, an image folder (``preprocess:`` says how images become
the input tensor), a ``.txt`` (one sample a line) or ``.jsonl`` (``text`` and an optional ``label``) tokenized with
``tokenizer:``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dopt_common.errors import ConfigError

Layout = Literal["NCHW", "NHWC"]


@dataclass(frozen=True)
class PreprocessConfig:
    """How an image file becomes an input row: resize, center-crop, scale, mean/std, layout, channel order, dtype.

    ``resize``: the short side (one number) or [height, width]; ``crop``: [height, width] of the centre crop. Both
    unset: the image is resized to the model input's fixed height and width. ``resize`` alone with a fixed model
    input: the centre crop is the input's size. Pixels are scaled by ``scale`` (1/255: to [0, 1]), then
    ``(x - mean) / std`` per channel, in ``channels`` order.
    """

    resize: tuple[int, ...] = ()  # () | [short side] | [height, width]
    crop: tuple[int, ...] = ()  # () | [height, width]
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    layout: Layout = "NCHW"
    channels: Literal["RGB", "BGR", "L"] = "RGB"
    dtype: Literal["float32", "float16", "uint8"] = "float32"
    interpolation: Literal["bilinear", "bicubic", "nearest", "lanczos"] = "bilinear"

    def __post_init__(self) -> None:
        if len(self.resize) not in (0, 1, 2) or any(v <= 0 for v in self.resize):
            raise ConfigError(f"preprocess.resize {list(self.resize)}: give [short side] or [height, width] > 0")
        if len(self.crop) not in (0, 2) or any(v <= 0 for v in self.crop):
            raise ConfigError(f"preprocess.crop {list(self.crop)}: give [height, width] > 0")
        count = 1 if self.channels == "L" else 3
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, count):
                allowed = "1 value (channels L has one)" if count == 1 else f"1 value or {count} (one a channel)"
                raise ConfigError(f"preprocess.{name} has {len(values)} values; give {allowed}")
        if any(v == 0 for v in self.std):
            raise ConfigError(f"preprocess.std {list(self.std)} has a zero; every std must be non-zero")
        if self.scale <= 0:
            raise ConfigError(f"preprocess.scale must be positive, got {self.scale}")


@dataclass(frozen=True)
class DataConfig:
    """Calibration and evaluation sources, and the metric."""

    calibration: str
    evaluation: str
    metric: str = "top1"
    eval_samples: int | None = None
    # Optional extra training data for quantization-aware training (same contract as calibration).
    train: str | None = None
    # Optional samples the auto search, fallback, QAT and pruning decide on; without it they decide on a seeded
    # half of data.evaluation and the gate judges the other half.
    validation: str | None = None
    # Reading files (ignored for module:function sources):
    batch_size: int = 32  # rows a batch of an array file, image folder or text file
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)  # image folders
    classes: tuple[str, ...] = ()  # image folders: sub-folder names in class-index order (default: sorted)
    tokenizer: str | None = None  # text files: a folder with tokenizer.json (a Hugging Face model folder)
    max_length: int = 128  # text files: tokens a sample keeps (padded per batch to its longest)
    # .npz key, .jsonl field or datasets column whose values are the calibration sampler's strata
    # (calibration.stratify auto then balances over them instead of the labels)
    strata: str | None = None

    def __post_init__(self) -> None:
        if self.calibration == self.evaluation:
            raise ConfigError(
                f"data.calibration and data.evaluation are the same source '{self.calibration}': calibrating "
                "on the evaluation samples hides accuracy loss; fix: point them at disjoint splits"
            )
        if self.eval_samples is not None and self.eval_samples <= 0:
            raise ConfigError(f"data.eval_samples must be positive, got {self.eval_samples}")
        if self.validation is not None and self.validation in (self.evaluation, self.calibration):
            other = "evaluation" if self.validation == self.evaluation else "calibration"
            raise ConfigError(
                f"data.validation '{self.validation}' is also data.{other}: "
                "deciding on the samples that are judged (or calibrated on) biases the verdict; fix: point it at "
                "a split of its own, or leave it out to split the evaluation data"
            )
        if self.train is not None and self.train == self.evaluation:
            raise ConfigError(
                f"data.train and data.evaluation are the same source '{self.train}': training on the evaluation "
                "samples hides accuracy loss; fix: point them at disjoint splits"
            )
        if self.batch_size <= 0 or self.max_length <= 1:
            raise ConfigError(
                f"data.batch_size ({self.batch_size}) must be positive and data.max_length ({self.max_length}) "
                "at least 2"
            )
