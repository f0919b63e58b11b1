"""Integrity: the artifacts of a build folder are the bytes the build wrote (sha256 and size in build.json).

The build records, besides each artifact's sha256, a short digest of every initializer (and Constant) of its
Q/DQ models (``integrity`` in build.json): the weight codes, scales and zero points. A Q/DQ model that no
longer matches is then reported by the first tensor that differs, not only by its file hash. The gate and
``align verify`` run the check (``deploy_opt/report/trust.py`` turns it into the gate's criterion).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.report.manifest import DIGESTED, plain_name_problem, required_artifacts
from dopt_common.errors import one_line
from dopt_common.files import KINDS, sha256_file
from dopt_common.names import shown

log = logging.getLogger(__name__)

QDQ_MODELS = ("model.int8.onnx", "model.trt.onnx")  # the models whose tensors are recorded one by one
SHORT = 16  # hex digits of a tensor's sha256 kept in build.json: enough to tell tensors apart, not a seal
SHOWN = 3  # problems spelled out in the gate's one line (all are in IntegrityReport.problems)


@dataclass(frozen=True)
class IntegrityReport:
    """Which artifacts were compared with build.json and every way they differ (one line each)."""

    checked: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every listed artifact is the bytes the build wrote."""
        return not self.problems

    def lines(self) -> list[str]:
        """One human line per problem, or one saying all artifacts match."""
        if self.ok:
            return [f"PASS  integrity: {len(self.checked)} artifacts match build.json (sha256 and size)"]
        return [f"FAIL  integrity: {p}" for p in self.problems]

    def to_json(self) -> dict[str, Any]:
        """Plain data for align.json."""
        return {"ok": self.ok, "checked": list(self.checked), "problems": list(self.problems)}

    def summary(self) -> str:
        """One line: every artifact matches, or the first problems (all are in ``problems``)."""
        if self.ok:
            return f"{len(self.checked)} artifacts match build.json (sha256 and size)"
        more = len(self.problems) - SHOWN
        return "; ".join(self.problems[:SHOWN]) + (f"; and {more} more" if more > 0 else "")


def tensor_digests(path: Path) -> dict[str, Any]:
    """Per-tensor digests of an ONNX model: {"tensors": {name: {dtype, dims, sha256}}, "nodes": sha256}."""
    import onnx

    model = onnx.load(str(path))
    return {"tensors": _tensors(model.graph), "nodes": _nodes_digest(model.graph)}


def integrity_record(stage: Path) -> dict[str, Any]:
    """build.json's ``integrity`` section: the tensor digests of every Q/DQ model in the build folder."""
    return {name: tensor_digests(stage / name) for name in QDQ_MODELS if (stage / name).is_file()}


def check_integrity(folder: Path, build: Mapping[str, Any]) -> IntegrityReport:
    """Compare every artifact the build must carry (fixed by its format, see ``manifest``) and every one build.json
    lists with the file in ``folder``; never raises on a bad file, never opens a name that is not a plain file name
    inside ``folder``."""
    listed = _mapping(build.get("artifacts"))
    recorded = _mapping(build.get("integrity"))
    required = required_artifacts(build)
    for name in [n for n in required if n.endswith(".onnx")]:
        for location in _external_files(folder, name):
            required.setdefault(location, f"{name} keeps its tensors in it (external data)")
    problems = [_unlisted(name, why) for name, why in required.items() if name not in listed]
    problems += [
        f"{name}: build.json's integrity section has no tensor digests for it, but the build records them for "
        "every Q/DQ model it writes (the record was edited); fix: rebuild"
        for name in DIGESTED
        if name in required and name in listed and name not in recorded
    ]
    for name, expected in listed.items():
        problem = _check_artifact(folder, name, expected, listed, recorded.get(name))
        if problem:
            problems.append(problem)
    for problem in problems:
        log.debug("integrity: %s", problem)
    checked = tuple(dict.fromkeys([*listed, *required]))
    return IntegrityReport(tuple(shown(str(n)) for n in checked), tuple(problems))


