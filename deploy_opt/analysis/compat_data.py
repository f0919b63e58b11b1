"""The facts behind the compatibility report: ORT kernel registries, TensorRT's operator table, ORT's opset table.

Sources (see deploy_opt/backend_tables/README.md): the CPU kernels come from the installed onnxruntime's own registry
(``data/ort_cpu_kernels.json`` where that registry cannot be read, see ``exporters.ort.registry``); the CUDA
kernels from that registry when onnxruntime-gpu is installed, else from ``data/ort_cuda_kernels.json`` (ORT's published
docs/OperatorKernels.md); TensorRT from ``data/tensorrt_*.csv`` (onnx-tensorrt's operator
tables); ORT release -> opset from ``data/ort_opset_support.csv``. Every loader is cached: a build calls the
report twice and the files never change while it runs.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import ConfigError, MissingDependency, ReportError

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
_OPEN_END = 2**31 - 1  # ORT's "and every later opset"


@dataclass(frozen=True)
class Kernel:
    """One registered kernel: op, domain ('' is ai.onnx), opset range, and allowed types per type parameter."""

    op: str
    domain: str
    since: int
    until: int | None
    types: Mapping[str, tuple[str, ...]]

    def covers(self, version: int) -> bool:
        """Whether an op at ``version`` (its resolved since_version) is served by this kernel."""
        return self.since <= version and (self.until is None or version <= self.until)

    @property
    def span(self) -> str:
        """'13+' or '[6, 12]', as ORT's kernel table writes it."""
        return f"{self.since}+" if self.until is None else f"[{self.since}, {self.until}]"


@dataclass(frozen=True)
class KernelTable:
    """The kernels of one execution provider, indexed by (op, domain), and where they were read from."""

    provider: str
    source: str
    ort_version: str
    kernels: Mapping[tuple[str, str], tuple[Kernel, ...]]

    def find(self, op: str, domain: str) -> tuple[Kernel, ...]:
        """Every kernel registered for ``op`` in ``domain`` ('' or 'ai.onnx' for the default domain)."""
        return self.kernels.get((op, normal_domain(domain)), ())

    def has_op(self, op: str, domain: str) -> bool:
        """Whether any kernel exists for ``op`` in ``domain``."""
        return bool(self.find(op, domain))


@dataclass(frozen=True)
class TensorRTVersion:
    """One TensorRT release of the operator table, its onnx-tensorrt branch and the opsets its parser takes."""

    version: str
    branch: str
    min_opset: int | None
    max_opset: int

    @property
    def key(self) -> tuple[int, ...]:
        """Sortable form of the version."""
        return _version_key(self.version)


@dataclass(frozen=True)
class TensorRTOp:
    """One row of onnx-tensorrt's operator table."""

    version: str
    operator: str
    supported: bool
    types: tuple[str, ...]
    restrictions: str


@dataclass(frozen=True)
class OrtRelease:
    """An ONNX Runtime release and the ONNX opsets it implements."""

    version: str
    onnx_version: str
    opset: int
    ml_opset: int
    source: str

    @property
    def key(self) -> tuple[int, ...]:
        """Sortable form of the version."""
        return _version_key(self.version)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def normal_domain(domain: str) -> str:
    """'' for the default domain however it is spelled; ORT's registry spells it ''."""
    return "" if domain in ("", "ai.onnx") else domain


def shown_domain(domain: str) -> str:
    """'ai.onnx' for the default domain, for people."""
    return normal_domain(domain) or "ai.onnx"


