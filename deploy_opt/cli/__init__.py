"""``python -m deploy_opt``: build, sensitivity, gate, align, scales, compat and profiles.

Exit codes: 0 success, 1 a gate failed, 2 bad input (one line on stderr naming what, which value and the fix),
3 an internal error (a bug; ``-v`` shows the traceback), 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM.
An interrupted run removes its staging folder and leaves the previous report as it was.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable

from deploy_opt.cli import analysis, build, llm, report, train
from deploy_opt.cli.parser import make_parser
from dopt_common.errors import DeployOptError, Interrupted

log = logging.getLogger("deploy_opt")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = make_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("onnx_ir", "onnxscript", "torch.onnx", "torch._dynamo", "torch.export"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING) if args.verbose else logging.ERROR)
    if args.command is None:
        make_parser().print_help()
        return 2
    in_main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main else None
    try:
        return _run(args, _commands())
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _commands() -> dict[str, Callable]:
    return {
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


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _run(args: object, commands: dict[str, Callable]) -> int:
    """The command, with every outcome mapped to its exit code and one line on stderr."""
    command = getattr(args, "command", "")
    try:
        return commands[command](args)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"deploy_opt {command}: interrupted ({name}); staging removed, no partial report left", file=sys.stderr)
        return 128 + int(signum)
    except DeployOptError as exc:
        print(f"deploy_opt {command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, ours or in user code: never exit 1, which means "gate failed"
        log.debug("traceback", exc_info=True)
        print(
            f"deploy_opt {command}: internal error: {type(exc).__name__}: {exc} (rerun with -v for the traceback)",
            file=sys.stderr,
        )
        return 3
