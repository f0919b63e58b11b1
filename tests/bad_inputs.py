"""A tiny model and its data functions, written beside a bad-input test's config as ``mydata.py``."""

from __future__ import annotations

import textwrap
from pathlib import Path

# A tiny model and its data functions, written beside each test's config as mydata.py.
DATA_MODULE = textwrap.dedent(
    """
    import numpy as np
    import torch


    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3))


    def calib():
        return []


    def evaluation():
        return [({"x": np.ones((2, 4), np.float32)}, np.array([0, 1]))]


    def not_a_model():
        return [1, 2, 3]
    """
)


def write_data_module(folder: Path) -> Path:
    """Write mydata.py into ``folder`` and return the folder."""
    (folder / "mydata.py").write_text(DATA_MODULE, encoding="utf-8")
    return folder
