"""What every pipeline (build, quantize-llm, train) shares: the staged output folder, stage timings, seeding.

``staged_dir`` is the one way a pipeline publishes: everything is assembled in a hidden folder beside the target
and swapped in whole when the run finishes, so no failure or kill leaves half an artifact or touches the
previous one. Names starting with "." inside the stage are working files and are dropped before the swap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dopt_common.errors import DeployOptError, Interrupted, OutputError, one_line
from dopt_common.files import check_replaceable_dir, open_nofollow, replace_dir
from dopt_common.ownership import (
    MARKER,
    MOVING,
    Owner,
    check_target,
    new_owner,
    read_marker,
    recover_published,
    run_kind,
    this_host,
    write_marker,
)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def staged_dir(
    out_dir: Path, wait: bool = False, divert: Callable[[], bool] | None = None, kind: str = "build"
) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``out_dir``; on a clean exit it replaces ``out_dir`` whole.

    ``kind``: the run's kind (build, llm, sensitivity). ``out_dir`` (and ``failed_dir(out_dir)``) may only be
    absent, empty, or a run of that kind that deploy_opt wrote (``ownership.check_target``): anything else is
    refused before any work. The stage and the published folder carry the marker that proves who wrote them.

    ``divert``, asked at publish time: when it answers True (a failing build, and ``out_dir`` holds a passing
    one), the stage goes to ``failed_dir(out_dir)`` instead and ``out_dir`` stays as it is. A run that publishes
    to ``out_dir`` removes an older ``failed_dir``: it no longer describes the folder beside it.

    One run per report name at a time (a lock file beside it; ``wait``: wait for the other run); leftovers that
    this host's dead runs marked (``.<name>.partial-<pid>``, ``.old-``, ``.incoming-``) are removed first.
    """
    out_dir = check_replaceable_dir(check_target(out_dir, kind))
    check_target(failed_dir(out_dir), kind)
    owner = new_owner(kind)
    stage = out_dir.parent / f".{out_dir.name}.partial-{owner.pid}"
    with report_lock(out_dir, wait):
        if recover_published(out_dir.parent, out_dir.name, _moved_by_gone) is not None:
            log.warning("restored '%s': an earlier run was killed while publishing it", out_dir)
        sweep_stale(out_dir.parent)
        _make_stage(stage, owner)
        try:
            yield stage
            _publish(stage, out_dir, owner, divert)
        finally:
            if read_marker(stage) is not None:  # ours: a stage that lost its marker is left, never guessed at
                shutil.rmtree(stage, ignore_errors=True)


def _make_stage(stage: Path, owner: Owner) -> None:
    if os.path.lexists(stage):  # this pid's own: a marked leftover of an earlier process with our pid
        if read_marker(stage) is None:
            raise OutputError(f"'{stage}' exists and is not deploy_opt's; fix: move it away")
        shutil.rmtree(stage)
    try:
        stage.mkdir(parents=True)
        write_marker(stage, dataclasses.replace(owner, kind=f"stage:{owner.kind}"))
    except OSError as exc:
        raise OutputError(f"cannot create '{stage}': {exc.strerror}; fix: choose a writable --output-dir") from exc


def _publish(stage: Path, out_dir: Path, owner: Owner, divert: Callable[[], bool] | None) -> None:
    """Drop the stage's working files, mark it as ``owner``'s run and swap it in (or into ``failed_dir``)."""
    for working in stage.glob(".*"):
        if working.name != MARKER:
            shutil.rmtree(working) if working.is_dir() and not working.is_symlink() else working.unlink()
    write_marker(stage, owner)  # the stage's marker becomes the run's
    target = failed_dir(out_dir) if divert is not None and divert() else out_dir
    check_target(target, owner.kind)  # again: the folder may have changed while the run worked
    claimed = _claim(target, owner)
    try:
        replace_dir(stage, target)
    except Interrupted as exc:  # held off during the swap, delivered right after it: the build is live
        exc.published = target
        raise
    except OSError as exc:
        if claimed:
            (target / MOVING).unlink(missing_ok=True)
        raise OutputError(
            f"cannot publish '{out_dir}': {exc.strerror}; the previous '{out_dir.name}' is unchanged; "
            "fix: choose a writable --output-dir (not a mount point itself)"
        ) from exc
    failed = failed_dir(out_dir)
    if target == out_dir and run_kind(failed) == owner.kind:
        shutil.rmtree(failed, ignore_errors=True)


