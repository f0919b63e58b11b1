"""The default calibration corpus: offline text of several kinds, so no one domain decides the rounding.

``calibration.texts: [mixed]`` (the default) reads, on whatever machine it runs:

- ``python-docs``: the calibration split of ``pydoc_data.topics`` (the Python docs every interpreter ships);
- ``docstrings``: the docstrings of the standard library's modules, classes and functions (API prose);
- ``code``: the standard library's own source, comments and all (not in the default mix; see below);
- ``manpages``: English man pages (``/usr/share/man/man1..8``), their roff markup stripped, where installed;
- ``package-descriptions``: the long descriptions of the installed Python distributions (their README, from
  ``importlib.metadata``) and of Debian packages (``/var/lib/dpkg/status``), where installed.

Each domain is cut to ``DOMAIN_CHARS`` characters, its files taken in the order of a hash of their names, so the
corpus is the same on every run of one machine and does not lean towards the first letters of the alphabet. A
document that carries a license text is left out, wherever it comes from: license texts are the evaluation domain
of ``benchmarks/llm/quantize.py`` and boilerplate besides. A domain the machine lacks (no man pages on macOS) is
logged and skipped; the report's ``domain_share`` says what was used.

``DEFAULT_DOMAINS`` leaves ``code`` out: on ``benchmarks/llm/quantize.py``'s decide split (Debian READMEs) the
four prose domains gave +8.21% perplexity where all five gave +9.40% (AWQ + GPTQ, 256 windows, side by side).
``mixed_texts(["code", ...])`` still reads it.
"""

from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import logging
import re
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from deploy_opt.llm.text_data import TextDoc, pydoc_texts
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

