"""The pruning part of a build's report: ``prune.png`` and the stage table of ``summary.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dopt_common.deps import require
from dopt_common.files import save_png

_COLOURS = {"original": "#555555", "pruned": "#dd8452", "distilled": "#55a868", "int8": "#4c72b0"}


def plot_prune(record: dict[str, Any], metric: str, path: Path) -> Path:
    """Four panels over the stages: parameters, MACs, latency at the largest batch, and the metric."""
    matplotlib = require("matplotlib", purpose="the pruning plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = record["stages"]
    names = [r["stage"] for r in rows]
    colours = [_COLOURS.get(n, "#999999") for n in names]
    batch = max((b for r in rows for b in r["latency_ms"]), key=int, default=None)
    panels = [
        ("parameters (M)", [r["params"] / 1e6 for r in rows]),
        ("MACs per sample (M)", [(r["macs"] or 0) / 1e6 for r in rows]),
        (f"ORT latency, batch {batch} (ms)", [r["latency_ms"].get(batch) for r in rows]),
        (f"{metric} vs the original", [_metric(r) for r in rows]),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
    for ax, (title, values) in zip(axes, panels, strict=True):
        bars = ax.bar(names, [0.0 if v is None else v for v in values], color=colours)
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:.3g}" for v in values], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    low = min((v for v in panels[3][1] if v), default=0.0)
    axes[3].set_ylim(bottom=max(0.0, low - 0.1 * max(abs(low), 1e-3)))
    removed = ", ".join(f"{k} {100 * v['ratio']:.0f}%" for k, v in record["removed"].items())
    fig.suptitle(
        f"structured pruning ({record['method']}, per_layer {record['per_layer']}): {removed} removed", fontsize=10
    )
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


def _metric(row: dict[str, Any]) -> float:
    value = row["metric_ort"] if row["metric_ort"] is not None else row["metric_torch"]
    return float(value) if value is not None else 0.0


def prune_lines(record: dict[str, Any] | None) -> list[str]:
    """The ``## Pruning`` section: what was removed, training, and the stage table."""
    if not record:
        return []
    removed = "; ".join(
        f"{k}: {v['before']} → {v['after']} ({100 * v['ratio']:.1f}%)" for k, v in record["removed"].items()
    )
    lines = ["", "## Pruning", "", f"- removed ({record['method']}, per_layer {record['per_layer']}): {removed}"]
    train = record.get("training")
    if train:
        lines.append(
            f"- distilled from the unpruned model: {train['steps']} steps ({train['stopped']}), {train['loss']} "
            f"loss, checkpoint of step {train['best_step']}, {train['seconds']:.0f} s"
        )
    lines.append("- weights: pruned.pt; curves: prune.png; the gate judges against the unpruned FP32 model")
    batches = sorted({b for r in record["stages"] for b in r["latency_ms"]}, key=int)
    lines += [
        "",
        "| stage | params | MACs/sample | size | metric (torch) | metric (ORT) | "
        + " | ".join(f"ms b{b}" for b in batches)
        + " |",
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(batches),
    ]
    for r in record["stages"]:
        cells = " | ".join(f"{r['latency_ms'][b]:.2f}" if b in r["latency_ms"] else "n/a" for b in batches)
        lines.append(
            f"| {r['stage']} | {r['params']:,} | {_count(r['macs'])} | {_count(r['bytes'], 'B')} | "
            f"{_num(r['metric_torch'])} | {_num(r['metric_ort'])} | {cells} |"
        )
    return lines


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _count(value: int | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {suffix}{unit}"
    return f"{value} {unit}".strip()
