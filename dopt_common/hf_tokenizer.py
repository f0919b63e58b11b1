"""Loading a tokenizer, in one place: a ``tokenizer.json`` with ``tokenizers``, or a Hugging Face folder with
``transformers``' ``AutoTokenizer``.

A malformed ``tokenizer.json`` (cut short, no model, BPE merges of tokens not in the vocabulary) makes the Rust
library raise a bare ``Exception`` (a panic, a ``BaseException``); each becomes one ``InputError`` naming the file
and the fault (exit 2), never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import DeployOptError, InputError, one_line
from dopt_common.files import regular_input
from dopt_common.names import shown

FIX = "fix: save the tokenizer again with tokenizer.save_pretrained(folder) or point at an intact copy"


def load_tokenizer_file(path: str | os.PathLike[str], what: str, extra: str | None = None) -> Any:
    """The ``tokenizers.Tokenizer`` of a ``tokenizer.json``; ``what`` names the setting it came from."""
    regular_input(path, f"{what} tokenizer file")
    tokenizers = require("tokenizers", purpose=f"{what} (a tokenizer.json)", extra=extra)
    with _refused(Path(path), what):
        return tokenizers.Tokenizer.from_file(str(path))


def load_auto_tokenizer(folder: str | os.PathLike[str], what: str = "the model folder", **kwargs: Any) -> Any:
    """``transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)``."""
    transformers = require("transformers", purpose="loading a tokenizer", extra="llm")
    with _refused(Path(folder), what):
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)


@contextmanager
def _refused(path: Path, what: str) -> Iterator[None]:
    try:
        yield
    except DeployOptError:
        raise
    except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
        raise InputError(_message(path, what, exc)) from exc
    except BaseException as exc:  # a Rust panic is a BaseException; Ctrl-C and our Interrupted pass through
        if type(exc).__name__ != "PanicException":
            raise
        raise InputError(_message(path, what, exc)) from None


def _message(path: Path, what: str, exc: BaseException) -> str:
    return f"{what}: tokenizer '{path}' cannot be loaded ({type(exc).__name__}: {shown(one_line(exc), 200)}); {FIX}"
