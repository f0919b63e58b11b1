"""Regenerate the per-version part of tests/data/tensorrt_api.json from TensorRT's real bindings wheels.

The table lists the part of TensorRT's Python API that deploy_opt calls (names, argument and return types). This
script decides, for every member it lists, whether each TensorRT version has it, from that version's
``tensorrt_cu*_bindings`` wheel, and writes the answer beside the members (``tensorrt.versions``):

    python scripts/tensorrt_api_table.py                    # pip-downloads the wheels of WHEELS into a temp dir
    python scripts/tensorrt_api_table.py a.whl b.whl        # or reads wheels already here
    python scripts/tensorrt_api_table.py --check a.whl b.whl  # exit 1 if the table on disk differs

Nothing is loaded or run from a wheel (it needs CUDA): ``tensorrt_bindings/__init__.py`` is parsed with ``ast``,
and ``tensorrt.so`` (pybind11) is read as bytes for its printable strings, which hold every bound name and
docstring. The evidence, strongest first:

- an enum member: the docstring pybind11 binds to it (``.value("INT8", BuilderFlag::kINT8, "Enable Int8 layer
  selection. ...")``); ``DOCSTRINGS`` names it. A name alone cannot decide an enum member: names are shared
  between enums, and the linker stores "INT8" as the tail of "UINT8", so DataType.INT8 keeps it alive after
  BuilderFlag.INT8 is gone. A ``Deprecated in TensorRT X.Y`` in that docstring is the member's deprecation;
- a class, a method or a property: its name as a whole string (or as the tail of a longer one, where the
  linker merged it);
- a module function or ``__version__``: ``__init__.py``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dopt_common.files import write_text  # noqa: E402

log = logging.getLogger("tensorrt_api_table")
TABLE = REPO / "tests" / "data" / "tensorrt_api.json"
# version -> the bindings distribution on PyPI (split wheels: no CUDA needed to download or read them)
WHEELS = {"10.16.1.11": "tensorrt-cu12-bindings", "11.4.0.106": "tensorrt-cu13-bindings"}
# Enum member -> the docstring(s) the bindings bind to it (any one is enough; 11.0 rewrote STRONGLY_TYPED's).
DOCSTRINGS: dict[str, tuple[str, ...]] = {
    "LayerType.CONSTANT": ("Constant layer",),
    "LayerType.QUANTIZE": ("Quantize layer",),
    "LayerType.DEQUANTIZE": ("Dequantize layer",),
    "LayerType.MATRIX_MULTIPLY": ("Matrix multiply layer",),
    "NetworkDefinitionCreationFlag.STRONGLY_TYPED": (
        "Specify that every tensor in the network has a data type defined in the network",
        "Strongly typed mode is always enabled.",
    ),
    "MemoryPoolType.WORKSPACE": ("WORKSPACE is used by TensorRT to store intermediate buffers",),
    "BuilderFlag.FP16": ("Enable FP16 layer selection.",),
    "BuilderFlag.INT8": ("Enable Int8 layer selection.",),
    "ProfilingVerbosity.DETAILED": ("Print detailed layer information including layer names and layer parameters.",),
    "TensorIOMode.INPUT": ("Tensor is input to the engine.",),
    "TensorIOMode.OUTPUT": ("Tensor is output to the engine.",),
    "DataType.FLOAT": ("32-bit floating point format.",),
    "DataType.HALF": ("IEEE 16-bit floating-point format.",),
    "DataType.INT8": ("Signed 8-bit integer representing a quantized floating-point value.",),
    "DataType.INT32": ("Signed 32-bit integer format.",),
    "DataType.INT64": ("Signed 64-bit integer format.",),
    "DataType.BOOL": ("8-bit boolean. 0 = false, 1 = true, other values undefined.",),
    "Logger.Severity.ERROR": ("Represents an application error.",),
    "Logger.Severity.WARNING": ("Represents an application error that TensorRT has recovered from",),
}
_PRINTABLE = re.compile(rb"[\x20-\x7e\t\n\r]{3,}")
_IDENTIFIER = re.compile(r"[A-Za-z_][\w:]*")
_DEPRECATED = re.compile(r"Deprecated in TensorRT (\d+\.\d+)\.?\s*([^\n]*)")


@dataclass(frozen=True)
class Finding:
    """Whether one version has one member, and what showed it."""

    present: bool
    evidence: str
    deprecated: str | None = None  # "10.12: Superseded by strong typing."


class Bindings:
    """One bindings wheel, read without loading it: its version, module functions and the .so's strings."""

    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(wheel) as archive:
            init = archive.read("tensorrt_bindings/__init__.py").decode()
            binary = archive.read("tensorrt_bindings/tensorrt.so")
        self.wheel = wheel.name
        self.version, self.functions = _read_init(init)
        self.strings = [m.group().decode("ascii") for m in _PRINTABLE.finditer(binary)]
        self._names = set(self.strings)
        self._lines = [(line.strip(), text) for text in self.strings for line in text.splitlines() if line.strip()]

    def name(self, name: str) -> Finding:
        """``name`` as a whole string, or as the tail of one (the linker merges "INT8" into "UINT8")."""
        if name in self._names:
            return Finding(True, f"name '{name}'")
        tails = [s for s in self.strings if s.endswith(name)]
        tail = next((s for s in tails if _IDENTIFIER.fullmatch(s)), tails[0] if tails else None)
        if tail is not None:
            return Finding(True, f"name '{name}' as the tail of {tail[-40:]!r}")
        return Finding(False, f"no string '{name}'")

    def docstring(self, fingerprints: Sequence[str]) -> Finding:
        """The docstring line that best holds one of ``fingerprints``: equal, then starting with it, then ending
        with it (a tail the linker merged into a longer string), then containing it."""
        for fingerprint in fingerprints:
            for rank, test in enumerate(_MATCHES):
                hit = next(((i, text) for i, (line, text) in enumerate(self._lines) if test(line, fingerprint)), None)
                if hit is not None:
                    line = self._lines[hit[0]][0]
                    start = max(0, line.index(fingerprint) - 25)
                    where = "" if rank < 2 else f" (in {line[start : start + 90]!r})"
                    return Finding(True, f"docstring '{fingerprint}'{where}", self._deprecation(hit[0]))
        return Finding(False, "no docstring " + " or ".join(f"'{f}'" for f in fingerprints))

    def _deprecation(self, index: int) -> str | None:
        """'10.12: Superseded by strong typing.' where the member's line, or the next line of its docstring,
        starts with [DEPRECATED]; another member's deprecation further down the same docstring does not count."""
        line, text = self._lines[index]
        lines = [line]
        if index + 1 < len(self._lines) and self._lines[index + 1][1] is text:
            lines.append(self._lines[index + 1][0])
        for candidate in lines:
            found = _DEPRECATED.search(candidate) if candidate.startswith("[DEPRECATED]") else None
            if found:
                return f"{found[1]}: {found[2].strip()}".rstrip(": ")
        return None


