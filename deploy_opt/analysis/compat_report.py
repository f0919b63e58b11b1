"""compat.md and compat.json: the compatibility report as a typed record, rendered for a person, written for tools."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.analysis import compat_data as data
from deploy_opt.analysis.compat_dynamic import render_dynamic_markdown
from dopt_common.errors import ReportError
from dopt_common.files import write_json, write_text

FORMAT = "deploy_opt.analysis.compat/1"


@dataclass(frozen=True)
class CompatReport:
    """One model's compatibility on each target: a row per node, the flagged ones, counts and sources.

    ``nodes`` and ``flagged`` keep compat.json's row layout (index, name, op_type, status and reasons per target,
    kernels, TensorRT cells); ``summary`` counts ok / fallback / fail per target.
    """

    model: Mapping[str, Any]  # name, path, nodes, opsets
    targets: tuple[str, ...]
    sources: Mapping[str, Any]
    warnings: tuple[str, ...]
    tensorrt_parser: Mapping[str, Any]
    summary: Mapping[str, Mapping[str, int]]
    flagged: tuple[Mapping[str, Any], ...]
    nodes: tuple[Mapping[str, Any], ...]
    format: str = FORMAT

    def counts(self) -> dict[str, Any]:
        """The summary and the flagged count, for build.json."""
        return {"summary": {t: dict(c) for t, c in self.summary.items()}, "flagged": len(self.flagged)}

    def to_json(self) -> dict[str, Any]:
        """compat.json as written."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.loads(json.dumps({"format": self.format, **fields}, default=list))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompatReport:
        """Read compat.json; another format or a missing field is a ReportError naming it."""
        if data.get("format") != FORMAT:
            raise ReportError(f"compat.json has format {data.get('format')!r}; this deploy_opt reads {FORMAT!r}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data]
        if missing:
            raise ReportError(f"compat.json has no {missing}; run compat again to write it")
        tuples = {"targets", "warnings", "flagged", "nodes"}
        return cls(
            **{f.name: tuple(data[f.name]) if f.name in tuples else data[f.name] for f in dataclasses.fields(cls)}
        )


def render_compat_markdown(report: CompatReport) -> str:
    """compat.md: summary per target, flagged nodes, a table per op type, then one row per node."""
    targets, rows = report.targets, report.nodes
    versions = list(rows[0]["tensorrt"]) if rows else [v.version for v in data.tensorrt_versions()]
    opsets = ", ".join(f"{d} {v}" for d, v in report.model["opsets"].items())
    lines = [
        f"# Compatibility: {report.model['name']}",
        "",
        f"{report.model['nodes']} nodes; opsets: {opsets}; targets: {', '.join(targets)} "
        f"(tensorrt judged as {report.sources['tensorrt_target']['version']}).",
        "",
        *[f"- {name}: {_source_text(value)}" for name, value in report.sources.items()],
        *[f"- warning: {w}" for w in report.warnings],
        "",
        "| target | ok | fallback | fail |",
        "|---|---|---|---|",
        *[f"| {t} | {c['ok']} | {c['fallback']} | {c['fail']} |" for t, c in report.summary.items() if t in targets],
    ]
    if report.flagged:
        lines += ["", "## Flagged nodes", "", "| # | node | op | target | status | why |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {f['index']} | {_md(f['name'])} | {f['op_type']} | {f['target']} | {f['status']} | {_md(f['reason'])} |"
            for f in report.flagged
        ]
    lines += render_dynamic_markdown(rows)
    columns = ["ORT CPU", "ORT CUDA", "INT8 CPU", *[f"TRT {v}" for v in versions], "min opset", "min ORT", "min TRT"]
    by_op: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for row in rows:
        by_op.setdefault((row["op_type"], row["domain"], row["since_version"]), []).append(row)
    lines += ["", "## Per op type", "", "| op | domain | since | nodes | " + " | ".join(columns) + " | flagged |"]
    lines.append("|" + "---|" * (len(columns) + 5))
    for (op, domain, since), group in by_op.items():
        cells = [" / ".join(dict.fromkeys(c)) for c in zip(*(_cells(r, versions) for r in group), strict=True)]
        flagged = sum(any(r["status"][t] != "ok" for t in targets) for r in group)
        lines.append(f"| {op} | {domain} | {since} | {len(group)} | " + " | ".join(cells) + f" | {flagged} |")
    lines += ["", "## Nodes", "", "| # | node | op | " + " | ".join(columns) + " | status |"]
    lines.append("|" + "---|" * (len(columns) + 4))
    for row in rows:
        mark = "⚠ " if any(row["status"][t] != "ok" for t in targets) else ""
        status = ", ".join(f"{t}: {row['status'][t]}" for t in targets)
        name = _md(row["name"] if row["graph"] == "main" else f"{row['graph']}/{row['name']}")
        cells = " | ".join(_cells(row, versions))
        lines.append(f"| {row['index']} | {mark}{name} | {row['op_type']} | {cells} | {status} |")
    lines += [
        "",
        "Cells: yes = kernel; fn = runs the op's ONNX function; restricted = a TensorRT restriction applies; "
        "yes* = supported with restrictions deploy_opt did not check.",
        "",
    ]
    return "\n".join(lines)


def _cells(row: dict[str, Any], versions: list[str]) -> list[str]:
    def kernel(cell: dict[str, Any]) -> str:
        return "yes" if cell["kernel"] else "fn" if cell["via"] == "function" else "no"

    def tensorrt(cell: dict[str, Any]) -> str:
        if not cell["supported"]:
            return "no"
        return {"applies": "restricted", "unchecked": "yes*"}.get(cell["restriction"], "yes")

    int8 = ", ".join(row["int8_cpu"]["kernels"]) or "no"
    mins = [str(row[k]) if row[k] is not None else "-" for k in ("min_opset", "min_ort", "min_tensorrt")]
    trt = [tensorrt(row["tensorrt"][v]) for v in versions]
    return [kernel(row["ort_cpu"]), kernel(row["ort_cuda"]), int8, *trt, *mins]


def _source_text(value: Any) -> str:
    return ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_compat(report: CompatReport, out_dir: str | Path, *, name: str = "compat") -> tuple[Path, Path]:
    """Write ``<name>.json`` and ``<name>.md`` into ``out_dir`` atomically; their paths."""
    out = Path(out_dir)
    json_path = write_json(out / f"{name}.json", report.to_json())
    return json_path, write_text(out / f"{name}.md", render_compat_markdown(report))
