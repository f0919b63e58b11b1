"""Synthetic images for the graphs of onnx's backend-test ``light`` model zoo (opset 9, batch fixed at 1).

The model is named by the environment variable ``DOPT_ZOO_MODEL`` (e.g. ``light_squeezenet``); its one image input
gets seeded uniform pixels.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

ZOO = (
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
)


def zoo_path(name: str) -> Path:
    """Where the installed onnx package keeps ``name``.onnx."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"


def _data(seed: int, count: int) -> list[tuple[dict[str, np.ndarray], None]]:
    model = onnx.load(str(zoo_path(os.environ["DOPT_ZOO_MODEL"])), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    value = next(i for i in model.graph.input if i.name not in inits)
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return [({value.name: rng.uniform(0, 1, shape).astype(np.float32)}, None) for _ in range(count)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """8 images."""
    return _data(0, 8)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """16 other images: the search decides on 8, the gate judges the other 8 (fewer is not judged)."""
    return _data(1, 16)
