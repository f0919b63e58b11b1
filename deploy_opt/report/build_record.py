"""build.json as one typed record: the one ``to_json`` / ``from_json`` pair of every build's report.

``to_json`` writes the sections in the order build.json has always had them; ``from_json`` reads every format
deploy_opt has written (``READABLE_FORMATS``), and a record from before a section existed reads with that section
None (``split``, intervals and deciles before 2026-12-02, ``integrity`` before its digests, ``quantized_nodes``
before the count). What is not an object where a section must be is one ReportError line naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from deploy_opt.report.manifest import BUILD_FORMAT
from deploy_opt.report.model_sections import Backends, ExportInfo, QuantizationInfo
from deploy_opt.report.record_sections import BenchmarkRecord, GateResult, MetricsRecord, Targets, mapping
from dopt_common.errors import ReportError

# Every format a build.json was written in (one so far: a section added since is None in an older record).
READABLE_FORMATS = (BUILD_FORMAT,)
Section = TypeVar("Section")


@dataclass(frozen=True)
class ProfileRef:
    """The hardware profile the build used."""

    name: str | None
    description: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description}


@dataclass(frozen=True)
class BuildRecord:
    """What a build made, measured and decided: build.json, section by section.

    The sections the gate, summary.md, report.html and the CLI read are typed; those written by stages with their
    own typed results (calibration, fallback, auto, qat, prune, alignment, comparison, sensitivity) and the
    free-form ones (config, versions, artifact hashes, integrity digests) are kept as their JSON.
    """

    format: str
    created: str | None
    name: str | None
    description: str | None
    seed: int | None
    profile: ProfileRef | None
    export: ExportInfo | None
    quantization: QuantizationInfo | None
    metrics: MetricsRecord | None
    benchmark: BenchmarkRecord | None
    gate: GateResult | None
    targets: Targets
    calibration: Mapping[str, Any] | None
    fallback: Mapping[str, Any] | None
    auto: Mapping[str, Any] | None
    qat: Mapping[str, Any] | None
    prune: Mapping[str, Any] | None
    backends: Backends | None
    alignment: Mapping[str, Any] | None
    comparison: Mapping[str, Any] | None
    sensitivity: Mapping[str, Any] | None
    timings_s: Mapping[str, float]
    versions: Mapping[str, str]
    config: Mapping[str, Any]
    artifacts: Mapping[str, Mapping[str, Any]] | None = None  # written last, by write_reports
    integrity: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """build.json's document, key for key as deploy_opt build writes it."""
        typed = {
            "profile": self.profile,
            "export": self.export,
            "quantization": self.quantization,
            "metrics": self.metrics,
            "benchmark": self.benchmark,
            "gate": self.gate,
        }
        head = {"format": self.format, "created": self.created, "name": self.name, "description": self.description}
        data: dict[str, Any] = {**head, "seed": self.seed}
        data |= {k: None if v is None else v.to_json() for k, v in typed.items()}
        data |= {"targets": self.targets.to_json(), "calibration": self.calibration, "fallback": self.fallback}
        data |= {"auto": self.auto, "qat": self.qat, "prune": self.prune}
        data |= {"backends": None if self.backends is None else self.backends.to_json(), "alignment": self.alignment}
        data |= {"comparison": self.comparison, "sensitivity": self.sensitivity, "timings_s": self.timings_s}
        data |= {"versions": self.versions, "config": self.config}
        tail = {"artifacts": self.artifacts, "integrity": self.integrity}
        return data | {k: v for k, v in tail.items() if v is not None}

    @classmethod
    def from_json(cls, data: object) -> BuildRecord:
        """Read a build.json document of any format deploy_opt wrote; a section that is not an object, or a format
        this release does not know, is a ReportError."""
        if not isinstance(data, Mapping):
            raise ReportError("build.json is not a JSON object; fix: pass a build.json written by deploy_opt build")
        found = data.get("format", BUILD_FORMAT)  # none: a report written by hand, read as the current format
        if found not in READABLE_FORMATS:
            raise ReportError(f"build.json has format {found!r}; this deploy_opt reads {BUILD_FORMAT!r}")
        profile = _typed(data, "profile", lambda p: ProfileRef(p.get("name"), p.get("description")))
        return cls(
            format=found,
            created=data.get("created"),
            name=data.get("name"),
            description=data.get("description"),
            seed=data.get("seed"),
            profile=profile,
            export=_typed(data, "export", ExportInfo.from_json),
            quantization=_typed(data, "quantization", QuantizationInfo.from_json),
            metrics=_typed(data, "metrics", MetricsRecord.from_json),
            benchmark=_typed(data, "benchmark", BenchmarkRecord.from_json),
            gate=_typed(data, "gate", GateResult.from_json),
            targets=Targets(mapping(data.get("targets"), "targets")),
            backends=_typed(data, "backends", Backends.from_json),
            timings_s=mapping(data.get("timings_s"), "timings_s"),
            versions=mapping(data.get("versions"), "versions"),
            config=mapping(data.get("config"), "config"),
            artifacts=_optional(data, "artifacts"),
            integrity=_optional(data, "integrity"),
            **{name: _optional(data, name) for name in _PLAIN},
        )


_PLAIN = ("calibration", "fallback", "auto", "qat", "prune", "alignment", "comparison", "sensitivity")


def _typed(data: Mapping[str, Any], name: str, read: Callable[[Mapping[str, Any]], Section]) -> Section | None:
    section = data.get(name)
    return None if section is None else read(mapping(section, name))


def _optional(data: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    section = data.get(name)
    return None if section is None else mapping(section, name)


def created_now() -> str:
    """build.json's ``created``: now, in UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
