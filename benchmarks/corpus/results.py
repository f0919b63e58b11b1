"""The corpus results: one row per model × tool, kept in ``.cache/results.json`` and written to RESULTS.md.

A run replaces only the rows of the models and tools it ran, so the table always shows the latest run of every
model × tool; each row carries the time it was measured (rows of one model measured at different times were
timed in different loops).
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TOOL_ORDER = (
    "prepare",
    "deploy_opt",
    "ort-minmax",
    "ort-entropy",
    "modelopt-entropy",
    "modelopt-max",
    "nncf",
    "nncf-ac",
    "aimet",
)
STORE = HERE / ".cache" / "results.json"
RESULTS = HERE / "RESULTS.md"


@dataclass(frozen=True)
class Row:
    """One tool's outcome on one model; a value that could not be measured is a string saying why."""

    model: str
    tool: str
    metric: str = "-"
    fp32: float | None = None
    value: float | str | None = None
    speedup: dict[str, float | str] = field(default_factory=dict)  # batch size -> speedup, or why not
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    outcome: str = ""
    measured: str = ""
    cpu: str = ""  # the int8 ISA of the machine that measured the row (``isa()``): speedups depend on it most
    sample_scores: list[float] | None = None  # the metric per test sample (or per scored unit), in one order

    @property
    def drop(self) -> float | None:
        """FP32 minus the tool's value (positive = worse; every corpus metric is higher-is-better)."""
        ok = isinstance(self.value, float) and isinstance(self.fp32, float)
        return self.fp32 - self.value if ok else None


