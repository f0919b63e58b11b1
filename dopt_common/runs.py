"""What every pipeline (build, quantize-llm, train) shares: the staged output folder, stage timings, seeding.

``staged_dir`` is the one way a pipeline publishes: everything is assembled in a hidden folder beside the target
and swapped in whole when the run finishes, so no failure or kill leaves half an artifact or touches the
previous one. Names starting with "." inside the stage are working files and are dropped before the swap.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from dopt_common.errors import OutputError
from dopt_common.files import replace_dir


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``out_dir``; on a clean exit it replaces ``out_dir`` whole."""
    out_dir = Path(out_dir)
    stage = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(f"cannot create '{stage}': {exc.strerror}; fix: choose a writable --output-dir") from exc
    try:
        yield stage
        for working in stage.glob(".*"):
            shutil.rmtree(working) if working.is_dir() else working.unlink()
        try:
            replace_dir(stage, out_dir)
        except OSError as exc:
            raise OutputError(
                f"cannot publish '{out_dir}': {exc.strerror}; fix: choose a writable --output-dir"
            ) from exc
    finally:
        shutil.rmtree(stage, ignore_errors=True)


class Timings:
    """Wall time per pipeline stage, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the enclosed block under ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and (when installed) torch."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)
