"""Atomic writes and hashing: a crash never leaves half an artifact."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dopt_common.errors import ConfigError, InputError, OutputError
from dopt_common.names import shown
from dopt_common.signals import signals_held


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    final = check_output_file(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    except OSError as exc:
        raise OutputError(f"cannot write '{final}': {exc.strerror}; fix: choose a writable output folder") from exc
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600; an artifact should get the usual permissions (0666 minus the umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    finally:
        tmp_path.unlink(missing_ok=True)


def save_png(fig: Any, path: str | os.PathLike[str], dpi: float | None = None) -> Path:
    """Write a matplotlib figure to ``path`` as PNG atomically (``dpi`` None: matplotlib's default) and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)
    return Path(path)


# Called with each step's name between the filesystem steps of a publish; tests set it to kill the process there
# (fault injection by step, not by timing). None in normal runs.
STEP_HOOK: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def replace_dir(staging: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Swap a finished ``staging`` folder in for ``target``, whole.

    Whatever fails, ``target`` is afterwards either the complete old folder or the complete new one: the old
    folder is renamed aside (``.<name>.old-<pid>``), the new one renamed in, and only then is the old one removed;
    if the second rename fails, the old folder is renamed back. A kill between the two renames leaves no
    ``target`` but a complete ``.old-<pid>``, which ``recover_published`` renames back at the next start. A
    ``staging`` on another filesystem is first copied beside ``target`` (renames never cross filesystems). A
    ``target`` that is itself a mount point cannot be renamed: that fails before anything moved. SIGINT and
    SIGTERM are held off from the first rename to the end, so an interrupt lands after the swap, never inside.
    """
    staging, target = Path(staging), Path(target)
    incoming = staging
    if _device(staging) != _device(target.parent):
        incoming = target.with_name(f".{target.name}.incoming-{os.getpid()}")
        shutil.rmtree(incoming, ignore_errors=True)
        try:
            shutil.copytree(staging, incoming, symlinks=True)
        except OSError:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        _step("copied")
    old = target.with_name(f".{target.name}.old-{os.getpid()}") if os.path.lexists(target) else None
    with signals_held():
        try:
            if old is not None:
                os.rename(target, old)
                _step("renamed-old")
            try:
                os.rename(incoming, target)
            except OSError:
                if old is not None:
                    os.rename(old, target)  # the previous folder goes back, untouched
                raise
            _step("renamed-new")
        finally:
            if incoming != staging:
                shutil.rmtree(incoming, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            _step("removed-old")
    return target


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh folder under the system temp folder for the block, removed when it ends however it ends.

    Unlike ``tempfile.TemporaryDirectory``, an interrupting signal (SIGINT, SIGTERM) cannot leave it behind: the
    folder is made and removed with those signals held, and is named before a held signal is raised.
    """
    made: Path | None = None
    try:
        with signals_held():
            made = Path(tempfile.mkdtemp(prefix=prefix))
        yield made
    finally:
        if made is not None:
            with signals_held():
                shutil.rmtree(made, ignore_errors=True)


def _device(path: Path) -> int:
    return os.stat(path).st_dev


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON atomically, indented and with a trailing newline."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON document in ``path``; ``ConfigError`` ("cannot read <what> '<path>': ...") when it cannot be read
    or parsed. The reader of the documents ``write_json`` writes: scales.json and the exporters' encodings."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {what} '{path}': {exc}") from exc


KINDS = {
    stat.S_ISDIR: "a folder",
    stat.S_ISLNK: "a symbolic link",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISSOCK: "a socket",
}


def _kind(mode: int) -> str:
    return next((name for test, name in KINDS.items() if test(mode)), "not a regular file")


def lstat_mode(path: Path, verb: str, fix: str) -> int | None:
    """``path``'s mode, the path itself (a link is not followed), or None when nothing is there; anything else
    ``os.lstat`` raises is ``OutputError("cannot <verb> '<path>': <why>; fix: <fix>")``."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"cannot {verb} '{shown(str(path))}': {exc.strerror}; fix: {fix}") from exc


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """``path`` when a file may be written there: absent, or a regular file (never a link, device, FIFO or
    folder, which an atomic rename would replace: ``--out /dev/full`` must not turn the device into a file)."""
    final = Path(path)
    mode = lstat_mode(final, "write", "choose another path")
    if mode is None or stat.S_ISREG(mode):
        return final
    if stat.S_ISDIR(mode):
        raise OutputError(
            f"'{shown(str(final))}' is a folder; fix: give a file path (e.g. '{shown(str(final / final.name))}.json')"
        )
    raise OutputError(
        f"'{shown(str(final))}' is {_kind(mode)}, not a regular file; deploy_opt writes only regular files it can "
        "replace whole; fix: give a plain file path ('-' writes to standard output where the option allows it)"
    )


def regular_input(path: str | os.PathLike[str], what: str = "input file", max_bytes: int | None = None) -> Path:
    """``path`` when it is a readable regular file (a link to one is fine) of at most ``max_bytes``: a device
    (``/dev/zero``), a FIFO or a folder is refused before anything reads it, so no read can run forever."""
    source = Path(path)
    try:
        info = os.stat(source)
    except FileNotFoundError:
        raise InputError(f"{what} '{shown(str(source))}' does not exist; fix: check the path") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} '{shown(str(source))}': {exc.strerror}; fix: check the path") from exc
    if not stat.S_ISREG(info.st_mode):
        raise InputError(
            f"{what} '{shown(str(source))}' is {_kind(info.st_mode)}, not a regular file; fix: pass a file"
        )
    if max_bytes is not None and info.st_size > max_bytes:
        raise InputError(
            f"{what} '{shown(str(source))}' is {info.st_size:,} bytes, over the {max_bytes:,}-byte cap; "
            "fix: pass a smaller file"
        )
    return source


def open_nofollow(path: str | os.PathLike[str], flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o644) -> int:
    """A file descriptor for the regular file at ``path``, never through a symbolic link (``O_NOFOLLOW``) and
    never a device or FIFO (``O_NONBLOCK`` so opening a FIFO cannot hang; checked with fstat)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(
                f"'{shown(str(path))}' is a symbolic link; deploy_opt never writes through one; fix: remove the link"
            ) from exc
        raise OutputError(f"cannot open '{shown(str(path))}': {exc.strerror}; fix: check the folder") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OutputError(f"'{shown(str(path))}' is {_kind(info.st_mode)}, not a regular file; fix: remove it")
    os.set_blocking(fd, True)
    return fd


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_replaceable_dir(path: str | os.PathLike[str]) -> Path:
    """Refuse, before any work, a report folder that a finished run could not replace: a file, or read-only."""
    folder = Path(path)
    if os.path.lexists(folder) and not folder.is_dir():
        raise OutputError(f"'{folder}' exists and is not a folder; fix: move it away or choose another name")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(
            f"the existing report '{folder}' is read-only; fix: make it writable (chmod -R u+w) or choose another "
            "--output-dir"
        )
    return folder


def ensure_writable_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` if needed and prove a file can be written there, before any long work starts."""
    folder = Path(path)
    if os.path.lexists(folder) and not folder.is_dir():
        raise OutputError(
            f"output folder '{folder}' is a file, not a folder; fix: pass a folder with --output-dir (or move the "
            "file away)"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check."):
            pass
    except OSError as exc:
        raise OutputError(
            f"output folder '{folder}' is not writable ({exc.strerror}); fix: pass a writable folder "
            "with --output-dir or fix its permissions"
        ) from exc
    return folder
