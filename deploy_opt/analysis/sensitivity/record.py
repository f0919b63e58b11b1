"""sensitivity.json as a typed record: the subset's metric, each analyzed node's proxies and drops, its rank.

``analyze`` returns a ``SensitivityRecord``; the build adds its model name, resolution and module paths with
``dataclasses.replace`` (a new record, the analysis is never mutated), and the ``sensitivity`` command adds the
build's figures. ``to_json`` writes sensitivity.json (format ``FORMAT``); ``from_json`` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dopt_common.errors import ReportError

FORMAT = "deploy_opt.analysis.sensitivity.analyze/1"


@dataclass(frozen=True)
class SubsetMetric:
    """The metric on the analysis subset: FP32 and INT8 scores, and how many samples the subset holds."""

    name: str
    higher_is_better: bool
    fp32: float
    int8: float
    subset_samples: int


@dataclass(frozen=True)
class NodeSensitivity:
    """One quantized node: its cost (MACs), its proxies, the exact drops when measured, and its rank (1: most)."""

    name: str
    op_type: str
    order: int
    weight_shape: list[int] | None
    macs: int
    mac_share: float
    proxy: Mapping[str, Any]  # propagated_sqnr_db, predicted_drop, local_sqnr_db, node_sqnr_db, sqnr_db, cosine
    drop_both: float | None
    drop_weight_only: float | None
    drop_activation_only: float | None
    recovered_all_but: float | None
    rank: int
    exact: bool
    module: str | None = None  # the PyTorch module path, where the exporter recorded it

    def to_json(self) -> dict[str, Any]:
        """The node's entry in sensitivity.json."""
        data = dataclasses.asdict(self)
        data["proxy"] = dict(self.proxy)
        if self.module is None:
            data.pop("module")
        return data


@dataclass(frozen=True)
class SensitivityRecord:
    """The whole analysis; ``resolution``, ``model`` and ``build`` are set by the stage that knows them."""

    metric: SubsetMetric
    mode: str
    top_k: int
    proxy: str  # "linearised" or "local"
    nodes: tuple[NodeSensitivity, ...]
    timings_s: Mapping[str, float]
    model: str | None = None
    resolution: Mapping[str, Any] | None = None  # what a drop on the subset can resolve (Resolution.to_json)
    build: Mapping[str, Any] | None = None  # the build's figures the ``sensitivity`` command quotes
    format: str = FORMAT

    def ranked(self) -> list[NodeSensitivity]:
        """The nodes, most sensitive first."""
        return sorted(self.nodes, key=lambda n: n.rank)

    def to_json(self) -> dict[str, Any]:
        """sensitivity.json as written."""
        data: dict[str, Any] = {} if self.model is None else {"model": self.model}
        data |= {
            "format": self.format,
            "metric": dataclasses.asdict(self.metric),
            "mode": self.mode,
            "top_k": self.top_k,
            "proxy": self.proxy,
            "nodes": [n.to_json() for n in self.nodes],
            "timings_s": dict(self.timings_s),
        }
        if self.resolution is not None:
            data["resolution"] = dict(self.resolution)
        if self.build is not None:
            data["build"] = dict(self.build)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SensitivityRecord:
        """Read sensitivity.json; another format or a missing field is a ReportError naming it."""
        if data.get("format") != FORMAT:
            raise ReportError(f"sensitivity.json has format {data.get('format')!r}; this deploy_opt reads {FORMAT!r}")
        try:
            return cls(
                metric=SubsetMetric(**data["metric"]),
                mode=str(data["mode"]),
                top_k=int(data["top_k"]),
                proxy=str(data["proxy"]),
                nodes=tuple(NodeSensitivity(**n) for n in data["nodes"]),
                timings_s=data["timings_s"],
                model=data.get("model"),
                resolution=data.get("resolution"),
                build=data.get("build"),
            )
        except (KeyError, TypeError) as exc:
            raise ReportError(f"sensitivity.json does not hold a sensitivity record ({exc}); run it again") from exc