_MATCHES = (
    lambda line, f: line == f,
    lambda line, f: line.startswith(f),
    lambda line, f: line.endswith(f),
    lambda line, f: f in line,
)


def _read_init(source: str) -> tuple[str, set[str]]:
    """``__version__`` and the top-level function names of ``tensorrt_bindings/__init__.py``."""
    version, functions = None, set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            functions.add(node.name)
        targets = [t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)]
        if "__version__" in targets and isinstance(node.value, ast.Constant):
            version = str(node.value.value)
    if version is None:
        raise SystemExit("tensorrt_bindings/__init__.py sets no __version__; is this a TensorRT bindings wheel?")
    return version, functions


def listed_members(section: dict[str, Any]) -> dict[str, str]:
    """Every member the table lists, dotted ('BuilderFlag.INT8', 'IBuilderConfig.set_flag') -> its kind."""
    found = {name: spec["kind"] for name, spec in section["module"].items()}
    found |= {f"{enum}.{value}": "enum member" for enum, values in section["enums"].items() for value in values}
    for cls, spec in section["classes"].items():
        found |= {f"{cls}.{name}": member["kind"] for name, member in spec["members"].items()}
    return found


def find(bindings: Bindings, dotted: str, kind: str) -> Finding:
    """Whether ``bindings`` has the table member ``dotted``."""
    if dotted == "__version__":
        return Finding(True, f"__init__.py __version__ = '{bindings.version}'")
    if kind == "function":
        present = dotted in bindings.functions
        return Finding(present, f"{'a' if present else 'no'} def {dotted} in __init__.py")
    if kind == "enum member":
        if dotted not in DOCSTRINGS:
            raise SystemExit(f"{dotted}: add the docstring its bindings bind to it to DOCSTRINGS (a name cannot tell)")
        return bindings.docstring(DOCSTRINGS[dotted])
    return bindings.name(dotted.rsplit(".", 1)[-1])


