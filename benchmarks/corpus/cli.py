"""The small command line that the corpus and unseen-model data scripts share.

Each script (``mobilenet.py``, ``doclayout.py``, ``orientation.py`` here; ``textdet.py``, ``textrec.py``,
``textdir.py`` in ``benchmarks/unseen/``) offers a few flags such as ``--prepare``, ``--check`` and
``--save-example``, each of which runs one action. A script lists its ``Flag``\\ s and calls ``run_flags``; the
scripts in ``unseen/`` load this file with ``sibling(CORPUS_CLI, "cli")``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One option and its action.

    Without ``metavar`` the flag is a switch and ``action()`` runs when it is given; with one it takes a value
    and ``action(value)`` runs. ``early`` flags run before the others, whatever their place in ``--help``.
    """

    name: str
    help: str
    action: Callable[..., object]
    metavar: str | None = None
    early: bool = False


def prepare_flag(prepare: Callable[[], Path], help: str) -> Flag:
    """``--prepare``: run ``prepare()`` and print where the model was copied."""
    return Flag("--prepare", help, lambda: print(f"copied {prepare()}"))


def run_flags(doc: str, flags: Sequence[Flag], argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (the command line when None) with ``flags``, described by ``doc``'s first line, and run them."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag in flags:
        if flag.metavar is None:
            parser.add_argument(flag.name, action="store_true", help=flag.help)
        else:
            parser.add_argument(flag.name, metavar=flag.metavar, help=flag.help)
    args = parser.parse_args(argv)
    for flag in sorted(flags, key=lambda f: not f.early):
        value = getattr(args, flag.name.lstrip("-").replace("-", "_"))
        if not value:
            continue
        if flag.metavar is None:
            flag.action()
        else:
            flag.action(value)


def run_model_check(
    doc: str,
    helps: tuple[str, str],
    prepare: Callable[[], Path],
    splits: tuple[Callable[[], Any], Callable[[], Any]],
    check: Callable[[Any, str, Any], None],
) -> None:
    """``--prepare`` writes the model and says where; ``--check`` does too, then opens it in ONNX Runtime and runs
    ``check(session, split, data)`` on the calibration and the evaluation data (``splits``, both made first).
    ``helps`` are the two flags' help texts."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help=helps[0])
    parser.add_argument("--check", action="store_true", help=helps[1])
    args = parser.parse_args()
    if args.prepare or args.check:
        model = prepare()
        print(f"wrote {model}")
    if args.check:
        from dopt_common.ort import create_session

        session = create_session(str(model))
        calibration, evaluation = splits
        for split, data in (("calibration", calibration()), ("evaluation", evaluation())):
            check(session, split, data)
