"""What every pipeline (build, quantize-llm, train) shares: the staged output folder, stage timings, seeding.

``staged_dir`` is the one way a pipeline publishes: everything is assembled in a hidden folder beside the target
and swapped in whole when the run finishes, so no failure or kill leaves half an artifact or touches the
previous one. Names starting with "." inside the stage are working files and are dropped before the swap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dopt_common.errors import DeployOptError, Interrupted, OutputError, one_line
from dopt_common.files import check_replaceable_dir, recover_published, replace_dir

log = logging.getLogger(__name__)


@contextlib.contextmanager
def staged_dir(out_dir: Path, wait: bool = False, divert: Callable[[], bool] | None = None) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``out_dir``; on a clean exit it replaces ``out_dir`` whole.

    ``divert``, asked at publish time: when it answers True (a failing build, and ``out_dir`` holds a passing
    one), the stage goes to ``failed_dir(out_dir)`` instead and ``out_dir`` stays as it is. A run that publishes
    to ``out_dir`` removes an older ``failed_dir``: it no longer describes the folder beside it.

    One run per report name at a time (a lock file beside it; ``wait``: wait for the other run); leftovers of
    runs whose process is gone (``.<name>.partial-<pid>``, ``.old-``, ``.incoming-``) are removed first.
    """
    out_dir = check_replaceable_dir(out_dir)
    stage = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    with report_lock(out_dir, wait):
        if recover_published(out_dir.parent, out_dir.name, _alive) is not None:
            log.warning("restored '%s': an earlier run was killed while publishing it", out_dir)
        sweep_stale(out_dir.parent)
        shutil.rmtree(stage, ignore_errors=True)
        try:
            stage.mkdir(parents=True)
        except OSError as exc:
            raise OutputError(f"cannot create '{stage}': {exc.strerror}; fix: choose a writable --output-dir") from exc
        try:
            yield stage
            for working in stage.glob(".*"):
                shutil.rmtree(working) if working.is_dir() else working.unlink()
            target = failed_dir(out_dir) if divert is not None and divert() else out_dir
            try:
                replace_dir(stage, target)
            except Interrupted as exc:  # held off during the swap, delivered right after it: the build is live
                exc.published = target
                raise
            except OSError as exc:
                raise OutputError(
                    f"cannot publish '{out_dir}': {exc.strerror}; the previous '{out_dir.name}' is unchanged; "
                    "fix: choose a writable --output-dir (not a mount point itself)"
                ) from exc
            if target == out_dir:
                shutil.rmtree(failed_dir(out_dir), ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def failed_dir(out_dir: Path) -> Path:
    """Where a failing run lands when ``out_dir`` holds the last passing one: ``<name>.failed/`` beside it."""
    return out_dir.with_name(f"{out_dir.name}.failed")


@contextlib.contextmanager
def report_lock(out_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``out_dir`` for the run; a second run of the same name fails at once, or
    with ``wait`` waits for the first to finish. The file is removed on release, so no run leaves it behind."""
    path = out_dir.parent / f".{out_dir.name}.lock"
    handle = _locked(path, out_dir, wait)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # still holding the lock: a waiter then finds its file gone and retries
        handle.close()


def _locked(path: Path, out_dir: Path, wait: bool) -> Any:
    """An open, flock-ed handle on ``path``: the file that is at ``path`` now (not one a releaser unlinked)."""
    import fcntl

    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115  (held for the whole run)
        except OSError as exc:
            raise OutputError(f"cannot create '{path}': {exc.strerror}; fix: choose a writable --output-dir") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            handle.close()
            raise OutputError(
                f"'{out_dir}' is being written by {owner}; fix: build with --wait to wait for it, or use another "
                "name (--set name=...)"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            return handle
        handle.close()  # the holder removed this file as it finished: lock the new one


STALE = re.compile(r"^\..+\.(partial|old|incoming)-(\d+)$")


def sweep_stale(folder: Path) -> list[Path]:
    """Remove ``.<name>.partial-<pid>`` (and ``.old-``/``.incoming-``) folders whose process no longer runs."""
    removed = []
    for entry in folder.glob(".*-*") if folder.is_dir() else ():
        match = STALE.match(entry.name)
        if match and not _alive(int(match.group(2))):
            if entry.is_symlink() or entry.is_file():  # never follow a link out of the folder
                entry.unlink(missing_ok=True)
            elif entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    if removed:
        log.info("removed %d leftover folder(s) of interrupted runs in %s", len(removed), folder)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Timings:
    """Wall time per pipeline stage, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str, explain: bool = True) -> Iterator[None]:
        """Time the enclosed block under ``name``.

        With ``explain``, a ``DeployOptError`` raised inside says which stage failed and how long the run had
        gone on: an error after minutes of work explains itself (loading the config needs no such preface).
        """
        start = time.perf_counter()
        try:
            yield
        except DeployOptError as exc:
            if explain and not getattr(exc, "stage_named", False):
                spent, total = time.perf_counter() - start, time.perf_counter() - self.started
                exc.args = (
                    f"stage '{name}' failed after {_minutes(spent)} (the run had taken {_minutes(total)}): "
                    f"{one_line(exc)}",
                )
                exc.stage_named = True  # type: ignore[attr-defined]
            raise
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def _minutes(seconds: float) -> str:
    """``42 s`` or ``3 min 05 s``."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


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
