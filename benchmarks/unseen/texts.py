"""Real text that is already on disk, for the unseen-model fixtures (no download).

Two sources that read very differently, so calibration and evaluation never share a domain:

- ``license_sentences()``: prose from Debian's license texts in ``/usr/share/common-licenses``.
- ``comment_sentences()``: the ``#`` comments of the Python standard library's top-level modules.

Both are deterministic for a given machine image (sorted files, de-duplicated, seeded shuffle).
"""

from __future__ import annotations

import functools
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

LICENSE_DIR = Path("/usr/share/common-licenses")
SEED = 0
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?;:])\s+")
_COMMENT = re.compile(r"^\s*#+\s?(.*)$")
_LEGAL = re.compile(r"licen[cs]e|copyright|warrant", re.IGNORECASE)


def wrap(text: str, font: Any, width: int) -> list[str]:
    """``text``'s words in lines no wider than ``width`` pixels in ``font`` (a PIL font; a word wider than that
    gets a line of its own)."""
    lines, current = [], ""
    for word in text.split():
        trial = f"{current} {word}".strip()
        if current and font.getlength(trial) > width:
            lines.append(current)
            current = word
        else:
            current = trial
    return lines + ([current] if current else [])


def _is_prose(sentence: str, min_words: int, max_words: int) -> bool:
    words = sentence.split()
    letters = sum(c.isalpha() or c.isspace() for c in sentence)
    return min_words <= len(words) <= max_words and letters >= 0.85 * len(sentence)


def _sentences(blocks: list[str], min_words: int = 5, max_words: int = 40) -> list[str]:
    """Split text blocks into unique, prose-looking sentences, in order."""
    seen: set[str] = set()
    out: list[str] = []
    for block in blocks:
        for raw in _SENTENCE_SPLIT.split(" ".join(block.split())):
            if raw not in seen and _is_prose(raw, min_words, max_words):
                seen.add(raw)
                out.append(raw)
    return out


def _shuffled(items: list[str]) -> list[str]:
    random.Random(SEED).shuffle(items)
    return items


@functools.lru_cache(maxsize=1)
def _license_sentences() -> tuple[str, ...]:
    if not LICENSE_DIR.is_dir():
        raise FileNotFoundError(f"{LICENSE_DIR} is missing (Debian's base-files ships it)")
    # Symlinks (GPL -> GPL-3, ...) are aliases; reading them would only add duplicates.
    files = sorted(p for p in LICENSE_DIR.iterdir() if p.is_file() and not p.is_symlink())
    paragraphs = [para for p in files for para in p.read_text(encoding="utf-8", errors="replace").split("\n\n")]
    return tuple(_shuffled(_sentences(paragraphs)))


def license_sentences(limit: int | None = None) -> list[str]:
    """Sentences from the Debian license texts, shuffled with a fixed seed."""
    return list(_license_sentences()[:limit])


def _comment_blocks(path: Path) -> list[str]:
    """Runs of consecutive ``#`` comment lines in one source file, each joined into one block."""
    blocks: list[str] = []
    current: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _COMMENT.match(line)
        if match and not line.lstrip().startswith("#!"):
            current.append(match.group(1))
        elif current:
            blocks.append(" ".join(current))
            current = []
    if current:
        blocks.append(" ".join(current))
    return blocks


@functools.lru_cache(maxsize=1)
def _comment_sentences() -> tuple[str, ...]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    blocks = [block for path in sorted(stdlib.glob("*.py")) for block in _comment_blocks(path)]
    # File headers quote license terms: keep them out so this source shares nothing with the license one.
    blocks = [b for b in blocks if not _LEGAL.search(b)]
    return tuple(_shuffled(_sentences(blocks)))


def comment_sentences(limit: int | None = None) -> list[str]:
    """Sentences from the comments of Python's standard library, shuffled with a fixed seed."""
    return list(_comment_sentences()[:limit])
