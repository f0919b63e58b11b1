"""``python -m deploy_opt``: build, sensitivity, gate, align, scales, compat and profiles.

Exit codes: 0 success, 1 a gate failed, 2 bad input (one line on stderr naming what, which value and the fix),
3 an internal error (a bug; ``-v`` shows the traceback), 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM.
An interrupted run removes its staging folder and leaves the previous report as it was.
"""

from __future__ import annotations

import errno
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from deploy_opt.cli import analysis, build, llm, report, train
from deploy_opt.cli.parser import make_parser
from dopt_common.errors import DeployOptError, Interrupted, one_line
from dopt_common.names import shorten_quoted, shown

log = logging.getLogger("deploy_opt")
FIRST_PARTY = ("deploy_opt", "calibrators", "exporters", "dopt_common")
NOISY_LOGGERS = (
    *("onnx_ir", "onnxscript", "torch.onnx", "torch._dynamo", "torch.export"),
    *("torchao", "torch.utils._pytree"),
)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = make_parser().parse_args(argv)
    level = logging.WARNING if args.quiet else logging.INFO
    # Module paths are for debugging: a user reads "INFO calibration: ...", -v adds where it came from.
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s" if args.verbose else "%(levelname)s %(message)s"
    )
    if args.verbose:  # our own debug lines; other libraries' (matplotlib's font search, ...) stay at INFO
        for ours in FIRST_PARTY:
            logging.getLogger(ours).setLevel(logging.DEBUG)
    # Warnings a CPU user cannot act on: torchao's CUDA libraries that do not load, torch's pytree deprecations
    # (torchao registers enums the old way). -v shows them.
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING if args.verbose else logging.ERROR)
    if args.command is None:
        make_parser().print_help()
        return 2
    in_main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    # Both signals arrive as Interrupted, so a KeyboardInterrupt seen anywhere was raised by user code (exit 2).
    signals = (signal.SIGTERM, signal.SIGINT) if in_main else ()
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in signals}
    try:
        return _run(args, _commands())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _commands() -> dict[str, Callable]:
    return {
        "init": build.cmd_init,
        "build": build.cmd_build,
        "sensitivity": build.cmd_sensitivity,
        "gate": report.cmd_gate,
        "report": report.cmd_report,
        "align": analysis.cmd_align,
        "scales": analysis.cmd_scales,
        "compat": analysis.cmd_compat,
        "quantize-llm": llm.cmd_quantize_llm,
        "serve": llm.cmd_serve,
        "train": train.cmd_train,
        "profiles": build.cmd_profiles,
    }


LOW_SPACE = 64 << 20  # bytes free under which a failed write is taken for a full disk


def resource_fault(exc: BaseException, output_dir: object) -> str | None:
    """One line for a resource fault (ENOSPC, EDQUOT, EMFILE), naming the path and the free space; else None.

    A library that writes a file and reads it back may see the full disk only as a corrupt file ("DecodeError:
    Wire format was corrupt"), so any failure while the output folder has under 64 MiB free counts as one.
    """
    faults = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.EMFILE: "too many open files",
    }
    chain = [exc, exc.__cause__, exc.__context__]
    code = next((e.errno for e in chain if isinstance(e, OSError) and e.errno in faults), None)
    path = next((e.filename for e in chain if isinstance(e, OSError) and e.filename), None) or output_dir or "."
    free = _free_bytes(Path(str(path)))
    if code is None and (free is None or free >= LOW_SPACE):
        return None
    what = faults.get(code or errno.ENOSPC)
    room = f"{free / 2**20:.0f} MiB free there" if free is not None else "free space unknown"
    fix = "raise the limit (ulimit -n)" if code == errno.EMFILE else "free space or pass another --output-dir"
    return f"{what} writing under '{shown(str(path), 200)}' ({room}; {type(exc).__name__}); fix: {fix}"


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def _raise_interrupted(signum: int, _frame: object) -> None:
    # One signal interrupts the run; a copy (the same SIGTERM sent to the whole process group, which the
    # supervisor also forwards) must not cut the cleanup short. main() restores the handlers when it returns.
    for other in (signal.SIGTERM, signal.SIGINT):
        signal.signal(other, _ignore_repeat)
    raise Interrupted(signum)


def _ignore_repeat(_signum: int, _frame: object) -> None:
    log.debug("a second interrupting signal ignored: the run is already stopping")


def _run(args: object, commands: dict[str, Callable]) -> int:
    """The command, with every outcome mapped to its exit code and one line on stderr."""
    command = getattr(args, "command", "")
    try:
        return commands[command](args)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        published = getattr(exc, "published", None)
        outcome = (
            f"after publishing '{published}', which is the new, complete build"
            if published
            else "staging removed, no partial report left"
        )
        print(f"deploy_opt {command}: interrupted ({name}); {outcome}", file=sys.stderr)
        return 128 + int(signum)
    except DeployOptError as exc:
        print(f"deploy_opt {command}: error: {shown(shorten_quoted(one_line(exc)), 2000)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, ours or in user code: never exit 1, which means "gate failed"
        log.debug("traceback", exc_info=True)
        fault = resource_fault(exc, getattr(args, "output_dir", None))
        if fault is not None:  # disk full, quota, too many open files: the machine, not a bug
            print(f"deploy_opt {command}: error: {fault}", file=sys.stderr)
            return 2
        print(
            f"deploy_opt {command}: internal error: {type(exc).__name__}: {exc} (rerun with -v for the traceback)",
            file=sys.stderr,
        )
        return 3