def _claim(target: Path, owner: Owner) -> bool:
    """Mark the run ``target`` as being moved aside by this process, so that only a gone mover's ``.old-``
    folder is ever restored or swept. False when there is nothing to move."""
    if not target.is_dir() or target.is_symlink():
        return False
    write_marker(target, owner, MOVING)
    return True


def failed_dir(out_dir: Path) -> Path:
    """Where a failing run lands when ``out_dir`` holds the last passing one: ``<name>.failed/`` beside it."""
    return out_dir.with_name(f"{out_dir.name}.failed")


@contextlib.contextmanager
def report_lock(out_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``out_dir`` for the run; a second run of the same name fails at once, or
    with ``wait`` waits for the first to finish. The file is removed on release, so no run leaves it behind.
    It is opened without following links and must be a regular file: a planted link writes nothing elsewhere."""
    path = out_dir.parent / f".{out_dir.name}.lock"
    fd = _locked(path, out_dir, wait)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {this_host()}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                path.unlink()  # still holding the lock: a waiter then finds its file gone and retries
        os.close(fd)


def _locked(path: Path, out_dir: Path, wait: bool) -> int:
    """An open, flock-ed descriptor on ``path``: the file that is at ``path`` now (not one a releaser unlinked)."""
    import fcntl

    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create '{path}': {exc.strerror}; fix: choose a writable --output-dir") from exc
        fd = open_nofollow(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            owner = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise OutputError(
                f"'{out_dir}' is being written by {owner}; fix: build with --wait to wait for it, or use another "
                "name (--set name=...)"
            ) from None
        try:
            current = os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # the holder removed this file as it finished: lock the new one


STALE = re.compile(r"^\..+\.(partial|old|incoming)-(\d+)$")


def _moved_by_gone(entry: Path) -> bool:
    """An ``.old-<pid>`` folder whose mover (its claim) is this host's pid from the name, and is gone."""
    mover = read_marker(entry, MOVING)
    return mover is not None and str(mover.pid) == entry.name.rsplit("-", 1)[1] and mover.gone()


def _staged_by_gone(entry: Path) -> bool:
    """A ``.partial-<pid>`` or ``.incoming-<pid>`` folder whose writer is this host's pid from the name, gone."""
    owner = read_marker(entry)
    return owner is not None and str(owner.pid) == entry.name.rsplit("-", 1)[1] and owner.gone()


def _drop_free_lock(path: Path) -> bool:
    """Remove a run's lock file that no process holds (its run was killed): taken, then unlinked while held, as
    a run's own release does, so a run that opens it meanwhile retries on a fresh file. Only a regular file
    whose content is a run's ("pid N host H") is touched."""
    import fcntl

    try:
        fd = open_nofollow(path, os.O_RDWR)
    except OutputError:
        return False
    try:
        if not os.pread(fd, 64, 0).startswith(b"pid "):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
            return False
        path.unlink()
        return True
    except OSError:  # held by a live run (BlockingIOError), or gone meanwhile
        return False
    finally:
        os.close(fd)


def sweep_stale(folder: Path) -> list[Path]:
    """Remove the leftovers of this host's dead runs: ``.<name>.partial-<pid>``, ``.incoming-<pid>`` and
    ``.old-<pid>`` folders whose marker proves deploy_opt wrote them and names a process that no longer runs here.
    A complete ``.old-`` whose run folder is missing is renamed back instead. Anything else, a look-alike name
    without our marker or a folder of another host's run, is left as it is."""
    removed = [lock for lock in sorted(folder.glob(".*.lock")) if folder.is_dir() and _drop_free_lock(lock)]
    for entry in sorted(folder.glob(".*-*")) if folder.is_dir() else ():
        match = STALE.match(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir():
            continue
        if not (_moved_by_gone(entry) if match.group(1) == "old" else _staged_by_gone(entry)):
            log.debug("left '%s': not a leftover of a gone deploy_opt run on this host", entry)
            continue
        name = entry.name[1 : -len(f".{match.group(1)}-{match.group(2)}")]
        if match.group(1) == "old" and recover_published(folder, name, _moved_by_gone) is not None:
            log.warning("restored '%s': an earlier run was killed while publishing it", folder / name)
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    if removed:
        log.info("removed %d leftover(s) of interrupted runs in %s", len(removed), folder)
    return removed


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
