"""The supervisor of ``python -m deploy_opt`` and ``deploy-opt``: the command runs in a forked child, so a run
that user code ends early (``os._exit`` in a factory, a kill) still ends with one line on stderr and an exit code
from the README's table, never a silent 0 with no report.

No code of ours runs after ``os._exit``, so only another process can tell that the run never finished. The child
writes its exit code into a pipe just before it exits; a child that ends without writing it did not finish.

Signals: the child stays in the parent's process group (a terminal's job control, stdin and Ctrl-Z keep working),
so Ctrl-C, which the terminal sends to the whole group, reaches it directly and the parent does not forward it.
The parent forwards SIGTERM, and a SIGINT sent with kill(2), to the child. When such a signal went to the whole
group (``kill -- -PGID``), the child gets a second copy; the CLI ignores it (once the first signal has
interrupted the run, the rest only wait for the cleanup). When the parent dies, the kernel sends the child SIGTERM
(PR_SET_PDEATHSIG), so a SIGKILLed parent leaves no orphan run: the child cleans up as after any SIGTERM (its
staging, its lock, Ray's local instance with all its processes) and ends. ``DEPLOY_OPT_NO_SUPERVISOR=1`` runs
the command in this process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable

FORWARDED = (signal.SIGINT, signal.SIGTERM)
WATCHED = {*FORWARDED, signal.SIGCHLD}
SI_KERNEL = 0x80  # si_code of a signal the kernel sent: Ctrl-C from the terminal, to the whole foreground group
PR_SET_PDEATHSIG = 1


def entry() -> int:
    """The ``deploy-opt`` console script: the CLI under the supervisor."""
    from dopt_common.clock import quiet_openmp

    quiet_openmp()  # before anything imports torch: libgomp reads its settings once
    from deploy_opt.cli import main

    return run_supervised(main)


def run_supervised(main: Callable[[], int]) -> int:
    """``main()`` in a forked child; its exit code, or 2 (128 + signal if killed) when it ended without one."""
    if os.environ.get("DEPLOY_OPT_NO_SUPERVISOR") == "1" or not hasattr(os, "fork") or sys.platform != "linux":
        return main()
    read_end, write_end = os.pipe()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)  # none may slip by between the fork and the wait
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        return _child(main, write_end, parent, old_mask)
    os.close(write_end)
    status = _wait_forwarding(pid)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    sent = _read_code(read_end)
    if sent is not None:
        return sent
    return _unfinished(status, _command(sys.argv[1:]))


def _wait_forwarding(pid: int) -> int:
    """Wait for the child, forwarding SIGTERM and kill(2)'s SIGINT to it; its wait status."""
    while True:
        info = signal.sigwaitinfo(WATCHED)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
        elif should_forward(info.si_signo, info.si_code):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, info.si_signo)


def should_forward(signum: int, si_code: int) -> bool:
    """SIGTERM always; SIGINT unless the terminal sent it, which reached the child in the same group already."""
    return signum == signal.SIGTERM or (signum == signal.SIGINT and si_code != SI_KERNEL)


def _read_code(read_end: int) -> int | None:
    """The code the child sent, or None. Read without waiting: a grandchild forked by a library may hold the
    pipe's write end open long after the child is gone."""
    os.set_blocking(read_end, False)
    try:
        data = os.read(read_end, 64)
    except BlockingIOError:
        data = b""
    finally:
        os.close(read_end)
    text = data.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _unfinished(status: int, command: str) -> int:
    """The line for a child that ended without sending its code, and the exit code that says so."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        how, code = f"killed by {_signal_name(signum)}", 128 + signum
    else:
        how, code = f"exit status {os.waitstatus_to_exitcode(status)}", 2
    print(
        f"deploy_opt{' ' + command if command else ''}: error: the process ended without finishing (os._exit or a "
        f"kill in user code?), {how}; fix: let the model, data and metric functions the config names return or "
        "raise instead of calling os._exit; if nothing did, look for what killed it (out of memory: dmesg)",
        file=sys.stderr,
    )
    return code


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _command(argv: list[str]) -> str:
    """The subcommand's name for the message: the first argument that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def _child(main: Callable[[], int], write_end: int, parent: int, old_mask: set) -> int:
    """Run ``main`` in the child and send its exit code to the parent just before returning it."""
    _die_with(parent)
    for signum in FORWARDED:  # before main's own handlers: a signal while it imports still ends the run cleanly
        signal.signal(signum, _interrupt)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    code = _exit_code(main)
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # a late copy of a signal must not cut the hand-over
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError):  # EPIPE: the parent is gone (killed), no one reads the code
        os.write(write_end, f"{code}\n".encode())
    os.close(write_end)
    return code


def _exit_code(main: Callable[[], int]) -> int:
    """``main()``'s code, with SystemExit (argparse's usage errors, ``--help``) and a stray exception mapped."""
    from dopt_common.errors import Interrupted

    try:
        return int(main() or 0)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"deploy_opt: interrupted ({_signal_name(exc.signum)}) before the run started", file=sys.stderr)
        return 128 + int(exc.signum)
    except BaseException:  # noqa: BLE001  (the CLI maps every error itself; this is a bug of ours)
        traceback.print_exc()
        return 3


def _interrupt(signum: int, _frame: object) -> None:
    from dopt_common.errors import Interrupted

    raise Interrupted(signum)


def _die_with(parent: int) -> None:
    """Have the kernel SIGTERM this child when the parent dies (a SIGTERM it cleans up after, where SIGKILL would
    orphan Ray's agents for a minute); exit at once if the parent is already gone."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + int(signal.SIGKILL))