def _external_files(folder: Path, name: str) -> list[str]:
    """The external-data files a (regular, plain-named) ONNX artifact keeps its tensors in; [] when unreadable."""
    import onnx

    path = folder / name
    if plain_name_problem(name) or _file_kind(path):
        return []
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # a damaged model is reported by its own hash check
        return []
    tensors = [*model.graph.initializer]
    tensors += [a.t for node in model.graph.node for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    external = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    found = (e.value for t in external for e in t.external_data if e.key == "location")
    return list(dict.fromkeys(v for v in found if v))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _unlisted(name: str, why: str) -> str:
    return (
        f"{shown(name)} is not listed in build.json's artifacts, but {why} (entries deleted?); fix: rebuild, "
        "a build.json that drops an artifact cannot vouch for it"
    )


def _check_artifact(
    folder: Path, name: str, expected: Mapping[str, Any], listed: Mapping[str, Any], tensors: Any
) -> str | None:
    """One line naming what is wrong with one artifact, or None when it is the bytes the build wrote."""
    unsafe = plain_name_problem(name)
    if unsafe is not None:
        return (
            f"artifact name {shown(name, quote=True)} in build.json {unsafe}; a build lists only plain file names in "
            "its folder, so it was not opened; fix: rebuild"
        )
    path = folder / name
    if not isinstance(expected, Mapping):
        return f"{name}: build.json's entry for it is not {{sha256, bytes}} ({expected!r:.60})"
    kind = _file_kind(path)
    if kind == "missing":
        return f"{name} is missing (the build wrote {expected.get('bytes')} bytes)"
    if kind:
        return f"{name} is {kind}, not the regular file the build wrote; fix: rebuild"
    try:
        size, digest = path.stat().st_size, sha256_file(path)
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"
    if size == expected.get("bytes") and digest == expected.get("sha256"):
        return None
    detail = _onnx_difference(path, tensors) if isinstance(tensors, dict) else None
    if detail is None:
        detail = f"sha256 {digest[:SHORT]} differs from what the build wrote ({str(expected.get('sha256'))[:SHORT]})"
    want = expected.get("bytes")
    if isinstance(want, int) and size != want:
        detail += f"; {size} bytes, the build wrote {want} ({'truncated?' if size < want else 'replaced?'})"
    twin = next((n for n, e in listed.items() if n != name and _sha256(e) == digest), None)
    if twin:  # e.g. the FP32 model copied over the INT8 one
        return f"{name} has the bytes of {twin}, not the ones the build wrote: {detail}"
    return f"{name} {detail}"


def _file_kind(path: Path) -> str | None:
    """None for a regular file; 'missing'; or what else is there (a link may point outside the folder, a FIFO
    would block the read)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return None if stat.S_ISREG(mode) else next((kind for test, kind in KINDS.items() if test(mode)), "not a file")


def _onnx_difference(path: Path, recorded: Mapping[str, Any]) -> str:
    """The first recorded tensor that differs, or why the model cannot be compared."""
    import onnx

    try:
        model = onnx.load(str(path))
        found = _tensors(model.graph)
    except Exception as exc:  # a damaged file fails any way the protobuf reader likes
        return f"is not a readable ONNX model ({type(exc).__name__}: {one_line(exc)})"
    expected: Mapping[str, Any] = recorded.get("tensors") or {}
    for tensor, want in expected.items():
        got = found.get(tensor)
        if got is None:
            return f"tensor '{tensor}' is missing (the build wrote {_describe(want)})"
        if got != want:
            return f"tensor '{tensor}' differs from what the build wrote ({_change(want, got)})"
    extra = next((t for t in found if t not in expected), None)
    if extra is not None:
        return f"tensor '{extra}' was not written by the build ({_describe(found[extra])})"
    if _nodes_digest(model.graph) != recorded.get("nodes"):
        return "graph nodes differ from what the build wrote (every tensor is as written)"
    return "differs from what the build wrote outside its tensors and nodes (metadata)"


def _tensors(graph: Any) -> dict[str, dict[str, Any]]:
    """Digest of every initializer and Constant value of a graph, in graph order."""
    found = {t.name: _digest(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and node.output:
                found[node.output[0]] = _digest(value)
    return found


def _digest(tensor: Any) -> dict[str, Any]:
    """dtype, dims and a short sha256 of the values (raw_data and typed fields hash alike)."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    values = numpy_helper.to_array(tensor)
    if values.dtype == object:  # strings
        data = b"\0".join(v if isinstance(v, bytes) else str(v).encode() for v in values.ravel())
    else:
        data = np.ascontiguousarray(values).tobytes()
    return {
        "dtype": TensorProto.DataType.Name(tensor.data_type).lower(),
        "dims": [int(d) for d in tensor.dims],
        "sha256": hashlib.sha256(data).hexdigest()[:SHORT],
    }


def _nodes_digest(graph: Any) -> str:
    digest = hashlib.sha256()
    for node in graph.node:
        digest.update(node.SerializeToString(deterministic=True))
    return digest.hexdigest()[:SHORT]


def _sha256(entry: Any) -> str | None:
    return entry.get("sha256") if isinstance(entry, Mapping) else None


def _change(want: Mapping[str, Any], got: Mapping[str, Any]) -> str:
    """'sha256 a → b', with dtype and dims when those changed too."""
    if (want.get("dtype"), want.get("dims")) == (got.get("dtype"), got.get("dims")):
        return f"sha256 {want.get('sha256')} → {got.get('sha256')}"
    return f"{_describe(want)} → {_describe(got)}"


def _describe(entry: Mapping[str, Any]) -> str:
    dims = ",".join(str(d) for d in entry.get("dims", []))
    return f"{entry.get('dtype')}[{dims}] sha256 {entry.get('sha256')}"
