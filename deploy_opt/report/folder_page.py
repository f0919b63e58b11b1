"""``python -m deploy_opt report DIR``: (re)write ``DIR/report.html`` from the JSON a run left there.

The kind is read from the folder: ``build.json`` (a build), ``quantize_report.json`` (an LLM run),
``train_log.jsonl`` (a training run) or ``search.json`` (a search, whose page is its ``search.html``, copied).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from dopt_common.errors import InputError, ReportError, one_line
from dopt_common.names import shown

log = logging.getLogger(__name__)

KINDS = ("build.json", "quantize_report.json", "train_log.jsonl", "search.json")


def write_report_page(folder: str | Path) -> Path:
    """The page for whatever run ``folder`` holds; InputError naming the files looked for when it holds none,
    ReportError when a record there is truncated or malformed (exit 2, never an internal error)."""
    try:
        return _write_page(Path(folder))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError, UnicodeDecodeError, ...
        raise ReportError(
            f"a record in '{folder}' is truncated or malformed ({type(exc).__name__}: {shown(one_line(exc))}); fix: "
            "rebuild that run (its reports are written whole, so a damaged one was changed after the run)"
        ) from exc


def _write_page(folder: Path) -> Path:
    if not folder.is_dir():
        raise InputError(f"'{folder}' is not a folder; pass a build, quantize-llm, train or search output folder")
    if (folder / "build.json").is_file():
        from deploy_opt.report.build_page import write_build_page

        return write_build_page(folder)
    if (folder / "quantize_report.json").is_file():
        from deploy_opt.report.llm_train_pages import write_llm_page

        return write_llm_page(folder)
    if (folder / "train_log.jsonl").is_file():
        from deploy_opt.report.llm_train_pages import write_train_page

        return write_train_page(folder)
    if (folder / "search.json").is_file() and (folder / "search.html").is_file():
        target = folder / "report.html"
        shutil.copyfile(folder / "search.html", target)
        return target
    raise InputError(f"'{folder}' holds none of {', '.join(KINDS)}; fix: pass the folder a run wrote")
