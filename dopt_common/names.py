"""Names that become paths, and values that appear in messages: one guard for each.

A run name (build, quantize-llm, train, train search, prune) is one path component under the output folder, so
``--name ../victim`` or ``/abs/dir`` can never replace a folder outside it. A value quoted in an error is cut,
so a YAML anchor bomb or a 50 MB string cannot become a 300 MB message.
"""

from __future__ import annotations

import os
import re
import reprlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from dopt_common.errors import ConfigError

MAX_NAME = 128  # characters in a run name
MAX_SHOWN = 200  # characters of a value quoted in an error


def shown(value: object, limit: int = MAX_SHOWN, quote: bool = False) -> str:
    """``value`` for a message (a string as is unless ``quote``, anything else as its repr), cut to ``limit``
    characters. The repr is bounded as it is made (``reprlib``), so a nested list of a billion items costs
    nothing to show."""
    if isinstance(value, str) and not quote:
        text = value
    else:
        bounded = reprlib.Repr()  # attributes, not keywords: Python 3.11's Repr takes none
        bounded.maxlevel = 3
        for name in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
            setattr(bounded, name, 8)
        bounded.maxstring = bounded.maxlong = bounded.maxother = limit
        text = bounded.repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def check_run_name(name: object, what: str = "name") -> str:
    """``name`` when it is one plain path component (no separator, ``..``, NUL or leading dot, 1–128 characters);
    otherwise a ConfigError naming the rule that failed."""
    rule = _broken_rule(name)
    if rule is None:
        return str(name)
    raise ConfigError(
        f"{what} {shown(name, 60)!r} {rule}: a run name is one folder name under the output folder; fix: use "
        f"letters, digits, '-', '_' or '.', at most {MAX_NAME} characters"
    )


def _broken_rule(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "is empty or not text"
    if "\x00" in name:
        return "contains a NUL byte"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long (at most {MAX_NAME})"
    if any(sep in name for sep in ("/", "\\", os.sep)) or (os.altsep and os.altsep in name):
        return "contains a path separator"
    if name in (".", "..") or name.startswith("."):
        return "starts with '.' (hidden, or a parent folder)"
    if any(ord(c) < 32 for c in name):
        return "contains a control character"
    return None


def run_dir(output_root: str | os.PathLike[str], name: object, what: str = "name") -> Path:
    """``output_root/name`` after ``check_run_name``: the only way a pipeline turns a name into its folder."""
    return Path(output_root) / check_run_name(name, what)


QUOTED = re.compile("'([^'\\n]{" + str(MAX_SHOWN + 1) + ",})'")


def shorten_quoted(message: str, limit: int = MAX_SHOWN) -> str:
    """``message`` with every quoted value (a path, a name) longer than ``limit`` cut to ``limit`` characters and
    its length said: the CLI's last guard, so no error line quotes a 5,000-character path whole."""
    return QUOTED.sub(lambda m: f"'{shown(m.group(1), limit)}'", message)


def named_counts(groups: Iterable[tuple[str, Sequence[str]]], first: int = 3) -> list[str]:
    """``"<label>: a, b, c … (12)"`` for each non-empty ``(label, names)`` group: its first ``first`` names, an
    ellipsis when there are more, and how many there are (a mismatch summary's parts)."""
    return [
        f"{label}: {', '.join(names[:first])}{' …' if len(names) > first else ''} ({len(names)})"
        for label, names in groups
        if names
    ]
