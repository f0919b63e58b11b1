"""Which artifacts a build must carry, fixed by its format version: not by whatever build.json lists.

Deleting an artifact's entries from build.json (``artifacts`` and ``integrity``) must not make its check vanish,
so the names every build of a format writes are a constant here, and the conditional ones (a TensorRT form of the
Q/DQ model, a TensorRT cache or engine, the QAT graph, compat and comparison reports) are read from the other
sections of build.json that say they were produced. An artifact name is also guarded: one plain file name inside
the run folder, so ``../../etc/passwd`` or ``/etc/hostname`` is never opened.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BUILD_FORMAT = "deploy_opt.build/1"  # build.json's format; record.py writes it, gate.py reads only it
# Written by every build of the format (build.json's ``artifacts`` is every file of the folder).
ALWAYS: dict[str, tuple[str, ...]] = {
    BUILD_FORMAT: ("model.onnx", "model.int8.onnx", "scales.json", "encodings.json"),
}
# Q/DQ models whose tensor digests the build records (``integrity``) whenever it writes them.
DIGESTED = ("model.int8.onnx", "model.trt.onnx")


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not one plain file name inside the run folder, or None when it is."""
    if not isinstance(name, str) or not name:
        return "is empty or not text"
    if "\x00" in name or any(ord(c) < 32 for c in name):
        return "contains a control character"
    if os.path.isabs(name) or any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/")):
        return "is a path, not a file name (it contains a separator or is absolute)"
    if name in (".", ".."):
        return "names a folder ('.' or '..')"
    return None


def required_artifacts(build: Mapping[str, Any]) -> dict[str, str]:
    """Every artifact a build of this format must list, each with why (``{name: reason}``)."""
    fmt = str(build.get("format", BUILD_FORMAT))  # no format: a report written by hand, read as the current one
    needed = {name: f"every {fmt} build writes it" for name in ALWAYS.get(fmt, ALWAYS[BUILD_FORMAT])}
    for name, why in _conditional(build):
        needed.setdefault(name, why)
    return needed


def _conditional(build: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The artifacts build.json's other sections say were produced."""
    found: list[tuple[str, str]] = []
    backends = _section(build, "backends")
    cache = backends.get("trt_cache")
    if isinstance(cache, str) and not cache.startswith("not written"):
        found.append((cache, "build.json's backends.trt_cache names it"))
    if "tensorrt_qdq" in backends:
        found.append(("model.trt.onnx", "build.json's backends.tensorrt_qdq says it was written"))
    status = _section(backends, "tensorrt").get("status")
    if isinstance(status, str) and status.startswith("built: "):
        found.append((status.removeprefix("built: "), "build.json's backends.tensorrt says the engine was built"))
    for report in _section(backends, "compat"):
        found += [(f"{report}{ext}", "build.json's backends.compat lists the report") for ext in (".json", ".md")]
    comparison = _section(build, "comparison").get("file")
    if isinstance(comparison, str):
        found.append((comparison, "build.json's comparison section names it"))
    qat = _section(build, "qat")
    if qat.get("ran") and qat.get("shipped") == "qat":
        found.append(("model.qat.onnx", "build.json's qat section says the QAT graph ships"))
    for check in _section(build, "alignment").get("artifacts") or ():
        if isinstance(check, Mapping) and check.get("status") not in (None, "skipped"):
            name = check.get("artifact")
            if isinstance(name, str) and "." in name and " " not in name:  # a file, not "tensorrt engine"
                found.append((name, "build.json's alignment section checked it"))
    found += [(name, "build.json's integrity section records its tensors") for name in _section(build, "integrity")]
    return found


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    return value if isinstance(value, Mapping) else {}


def is_build_folder(folder: Path, build: Mapping[str, Any]) -> bool:
    """Whether a build.json's artifacts must be checked: it says it is a deploy_opt build (its format, its
    artifacts), or any artifact every build writes lies beside it. Only a report written by hand, alone in its
    folder, is judged on its numbers alone, so deleting ``format`` and ``artifacts`` does not skip the check."""
    if any(key in build for key in ("format", "artifacts", "integrity")):
        return True
    return any(os.path.lexists(folder / name) for names in ALWAYS.values() for name in names)