MIXED = "mixed"
DOMAIN_CHARS = 1_500_000  # about 400k SmolLM2 tokens a domain: 512 windows of 512 need 262k in all
MIN_DOC_CHARS = 400
MAN_SECTIONS = ("man1", "man2", "man3", "man4", "man5", "man6", "man7", "man8")
DPKG_STATUS = Path("/var/lib/dpkg/status")
STDLIB_SKIP = ("test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "pydoc_data", "ensurepip")
# Phrases that mark a document as (or as carrying) a license text.
LICENSE_MARKERS = (
    "permission is hereby granted",
    "gnu general public license",
    "gnu lesser general public license",
    "apache license",
    "mozilla public license",
    "redistribution and use in source and binary forms",
    'provided "as is"',
    "the software is provided",
)
_ROFF_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
_ROFF_ESCAPES = (("\\-", "-"), ("\\(em", "—"), ("\\(en", "–"), ("\\e", "\\"), ("\\&", ""), ("\\,", ""), ("\\/", ""))
_ROFF_TEXT_MACROS = re.compile(r"^\.(B|I|BI|BR|IB|IR|RB|RI|SM|SB|SH|SS|IP|TP)\b\s*")


def is_license_text(text: str) -> bool:
    """True when ``text`` carries a license (one of ``LICENSE_MARKERS``, any case)."""
    lowered = text.lower()
    return any(marker in lowered for marker in LICENSE_MARKERS)


def _hash_order(paths: Iterable[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: hashlib.sha1(p.name.encode()).hexdigest())


def _capped(domain: str, docs: Iterator[TextDoc]) -> list[TextDoc]:
    """Docs of one domain until ``DOMAIN_CHARS``, short ones and license texts left out."""
    kept, chars = [], 0
    for doc in docs:
        if len(doc.text) < MIN_DOC_CHARS or is_license_text(doc.text):
            continue
        kept.append(doc)
        chars += len(doc.text)
        if chars >= DOMAIN_CHARS:
            break
    log.info("calibration corpus: %s: %d documents, %d characters", domain, len(kept), chars)
    return kept


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not any(part in STDLIB_SKIP for part in p.relative_to(root).parts)]
    return _hash_order(files)


def _docstrings_of(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return ""
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    parts = []
    for node in nodes:
        doc = ast.get_docstring(node)
        if doc and len(doc) > 80:
            name = getattr(node, "name", path.stem)
            parts.append(f"{name}\n{doc}")
    return "\n\n".join(parts)


def _docstring_docs() -> Iterator[TextDoc]:
    for path in _stdlib_files():
        yield TextDoc(f"docstrings:{path.name}", "docstrings", _docstrings_of(path))


def _code_docs() -> Iterator[TextDoc]:
    for path in _stdlib_files():
        try:
            yield TextDoc(f"code:{path.name}", "code", path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue


def strip_roff(source: str) -> str:
    """Plain text of a man page's roff source: comments and layout requests dropped, fonts and escapes undone."""
    lines = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".PP", ".LP", ".P\n", ".sp", ".br")) or line in (".P", ".TP", ".IP"):
            lines.append("")
            continue
        match = _ROFF_TEXT_MACROS.match(line)
        if match:
            line = line[match.end() :].replace('"', "")
        elif line.startswith((".", "'")):
            continue
        line = _ROFF_FONT.sub("", line)
        for escape, plain in _ROFF_ESCAPES:
            line = line.replace(escape, plain)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _man_docs(root: Path = Path("/usr/share/man")) -> Iterator[TextDoc]:
    files = [p for section in MAN_SECTIONS for p in (root / section).glob("*.gz")] if root.is_dir() else []
    for path in _hash_order(files):
        try:
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                source = handle.read()
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if source.startswith(".so "):  # a link to another page
            continue
        yield TextDoc(f"man:{path.name}", "manpages", strip_roff(source))


def _dpkg_descriptions(status: Path = DPKG_STATUS) -> list[str]:
    """Debian packages' long descriptions (the indented lines after ``Description:``), " ." as paragraph breaks."""
    if not status.is_file():
        return []
    texts = []
    for stanza in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        match = re.search(r"^Description: (.*)\n((?: .*\n?)*)", stanza, re.MULTILINE)
        if match:
            body = "\n".join("" if line.strip() == "." else line[1:] for line in match.group(2).splitlines())
            texts.append(f"{match.group(1)}\n{body}")
    return texts


def _package_docs() -> Iterator[TextDoc]:
    from importlib.metadata import distributions

    bodies = {}
    for dist in distributions():
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        name = dist.metadata.get("Name") or "?"
        if isinstance(body, str) and body.strip():
            bodies[name] = body
    for name in sorted(bodies, key=lambda n: hashlib.sha1(n.encode()).hexdigest()):
        yield TextDoc(f"pypi:{name}", "package-descriptions", bodies[name])
    descriptions = _dpkg_descriptions()
    for start in range(0, len(descriptions), 20):  # 20 short descriptions a document, so each clears MIN_DOC_CHARS
        yield TextDoc(f"dpkg:{start}", "package-descriptions", "\n\n".join(descriptions[start : start + 20]))


_DOMAINS: tuple[tuple[str, Callable[[], Iterator[TextDoc]]], ...] = (
    # One domain, not pydoc's six topic groups: as six strata they took 56% of the balanced sample.
    ("python-docs", lambda: (replace(d, domain="python-docs") for d in pydoc_texts("calibration"))),
    ("docstrings", _docstring_docs),
    ("code", _code_docs),
    ("manpages", _man_docs),
    ("package-descriptions", _package_docs),
)


DEFAULT_DOMAINS = ("python-docs", "docstrings", "manpages", "package-descriptions")


def mixed_texts(domains: Iterable[str] = DEFAULT_DOMAINS) -> list[TextDoc]:
    """The calibration corpus of the named domains this machine has (default: ``DEFAULT_DOMAINS``)."""
    wanted = set(domains)
    unknown = wanted - {name for name, _ in _DOMAINS}
    if unknown:
        raise ConfigError(
            f"calibration corpus: unknown domain(s) {sorted(unknown)}; allowed: {[name for name, _ in _DOMAINS]}"
        )
    docs: list[TextDoc] = []
    for name, _ in _DOMAINS:
        if name in wanted:
            docs += _domain(name)
    return docs


@functools.lru_cache(maxsize=len(_DOMAINS))
def _domain(name: str) -> tuple[TextDoc, ...]:
    """One domain's capped documents, read once a process: the machine's files do not change during a run, and
    reading them (parsing the standard library for its docstrings, ...) takes 3 s that a second run in the same
    process (a benchmark's next model, a test session) need not pay again."""
    read = dict(_DOMAINS)[name]
    found = tuple(_capped(name, read()))
    if not found:
        log.info("calibration corpus: no %s on this machine; left out", name)
    return found
