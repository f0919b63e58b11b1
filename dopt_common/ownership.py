"""Who wrote a folder: the marker every folder deploy_opt stages or publishes carries, and the rules that follow.

deploy_opt deletes or replaces only what it provably wrote. Proof is ``.deploy_opt.json`` inside the folder: the
kind of run, a run id, the host and the pid of the process that wrote it. A leftover (``.<name>.partial-<pid>``,
``.old-``, ``.incoming-``) is swept only when its marker names this host and a process that no longer runs; a
folder on shared storage that another node is writing is never touched. A target folder that is not a run of the
same kind (no marker, and no record of that kind from an earlier release) is never replaced.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dopt_common.errors import OutputError
from dopt_common.files import lstat_mode
from dopt_common.names import shown

MARKER = ".deploy_opt.json"  # in every staged and published folder: who wrote it
MOVING = ".deploy_opt.moving.json"  # in a published folder while a publish renames it aside: who moves it
FORMAT = "deploy_opt.owner/1"
# The record each kind of run published before markers existed (a release before this one): proof enough.
LEGACY_RECORDS = {
    "build": ("build.json", "deploy_opt.build/"),
    "llm": ("quantize_report.json", "deploy_opt.llm_quantize/"),
    "sensitivity": ("sensitivity.json", "deploy_opt."),
}
MAX_MARKER = 64 << 10  # bytes: a marker is a few lines; anything larger is not ours


@dataclass(frozen=True)
class Owner:
    """The process that wrote a folder: ``kind`` (build, llm, sensitivity; ``stage:<kind>`` while staging)."""

    kind: str
    run_id: str
    host: str
    pid: int

    def to_json(self) -> dict[str, object]:
        """The marker's content."""
        return {"format": FORMAT, "kind": self.kind, "run_id": self.run_id, "host": self.host, "pid": self.pid}

    def gone(self) -> bool:
        """Provably no longer running: written on this host by a process that is not alive (another host's
        process can never be proved gone from here, so its folders are left alone)."""
        return self.host == this_host() and not pid_alive(self.pid)


def this_host() -> str:
    """This machine's name, as markers record it."""
    return socket.gethostname()


def new_owner(kind: str) -> Owner:
    """An owner record for this process and a fresh run id."""
    return Owner(kind=kind, run_id=uuid.uuid4().hex, host=this_host(), pid=os.getpid())


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this host (a pid we may not signal counts as alive)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return True  # never "dead": 0 and negatives address process groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_marker(folder: Path, owner: Owner, name: str = MARKER) -> Path:
    """Write ``owner`` into ``folder`` (a plain file, never through a link: the folder is ours and fresh)."""
    from dopt_common.files import write_json

    return write_json(folder / name, owner.to_json())


def read_marker(folder: Path, name: str = MARKER) -> Owner | None:
    """The owner recorded in ``folder``, or None: a folder that is a link, a marker that is not a small regular
    file, or one that does not parse as ours proves nothing."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        info = os.lstat(folder / name)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MARKER:
            return None
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    kind, run_id, host, pid = (data.get(k) for k in ("kind", "run_id", "host", "pid"))
    if not all(isinstance(v, str) for v in (kind, run_id, host)) or not isinstance(pid, int):
        return None
    return Owner(kind=kind, run_id=run_id, host=host, pid=pid)


def run_kind(folder: Path) -> str | None:
    """The kind of deploy_opt run ``folder`` holds (its marker, or an earlier release's record), else None."""
    owner = read_marker(folder)
    if owner is not None:
        return owner.kind
    for kind, (record, prefix) in LEGACY_RECORDS.items():
        if _record_format(folder / record).startswith(prefix):
            return kind
    return None


def _record_format(path: Path) -> str:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return ""
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return ""
    found = data.get("format") if isinstance(data, dict) else None
    return found if isinstance(found, str) else ""


def check_target(folder: Path, kind: str) -> Path:
    """Refuse, before any work, a target that publishing would replace but deploy_opt did not write: a link, a
    file, or a folder that is neither empty nor a ``kind`` run. Returns ``folder``."""
    mode = lstat_mode(folder, "check", "check the folder")
    if mode is None:
        return folder
    where = shown(str(folder))
    if stat.S_ISLNK(mode):
        raise OutputError(
            f"'{where}' is a symbolic link; deploy_opt never replaces one; fix: remove the link or choose another name"
        )
    if not stat.S_ISDIR(mode):
        raise OutputError(f"'{where}' exists and is not a folder; fix: move it away or choose another name")
    found = run_kind(folder)
    if found == kind or (found is None and not any(folder.iterdir())):
        return folder
    what = f"a deploy_opt {found} run, not a {kind} run" if found else "not a folder deploy_opt wrote"
    raise OutputError(
        f"'{where}' exists and is {what}; deploy_opt replaces only its own {kind} runs; fix: move it away or "
        "choose another name (--set name=... or --name)"
    )


def check_separate(out_dir: Path, held: list[Path], read_folders: list[Path]) -> None:
    """Refuse a run folder that holds an input (``held``: the model, the data, the config's folder), or an output
    root inside a folder the run reads as data (``read_folders``: its report would be read back as a class or a
    sample): either would destroy or corrupt what the run reads."""
    target = out_dir.resolve()
    root = target.parent
    inputs = [source for source in held if source.resolve().is_relative_to(target)]
    data = [source for source in read_folders if root.is_relative_to(source.resolve())]
    if inputs:
        raise OutputError(
            f"the run folder '{shown(str(out_dir))}' holds the input '{shown(str(inputs[0]))}', which publishing "
            "would replace; fix: choose another --output-dir or name"
        )
    if data:
        raise OutputError(
            f"the output folder '{shown(str(root))}' is inside the data folder '{shown(str(data[0]))}': the report "
            "would be read back as data; fix: choose an --output-dir outside it"
        )


def recover_published(folder: Path, name: str, moved_by_gone: Callable[[Path], bool]) -> Path | None:
    """Undo a publish killed between its renames: ``folder/name`` is missing and a ``.<name>.old-<pid>`` whose
    mover is provably gone (``moved_by_gone``) is there, so that (complete) previous folder is renamed back, and
    its claim removed. Returns it, or None.

    Runs before any sweep, so the last complete report is never deleted as a leftover.
    """
    target = folder / name
    if os.path.lexists(target):
        return None
    prefix = f".{name}.old-"
    candidates = [
        e
        for e in folder.glob(f"{glob.escape(prefix)}*")
        if e.name[len(prefix) :].isdigit() and not e.is_symlink() and e.is_dir() and moved_by_gone(e)
    ]
    if not candidates:
        return None
    newest = max(candidates, key=lambda e: e.stat().st_mtime)
    os.rename(newest, target)
    (target / MOVING).unlink(missing_ok=True)
    return target