def versions_section(section: dict[str, Any], wheels: Iterable[Bindings]) -> dict[str, Any]:
    """``{version: {wheel, absent, deprecated}}`` and each member's evidence per version."""
    members = listed_members(section)
    versions, evidence = {}, {}
    for bindings in sorted(wheels, key=lambda b: _key(b.version)):
        findings = {dotted: find(bindings, dotted, kind) for dotted, kind in members.items()}
        versions[bindings.version] = {
            "wheel": bindings.wheel,
            "absent": sorted(d for d, f in findings.items() if not f.present),
            "deprecated": {d: f.deprecated for d, f in sorted(findings.items()) if f.present and f.deprecated},
        }
        for dotted, finding in findings.items():
            evidence.setdefault(dotted, {})[bindings.version] = finding.evidence
    nowhere = [d for d in members if all(d in v["absent"] for v in versions.values())]
    if nowhere:
        raise SystemExit(f"no wheel has {nowhere}: the table lists what no TensorRT version binds")
    return {"versions": versions, "evidence": evidence}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def enum_notes(versions: dict[str, Any]) -> dict[str, str]:
    """One line per enum member that some version deprecates or lacks."""
    notes: dict[str, list[str]] = {}
    for version, spec in versions.items():
        for dotted, note in spec["deprecated"].items():
            if "." in dotted and not any(note in line for line in notes.get(dotted, [])):
                notes.setdefault(dotted, []).append(f"deprecated in {note} ({version} wheel)")
        for dotted in spec["absent"]:
            notes.setdefault(dotted, []).append(f"absent from {version}")
    return {dotted: "; ".join(lines) for dotted, lines in sorted(notes.items())}


def regenerate(table: dict[str, Any], wheels: Sequence[Bindings]) -> dict[str, Any]:
    """``table`` with its per-version section, evidence and enum notes rewritten from ``wheels``."""
    section = dict(table["tensorrt"])
    generated = versions_section(section, wheels)
    section["versions"], section["evidence"] = generated["versions"], generated["evidence"]
    section["enum_notes"] = enum_notes(generated["versions"])
    out = dict(table)
    out["sources"] = dict(table["sources"])
    out["sources"]["tensorrt"] = (
        "Members, arguments and return types: TensorRT's Python API as deploy_opt calls it, with TensorRT's "
        "open-source bindings (python/src/infer/pyGraph.cpp: IConstantLayer.weights is wrapped with "
        "utils::weights_to_numpy since 7.2, so it is a numpy.ndarray for FP32/FP16/INT8/INT32 weights). Which "
        "version has which member (tensorrt.versions, tensorrt.evidence, tensorrt.enum_notes): written by "
        "scripts/tensorrt_api_table.py from the bindings wheels " + ", ".join(w.wheel for w in wheels) + "."
    )
    out["tensorrt"] = section
    return out


def download(directory: Path) -> list[Path]:
    """The wheels of ``WHEELS``, pip-downloaded into ``directory`` (a maintainer's step, never a test's)."""
    for version, dist in WHEELS.items():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(directory), f"{dist}=={version}"]
        subprocess.run(command, check=True)
    return sorted(directory.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", type=Path, nargs="*", help="tensorrt_cu*_bindings wheels (default: download)")
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the table differs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        paths = args.wheels or download(Path(tmp))
        wheels = [Bindings(path) for path in paths]
    current = json.loads(args.table.read_text())
    table = regenerate(current, wheels)
    for version, spec in table["tensorrt"]["versions"].items():
        log.info("TensorRT %s: absent %s, deprecated %s", version, spec["absent"], sorted(spec["deprecated"]))
    if args.check:
        same = table == current
        log.info("%s %s the wheels", args.table, "matches" if same else "DIFFERS from")
        return 0 if same else 1
    write_text(args.table, json.dumps(table, indent=1, allow_nan=False) + "\n")  # the table's own layout
    log.info("wrote %s", args.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