def save(model: str, rows: list[Row], store: Path = STORE) -> None:
    """Replace ``model``'s rows of the tools in ``rows`` in the store (a failed preparation replaces them all)."""
    data = json.loads(store.read_text(encoding="utf-8")) if store.is_file() else {}
    now = dt.datetime.now().isoformat(timespec="seconds")
    fresh = [{**asdict(r), "measured": now, "cpu": isa()} for r in rows]
    tools = {r.tool for r in rows}
    kept = [] if "prepare" in tools else [r for r in data.get(model, []) if r["tool"] not in tools | {"prepare"}]
    data[model] = sorted(kept + fresh, key=lambda r: TOOL_ORDER.index(r["tool"]) if r["tool"] in TOOL_ORDER else 99)
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = store.with_name(store.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(store)


def load(order: list[str], store: Path = STORE, committed: Path = RESULTS) -> list[list[Row]]:
    """Every model's rows, models in ``order``: this machine's store, and for each model × tool it lacks the row
    of the committed RESULTS.md (``from_markdown``), so a partial run on a fresh machine keeps the other models'
    rows and the other tools' rows of the models it ran."""
    data = json.loads(store.read_text(encoding="utf-8")) if store.is_file() else {}
    earlier = from_markdown(committed) if committed.is_file() else {}
    out = []
    for model in order:
        rows = [Row(**r) for r in data.get(model, [])]
        tools = {r.tool for r in rows}
        # a failed preparation outdates every earlier row, and a row measured here an earlier failed preparation
        stale = tools | ({"prepare"} if tools else set())
        rows += [r for r in earlier.get(model, []) if r.tool not in stale and "prepare" not in tools]
        if rows:
            out.append(sorted(rows, key=lambda r: TOOL_ORDER.index(r.tool) if r.tool in TOOL_ORDER else 99))
    return out


def _number(cell: str, suffix: str = "") -> float | str | None:
    """A table cell back to its value: "-" is None, "1.32x" 1.32 (with ``suffix`` "x"), else the text."""
    if cell == "-":
        return None
    try:
        return float(cell.removesuffix(suffix))
    except ValueError:
        return cell


def from_markdown(path: Path) -> dict[str, list[Row]]:
    """The rows of a RESULTS.md table, by model (``table``'s inverse, less the per-sample scores it never
    printed: the noise test of ``verdict`` then compares the drops as they are)."""
    year = next((w[:4] for w in path.read_text(encoding="utf-8").split() if w[:4].isdigit() and w[4:5] == "-"), "0000")
    rows: dict[str, list[Row]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 14 or cells[0] in ("model", "---") or cells[0].startswith("---"):
            continue
        model, tool, metric, fp32, value, _, b1, b8, b32, wall, rss, outcome, measured, cpu = cells
        speeds = {b: _number(c, "x") for b, c in (("1", b1), ("8", b8), ("32", b32)) if c != "-"}
        fp32_value = _number(fp32)
        row = Row(
            model,
            tool,
            metric,
            fp32_value if isinstance(fp32_value, float) else None,
            _number(value),
            {b: v for b, v in speeds.items() if v is not None},
            _number(wall) if wall != "-" else None,
            _number(rss) if rss != "-" else None,
            outcome,
            f"{year}-{measured.replace(' ', 'T')}" if measured != "-" else "",
            "" if cpu == "-" else cpu,
        )
        rows.setdefault(model, []).append(row)
    return rows


def cpu() -> str:
    """The CPU model and its int8-relevant flags, from /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown", set()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return f"{model}; " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted)


def isa() -> str:
    """The int8 instruction set ORT's CPU kernels get here, in a few words (VNNI or not decides INT8 speed)."""
    flags: set[str] = set()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        line = next((x for x in info.read_text().splitlines() if x.startswith("flags")), "")
        flags = set(line.partition(":")[2].split())
    if "amx_int8" in flags:
        return "AMX"
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    return "AVX-VNNI" if "avx_vnni" in flags else "AVX2, no VNNI" if "avx2" in flags else "no AVX2"


def _cell(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value.replace("|", "/")
    return format(value, spec) + suffix


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("onnxruntime", "onnx", "torch"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} missing")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return ", ".join(parts) + f"; deploy_opt at commit {commit.stdout.strip() or 'unknown'} (plus uncommitted work)"


TABLE_HEAD = (
    "| model | tool | metric | FP32 | value | drop | speedup b1 | speedup b8 | speedup b32 | wall s | peak RSS MiB "
    "| outcome | measured | CPU |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
)


def table(measured: list[list[Row]]) -> str:
    """The Markdown table of every row."""
    lines = [TABLE_HEAD]
    for rows in measured:
        for r in rows:
            cells = [
                r.model,
                r.tool,
                r.metric,
                _cell(r.fp32),
                _cell(r.value),
                _cell(r.drop),
                *(_cell(r.speedup.get(b), suffix="x") for b in ("1", "8", "32")),
                _cell(r.wall_s, ".0f"),
                _cell(r.peak_rss_mb, ".0f"),
                r.outcome.replace("|", "/"),
                r.measured[5:16].replace("T", " "),
                r.cpu or "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOISE = 0.05  # two interleaved medians this close are the same speed on these machines


def _speeds(row: Row) -> dict[str, float]:
    return {b: v for b, v in row.speedup.items() if isinstance(v, float)}


def verdict(rows: list[Row]) -> str:
    """One model's line against the bar: deploy_opt loses no more than the best peer, and runs at least as fast
    (within ``NOISE``) as every peer that loses no more than it does, or ships FP32."""
    ours = next((r for r in rows if r.tool == "deploy_opt"), None)
    peers = [r for r in rows if r.tool not in ("deploy_opt", "prepare") and r.drop is not None]
    if ours is None or ours.drop is None or not peers:
        return f"- {rows[0].model}: not judged (no deploy_opt score or no peer score)"
    best = min(peers, key=lambda r: r.drop or 0.0)
    accurate = round(ours.drop, 2) <= round(best.drop or 0.0, 2)
    noise = "" if accurate else _within_noise(ours, best)
    if "ships FP32" in ours.outcome:
        fast, why = True, "ships FP32"
    else:
        slower = [
            f"{r.tool} b{b} {v:.2f}x vs {_speeds(ours).get(b, 0.0):.2f}x"
            for r in peers
            if round(r.drop or 0.0, 2) <= round(ours.drop, 2)
            for b, v in _speeds(r).items()
            if _speeds(ours).get(b, 0.0) < v * (1 - NOISE)
        ]
        fast, why = not slower, "; ".join(slower) or "as fast as every peer that loses no more"
    loss = "holds" if accurate else f"holds within noise ({noise})" if noise else "LOSES MORE"
    return (
        f"- {ours.model}: drop {ours.drop:.2f} vs best peer {best.tool} {best.drop:.2f}: "
        f"{loss}; speed: {'holds' if fast else 'SLOWER'} ({why})"
    )


def _within_noise(ours: Row, best: Row) -> str:
    """Why deploy_opt's larger drop is noise, or "" when it is not: the gap is at most one standard error of the
    paired per-sample difference on the same test samples (a peer one flipped prediction of 256 above FP32 does
    not beat the FP32 model that deploy_opt shipped). The build's own search counts a drop the same way."""
    a, b = ours.sample_scores, best.sample_scores
    if not a or not b or len(a) != len(b) or len(a) < 2:
        return ""
    diff = np.asarray(b, np.float64) - np.asarray(a, np.float64)
    gap, error = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))
    if gap > error:
        return ""
    return f"{best.tool} scores {gap:.2f} ± {error:.2f} higher on the same {len(diff)} test samples, one standard error"


def write(order: list[str], notes: str, path: Path = RESULTS) -> Path:
    """Write RESULTS.md from the store: header, machine, table, notes."""
    measured = load(order)
    when = sorted({r.measured[:10] for rows in measured for r in rows}) or ["never"]
    text = "\n\n".join(
        [
            "# Corpus results: deploy_opt defaults vs ORT quantize_static, ModelOpt ONNX PTQ, NNCF and AIMET-ONNX",
            f"Written {dt.date.today().isoformat()}; rows measured on {', '.join(when)}.\n"
            f"This machine: {cpu()}; ORT CPU, {2} intra-op threads.\n{_versions()}.\n"
            f"Rows measured on machines with {' and with '.join(sorted({r.cpu or '?' for rs in measured for r in rs}))}"
            " (the CPU column): a model's tools are always measured side by side on one machine in one run, but the "
            "speedups of two models measured on different machines are not comparable.",
            table(measured),
            "Against the bar (deploy_opt loses no more than the best peer, a larger drop within one standard error "
            "of the paired per-sample difference on the same test samples counting as noise; and runs at least as "
            f"fast, within {NOISE:.0%}, as every peer that loses no more, or ships FP32):\n\n"
            + "\n".join(verdict(rows) for rows in measured if rows),
            notes.strip(),
        ]
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