def _data_text(name: str) -> str:
    try:
        return resources.files("deploy_opt").joinpath("backend_tables", name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise ReportError(
            f"deploy_opt's data file 'data/{name}' is missing ({exc}); fix: reinstall deploy_opt, or regenerate it "
            "with the script named in deploy_opt/backend_tables/README.md"
        ) from exc


def _csv_rows(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(_data_text(name).splitlines()))


def _index(kernels: list[Kernel]) -> dict[tuple[str, str], tuple[Kernel, ...]]:
    found: dict[tuple[str, str], list[Kernel]] = {}
    for kernel in kernels:
        found.setdefault((kernel.op, kernel.domain), []).append(kernel)
    return {key: tuple(value) for key, value in found.items()}


@functools.cache
def _registry() -> tuple[str, tuple[Any, ...] | None]:
    from exporters.ort.registry import read_registry

    version, rows = read_registry()
    return version, None if rows is None else tuple(rows)


@functools.cache
def runtime_kernels(provider: str) -> KernelTable | None:
    """The installed onnxruntime's registered kernels of ``provider``; None when it registers none.

    Where the registry cannot be read (``exporters.ort.registry``), the CPU and CUDA providers come from the published
    tables in data/ instead.
    """
    version, rows = _registry()
    if rows is None:
        return _published_kernels(provider, f"the installed onnxruntime {version}'s registry could not be read")
    kernels = [
        Kernel(
            op, normal_domain(domain), since, None if until >= _OPEN_END else until, {k: tuple(v) for k, v in t.items()}
        )
        for p, op, domain, since, until, t in rows
        if p == provider
    ]
    if not kernels:
        return None
    return KernelTable(provider, f"the installed onnxruntime {version}'s kernel registry", version, _index(kernels))


@functools.cache
def cuda_kernels() -> KernelTable:
    """CUDA kernels: the runtime registry when onnxruntime-gpu is installed, else ORT's published table."""
    table = runtime_kernels(CUDA_PROVIDER)
    if table is not None:
        return table
    installed, _ = _registry()
    return _published_kernels(CUDA_PROVIDER, f"the installed onnxruntime {installed} has no CUDA execution provider")


_PUBLISHED = {CPU_PROVIDER: "ort_cpu_kernels.json", CUDA_PROVIDER: "ort_cuda_kernels.json"}


def _published_kernels(provider: str, why: str) -> KernelTable | None:
    """``provider``'s kernels from the table shipped in data/ (see its README), or None where none is shipped."""
    name = _PUBLISHED.get(provider)
    if name is None:
        return None
    data = json.loads(_data_text(name))
    kernels = [
        Kernel(op, normal_domain(domain), since, until, {k: tuple(v) for k, v in types.items()})
        for op, domain, since, until, types in data["kernels"]
    ]
    source = f"deploy_opt/backend_tables/{name}: ONNX Runtime {data['ort_version']} ({data['source']}); {why}"
    return KernelTable(provider, source, data["ort_version"], _index(kernels))


@functools.cache
def tensorrt_versions() -> tuple[TensorRTVersion, ...]:
    """The TensorRT versions of the table, oldest first."""
    found = [
        TensorRTVersion(
            r["tensorrt"], r["branch"], int(r["min_opset"]) if r["min_opset"] else None, int(r["max_opset"])
        )
        for r in _csv_rows("tensorrt_versions.csv")
    ]
    return tuple(sorted(found, key=lambda v: v.key))


@functools.cache
def tensorrt_operators() -> Mapping[tuple[str, str], TensorRTOp]:
    """(TensorRT version, ONNX operator) -> its row of onnx-tensorrt's operator table."""
    rows = {}
    for r in _csv_rows("tensorrt_operators.csv"):
        types = tuple(t.strip() for t in r["types"].split(",") if t.strip())
        rows[(r["tensorrt"], r["operator"])] = TensorRTOp(
            r["tensorrt"], r["operator"], r["supported"] == "Y", types, r["restrictions"]
        )
    return rows


@functools.cache
def ort_releases() -> tuple[OrtRelease, ...]:
    """ONNX Runtime releases and the opsets they implement, oldest first."""
    found = [
        OrtRelease(r["ort_version"], r["onnx_version"], int(r["onnx_opset"]), int(r["onnx_ml_opset"]), r["source"])
        for r in _csv_rows("ort_opset_support.csv")
    ]
    return tuple(sorted(found, key=lambda r: r.key))


def first_ort_release(domain: str, since_version: int | None) -> str | None:
    """The earliest ORT release implementing ``since_version`` of ``domain`` (ai.onnx / ai.onnx.ml), else None."""
    domain = normal_domain(domain)
    if since_version is None or domain not in ("", "ai.onnx.ml"):
        return None
    for release in ort_releases():
        if (release.opset if domain == "" else release.ml_opset) >= since_version:
            return release.version
    return None


def tensorrt_target(requested: str | None) -> tuple[TensorRTVersion, str]:
    """The table version the "tensorrt" target is judged against, and why that one."""
    versions = tensorrt_versions()
    if requested is not None:
        chosen = next((v for v in versions if v.version == requested), None)
        if chosen is None:
            known = ", ".join(v.version for v in versions)
            raise ConfigError(f"TensorRT version '{requested}' is not in the operator table; use one of {known}")
        return chosen, "requested"
    installed = installed_tensorrt()
    if installed is None:
        return versions[-1], f"tensorrt is not installed: the newest version in the table ({versions[-1].version})"
    older = [v for v in versions if v.key <= _version_key(installed)]
    return (older or versions)[-1 if older else 0], f"the newest table version not above the installed {installed}"


def installed_tensorrt() -> str | None:
    """The installed tensorrt's version; None when absent or broken (then the table alone is the judge)."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        return str(require("tensorrt", purpose="reading TensorRT's version", extra="tensorrt").__version__)
    except MissingDependency:  # present but its CUDA libraries do not load
        return None


def tensorrt_parser_verdict(model: bytes, path: Path | None) -> dict[str, Any]:
    """TensorRT's own ONNX parser on the model: top-level node indices it rejects, or why it did not run."""
    if importlib.util.find_spec("tensorrt") is None:
        return {"ran": False, "reason": "tensorrt is not installed: the TensorRT column comes from the table only"}
    from exporters.tensorrt.engine import major_version

    try:
        trt = require("tensorrt", purpose="confirming TensorRT support with its ONNX parser", extra="tensorrt")
        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        if builder is None:
            return {"ran": False, "reason": "TensorRT could not create a builder (no usable NVIDIA GPU)"}
        major = major_version(trt.__version__)
        flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        parser = trt.OnnxParser(builder.create_network(flags), logger)
        where = str(path) if path is not None else ""  # lets the parser find external weights
        rejected: set[int] = set()
        if hasattr(parser, "supports_model_v2"):  # TensorRT >= 10.1; supports_model is deprecated there
            supported = bool(parser.supports_model_v2(model, where))
            for i in range(parser.num_subgraphs):
                if not parser.is_subgraph_supported(i):
                    rejected.update(int(n) for n in parser.get_subgraph_nodes(i))
        else:
            supported, subgraphs = parser.supports_model(model, where) if where else parser.supports_model(model)
            for node_indices, ok in subgraphs:
                if not ok:
                    rejected.update(int(n) for n in node_indices)
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        messages = [{"node": int(e.node()), "message": str(e.desc())} for e in errors]
    except Exception as exc:  # a confirmation only: its failure leaves the table's verdict standing
        log.warning("TensorRT's ONNX parser could not check the model: %s: %s", type(exc).__name__, exc)
        return {"ran": False, "reason": f"TensorRT's parser failed: {type(exc).__name__}: {exc}"}
    return {"ran": True, "tensorrt": str(trt.__version__), "supported": supported, "rejected": sorted(rejected)} | {
        "errors": messages
    }
