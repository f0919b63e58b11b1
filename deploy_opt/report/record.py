"""build.json and summary.md: the record of a build (publishing is ``dopt_common.runs.staged_dir``)."""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from deploy_opt.report.build_record import BuildRecord, created_now
from deploy_opt.report.manifest import BUILD_FORMAT
from deploy_opt.report.model_sections import QuantizationInfo
from deploy_opt.report.prune_report import prune_lines
from deploy_opt.report.record_sections import (
    BatchRow,
    BenchmarkRecord,
    DropUncertainty,
    GateResult,
    MetricsRecord,
    Timing,
)
from dopt_common.errors import ReportError
from dopt_common.files import sha256_file, write_json, write_text

PACKAGES = ("deploy_opt", "torch", "onnx", "onnxruntime", "onnxscript", "onnxsim", "onnxslim", "numpy")


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that shape the results, plus the machine."""
    found = {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "cpu": cpu_facts(),
    }
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_facts() -> str:
    """The CPU model and the ISA flags that decide INT8 speed (VNNI doubles int8 throughput; AMX more)."""
    model, flags = platform.processor() or platform.machine(), set()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    present = [f for f in INT8_FLAGS if f in flags]
    return f"{model}; int8 ISA: {', '.join(present) or 'none of ' + '/'.join(INT8_FLAGS)}"


def artifacts(stage: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file in the build folder."""
    return {
        p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(stage.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


def build_record(**sections: Any) -> BuildRecord:
    """A new build.json record: this format, created now, then the given sections (``BuildRecord``'s fields)."""
    return BuildRecord(format=BUILD_FORMAT, created=created_now(), **sections)


def size_line(artifacts: Mapping[str, Mapping[str, Any]]) -> str:
    """FP32 model.onnx against the shipped model.int8.onnx, with their external data files."""

    def total(stem: str) -> int:
        return sum(a["bytes"] for name, a in artifacts.items() if name.startswith(stem + ".onnx"))

    fp32, int8 = total("model"), total("model.int8")
    if not fp32 or not int8:
        return "n/a"
    return f"FP32 {fp32 / 2**20:.2f} MiB → shipped {int8 / 2**20:.2f} MiB ({fp32 / int8:.2f}x smaller)"


def _drop(drop: float, uncertainty: DropUncertainty | None) -> str:
    u = uncertainty
    text = f"{drop:.3f} points" + (f" (95% CI {u.low:.3f} to {u.high:.3f})" if u else "")
    return text + (f"; one sample moves it {u.resolution:.3g} points" if u and u.resolution else "")


def _split_lines(m: MetricsRecord) -> list[str]:
    """Where the decisions were taken, and the drop on those samples (biased in the build's favour)."""
    lines = [f"- split: {m.split}"] if m.split else []
    decided = m.decision
    if decided:
        lines.append(
            f"- on the {decided.samples} decision samples (what the search chose on, so biased in its "
            f"favour): drop {_drop(decided.drop, decided.uncertainty)}"
        )
    return lines


def _spread(t: Timing) -> str:
    return f"{t.p10_ms:.3f}/{t.median_ms:.3f}/{t.p90_ms:.3f}"


def _mixed_precision_lines(fallback: Mapping[str, Any], m: MetricsRecord, batches: Mapping[str, BatchRow]) -> list[str]:
    """The nodes kept in high precision, and what they cost and won."""
    if not fallback.get("nodes"):
        return []
    lines = [
        "",
        "## Mixed precision",
        "",
        f"- {len(fallback['nodes'])} node(s) kept in high precision: "
        + ", ".join(f"`{n}`" for n in fallback["nodes"][:12])
        + (" …" if len(fallback["nodes"]) > 12 else ""),
    ]
    if "ort_int8_no_fallback" in m.scores:
        lines.append(
            f"- accuracy: INT8 without fallback {m.scores['ort_int8_no_fallback']:.3f}, with {m.scores['ort_int8']:.3f}"
        )
    for size, row in batches.items():
        if "speedup_no_fallback" in row.speedups:
            lines.append(
                f"- speed cost at batch {size}: {row.speedups['speedup_no_fallback']:.2f}x without fallback → "
                f"{row.speedups['speedup']:.2f}x with it"
            )
    if fallback.get("auto"):
        lines.append(f"- auto: {fallback['auto']['verdict']} ({len(fallback['auto']['steps'])} steps)")
    return lines


def render_summary(build: BuildRecord) -> str:
    """A short human summary of build.json."""
    m, q = _required(build)
    lines = [
        f"# {build.name}",
        "",
        f"- profile: `{build.profile.name if build.profile else None}`, activations: {q.activations}, "
        f"calibration: {q.method} on {q.samples} samples",
        f"- {m.name} on {m.samples} judged evaluation samples: torch FP32 {_fmt(m.scores.get('torch_fp32'))}, "
        f"ORT FP32 {_fmt(m.scores['ort_fp32'])}, ORT INT8 {_fmt(m.scores['ort_int8'])}; drop "
        f"{_drop(m.drop, m.uncertainty)}",
        *_split_lines(m),
        f"- size: {size_line(build.artifacts or {})}",
        f"- scales: {q.scale_check}",
        *_coverage_lines(q),
    ]
    parity = build.export.parity if build.export else None
    if parity is not None:
        lines.append(
            f"- {'imported vs original ONNX' if parity.reference is not None else 'torch vs ORT FP32'} parity: "
            f"max-abs {parity.max_abs:.3g} (tolerance {parity.tolerance:.3g})"
        )
    lines += _calibration_lines(build.calibration or {})
    lines += _benchmark_lines(build.benchmark, (build.versions or {}).get("cpu", ""))
    batches = build.benchmark.batches if build.benchmark else {}
    lines += _mixed_precision_lines(build.fallback or {}, m, batches)
    lines += _search_lines(build.auto, q)
    lines += _qat_lines(build.qat, batches)
    lines += prune_lines(build.prune)
    lines += ["", "## Scale alignment", "", f"- {(build.alignment or {}).get('verdict', 'not checked')}"]
    for check in (build.alignment or {}).get("artifacts", []):
        lines.append(f"  - {check['artifact']}: {check['status']}" + (f" ({check['note']})" if check["note"] else ""))
    comparison = build.comparison or {}
    if comparison:
        lines.append(
            f"- cross-backend comparison (compare.json): {comparison['verdict']}; first diverging layer: "
            f"{(comparison.get('first_divergence') or {}).get('tensor', 'none')}"
        )
    lines += ["", "## Gate", ""] + [f"- {line}" for line in _gate_lines(build.gate)]
    lines += ["", "## Targets", ""] + [f"- {k}: {v}" for k, v in build.targets.status.items()]
    return "\n".join(lines) + "\n"


def _required(build: BuildRecord) -> tuple[MetricsRecord, QuantizationInfo]:
    """The metrics and quantization sections every summary shows."""
    for name in ("metrics", "quantization", "gate"):
        if getattr(build, name) is None:
            raise ReportError(f"build.json has no '{name}' section; fix: pass a build.json written by deploy_opt build")
    return build.metrics, build.quantization


def _calibration_lines(calibration: Mapping[str, Any]) -> list[str]:
    """How the calibration samples were chosen, and its warnings."""
    lines = []
    if calibration:
        lines.append(
            f"- calibration samples: {calibration['chosen']} of {calibration['candidates']}, stratified by "
            f"{calibration['stratify']}: {calibration['per_stratum']}"
        )
    return lines + [f"- **WARNING**: {warning}" for warning in calibration.get("warnings", [])]


def _benchmark_lines(bench: BenchmarkRecord | None, cpu: str) -> list[str]:
    """The latency table: FP32 and INT8 deciles and the speedup with its interval, per batch size."""
    if bench is None or not bench.batches:
        return []
    lines = [
        "",
        f"| batch | FP32 ms p10/median/p90 | INT8 ms p10/median/p90 | speedup (95% CI) |  ({bench.threads} "
        f"threads, interleaved pairs, at least {bench.repeats} rounds; {cpu})",
        "|---:|---:|---:|---:|",
    ]
    for size, row in bench.batches.items():
        ci = row.intervals.get("speedup")
        lines.append(
            f"| {size} | {_spread(row.timings['ort_fp32'])} | {_spread(row.timings['ort_int8'])} | "
            f"{row.speedups['speedup']:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f}x)" if ci else "") + " |"
        )
    return lines


def _coverage_lines(quantization: QuantizationInfo) -> list[str]:
    """How much of the model is INT8: quantized nodes of the quantizable ones, and the tensors by role.

    Fewer recognised weights than quantized nodes that carry one (a foreign file's weights behind Constant or
    Transpose nodes) is flagged: those nodes then quantize activations only.
    """
    roles = quantization.quantized_tensors
    nodes, total = quantization.quantized_nodes, quantization.quantizable_nodes
    if nodes is None or total is None:
        return []
    lines = [
        f"- INT8 nodes: {nodes} of {total} quantizable; tensors: {roles.get('activation', 0)} activations, "
        f"{roles.get('weight', 0)} weights, {roles.get('bias', 0)} biases"
    ]
    if nodes and roles.get("weight", 0) < nodes / 2:
        lines.append(
            f"- **WARNING**: only {roles.get('weight', 0)} weights recognised for {nodes} INT8 nodes: the rest "
            "quantize activations only (weights held by Constant or Transpose nodes are not initializers)"
        )
    return lines


def _search_lines(auto: Mapping[str, Any] | None, quantization: QuantizationInfo) -> list[str]:
    """The auto search's verdict and a table of every trial (quantization.mode: auto)."""
    if not auto:
        return []
    lines = ["", "## Search", "", f"- {auto['verdict']} ({auto['seconds']:.0f} s)"]
    if quantization.quantized_nodes == 0:
        lines.append("- model.int8.onnx quantizes no node: it is the FP32 model, not an INT8 one")
    batch = f" (batch {auto['latency_batch']})" if auto.get("latency_batch") else ""
    lines += [
        "",
        f"| step | candidate | quantized nodes | predicted drop | drop | speedup{batch} |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for t in auto["trials"]:
        speed = f"{t['speedup']:.2f}x" if t["speedup"] is not None else "n/a"
        lines.append(
            f"| {t['step']} | {t['label']} | {t['quantized_nodes']} | {_fmt(t['predicted_drop'])} | "
            f"{t['drop']:.3f} | {speed} |"
        )
    return lines


_QAT_ROWS = (
    ("ptq_all_int8", "PTQ, all INT8 (QAT's start)"),
    ("ptq", "PTQ's answer (with its fallback)"),
    ("qat", "QAT"),
)


def _qat_lines(qat: Mapping[str, Any] | None, batches: Mapping[str, BatchRow]) -> list[str]:
    """PTQ, PTQ + fallback and QAT side by side: accuracy, speed and nodes in INT8 (quantization.qat)."""
    if not qat:
        return []
    lines = ["", "## Quantization-aware training", ""]
    if not qat.get("ran"):
        return [*lines, f"- not run: {qat['why']}"]
    shipped = qat["shipped"]
    columns = {  # the benchmark columns that may have measured each row's model
        "qat": ("speedup_qat",),
        "ptq": ("speedup_ptq",),
        "ptq_all_int8": ("speedup_ptq_all_int8", "speedup_no_fallback"),
    }
    columns[shipped] = ("speedup",)
    sizes = list(batches)
    train = qat["training"]
    lines += [
        f"- shipped: **{shipped.upper()}**; {qat['why']}",
        f"- {train['steps']} steps ({train['stopped']}), {train['optimizer']}, {train['loss']} loss, checkpoint "
        f"of step {train['best_step']}, {train['seconds']:.0f} s; curves in qat.png",
        "",
        "| model | metric | drop | INT8 nodes | " + " | ".join(f"speedup b{b}" for b in sizes) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(sizes),
    ]
    for key, label in _QAT_ROWS:
        row = qat["rows"].get(key)
        if row is None:
            continue
        speeds = [next((batches[b].speedups[c] for c in columns[key] if c in batches[b].speedups), None) for b in sizes]
        cells = " | ".join("n/a" if v is None else f"{v:.2f}x" for v in speeds)
        lines.append(f"| {label} | {row['metric']:.3f} | {row['drop']:.3f} | {row['int8_nodes']} | {cells} |")
    return lines


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _gate_lines(gate: GateResult) -> list[str]:
    lines = [f"{'PASS' if c.passed else 'FAIL'}: {c.text}" for c in gate.criteria]
    return lines + [f"verdict: **{gate.verdict}**"]


def write_reports(stage: Path, build: BuildRecord) -> BuildRecord:
    """Write build.json (with artifact hashes and Q/DQ tensor digests) and summary.md into the staging folder;
    returns the record as written."""
    from deploy_opt.report.integrity import integrity_record

    files = artifacts(stage)
    # per-tensor digests: a changed Q/DQ model names its tensor
    build = dataclasses.replace(build, artifacts=files, integrity=integrity_record(stage))
    write_json(stage / "build.json", build.to_json())
    write_text(stage / "summary.md", render_summary(build))
    from deploy_opt.report.build_page import write_build_page

    write_build_page(stage)  # report.html: one self-contained page from the files above
    return build
