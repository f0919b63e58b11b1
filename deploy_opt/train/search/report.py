"""What a search leaves: ``search.json`` (every trial), ``curves.png`` (the best five against the default),
``search.html`` (the table and the plot, self-contained) and ``best.yaml`` (ready for ``train run``)."""

from __future__ import annotations

import base64
import html
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from deploy_opt.train.search.trial import trial_config
from dopt_common.deps import require
from dopt_common.files import atomic_path, save_png, write_json

log = logging.getLogger(__name__)

TOP = 5


def trial_rows(studies: dict[str, Any]) -> list[dict[str, Any]]:
    """Every numbered trial of both studies, by number: parameters, state, value, curve, metrics, time."""
    rows = []
    for study in studies.values():
        for t in study.get_trials(deepcopy=False):
            attrs = t.user_attrs
            if "number" not in attrs:
                continue
            value = t.value if t.state.name == "COMPLETE" else None
            rows.append(
                {
                    "number": attrs["number"],
                    "stage": attrs["stage"],
                    "label": attrs.get("label", ""),
                    "params": attrs["params"],
                    "steps": attrs["steps"],
                    "state": t.state.name.lower(),
                    "eval_loss": value,
                    "steps_done": attrs.get("step", 0),
                    "metrics": attrs.get("metrics", {}),
                    "steps_to_converge": attrs.get("steps_to_converge"),
                    "state_bytes": attrs.get("state_bytes"),
                    "seconds": attrs.get("seconds"),
                    "curve": attrs.get("curve", []),
                    "error": attrs.get("error"),
                }
            )
    return sorted(rows, key=lambda r: r["number"])


def full_length_best(rows: list[dict[str, Any]], steps: int) -> dict[str, Any] | None:
    """The completed full-length trial (trial 0/1 or stage 2) with the lowest evaluation loss."""
    full = [r for r in rows if r["eval_loss"] is not None and r["steps"] == steps and r["stage"] != "grid"]
    return min(full, key=lambda r: r["eval_loss"], default=None)


def write_report(folder: Path, summary: dict[str, Any], base: dict[str, Any], threads: int | None) -> dict[str, Path]:
    """search.json, curves.png, search.html and best.yaml in ``folder``."""
    paths = {"json": write_json(folder / "search.json", summary)}
    paths["curves"] = plot_curves(summary, folder / "curves.png")
    best = summary.get("best")
    if best is not None:
        paths["best"] = write_best(folder / "best.yaml", base, best, threads)
    paths["html"] = write_html(folder / "search.html", summary, paths["curves"])
    paths["report"] = folder / "report.html"  # every run folder has one; a search's is its search.html
    with atomic_path(paths["report"]) as tmp:
        shutil.copyfile(paths["html"], tmp)
    return paths


def write_best(path: Path, base: dict[str, Any], best: dict[str, Any], threads: int | None) -> Path:
    """The user's config with the best trial's hyper-parameters, full length."""
    data = trial_config(base, best["params"], best["steps"], threads)
    data.pop("checkpoint_every", None)
    data["output_dir"] = "train_output"
    head = (
        f"# The best trial of `train search` (trial {best['number']}, {best['label']}):\n"
        f"# eval_loss {best['eval_loss']:.6g} after {best['steps']} steps.\n"
        "#   python -m deploy_opt train run --config best.yaml\n"
    )
    if threads:
        head += f"# threads: {threads} is what the trials ran with; another count changes the last digits.\n"
    with atomic_path(path) as tmp:
        tmp.write_text(head + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def plot_curves(summary: dict[str, Any], path: Path) -> Path:
    """The training loss of the best five full-length trials against the default config's."""
    matplotlib = require("matplotlib", purpose="the search's curves.png")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["trials"]
    default = next((r for r in rows if r["number"] == summary["default_number"]), None)
    ranked = [
        r
        for r in rows
        if r["eval_loss"] is not None and r["stage"] != "grid" and r["number"] != summary["default_number"]
    ]
    ranked = sorted(ranked, key=lambda r: r["eval_loss"])[:TOP]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for row in ranked:
        steps, losses = _smooth_curve(row["curve"])
        ax.plot(steps, losses, linewidth=1.2, label=f"#{row['number']} {row['label'][:50]} ({row['eval_loss']:.4g})")
    if default is not None and default["curve"]:
        steps, losses = _smooth_curve(default["curve"])
        value = "n/a" if default["eval_loss"] is None else f"{default['eval_loss']:.4g}"
        ax.plot(
            steps, losses, color="black", linestyle="--", linewidth=1.6, label=f"default #{default['number']} ({value})"
        )
    lowest = min((v for line in ax.get_lines() for v in line.get_ydata()), default=0.0)
    if lowest > 0:
        ax.set_yscale("log")  # losses span decades; the ends, where trials differ, stay readable
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (smoothed)")
    ax.set_title(f"{summary['name']}: best {len(ranked)} trials against the default (eval_loss in brackets)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path)


def _smooth_curve(curve: list[list[float]]) -> tuple[list[float], list[float]]:
    from deploy_opt.train.search.trial import smoothed

    return [s for s, _ in curve], smoothed(curve)


def write_html(path: Path, summary: dict[str, Any], curves: Path) -> Path:
    """One self-contained page: the verdict, the recommender's reasons, the trial table and the plot."""
    image = base64.b64encode(curves.read_bytes()).decode("ascii")
    best, default = summary.get("best"), summary.get("default")
    verdict = "no full-length trial completed"
    if best is not None and default is not None and default.get("eval_loss") is not None:
        verdict = (
            f"best: trial {best['number']} ({html.escape(best['label'])}), eval_loss {best['eval_loss']:.4g} "
            f"against the default's {default['eval_loss']:.4g}"
        )
    reasons = "".join(f"<li><b>{html.escape(c)}</b>: {html.escape(r)}</li>" for c, r in summary.get("reasons", []))
    head = (
        "<tr><th>#</th><th>stage</th><th>trial</th><th>state</th><th>steps</th><th>eval_loss</th>"
        "<th>steps to converge</th><th>state bytes</th><th>seconds</th></tr>"
    )
    body = "".join(_row_html(r, best) for r in summary["trials"])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(summary["name"])} search</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:70em}}table{{border-collapse:collapse;font-size:0.9em}}
td,th{{border:1px solid #ccc;padding:0.25em 0.5em;text-align:right}}td:nth-child(3){{text-align:left}}
tr.best{{background:#e6f4e6}}</style></head><body>
<h1>{html.escape(summary["name"])}: hyper-parameter search</h1>
<p><b>{verdict}</b>. {summary["completed"]} of {summary["trials_total"]} trials completed, {summary["pruned"]} pruned,
{summary["failed"]} failed, in {summary["seconds"]:.0f} s with {summary["parallel"]} in parallel.</p>
<h2>Trial 0: the recommender</h2><ul>{reasons or "<li>the config names no model_type</li>"}</ul>
<h2>Loss curves</h2><img alt="curves" src="data:image/png;base64,{image}">
<h2>Trials</h2><table>{head}{body}</table></body></html>"""
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path


def _row_html(row: dict[str, Any], best: dict[str, Any] | None) -> str:
    def num(value: Any, fmt: str) -> str:
        return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, fmt)

    css = ' class="best"' if best is not None and row["number"] == best["number"] else ""
    label = html.escape(row["label"]) + (f" <i>{html.escape(row['error'])}</i>" if row.get("error") else "")
    return (
        f"<tr{css}><td>{row['number']}</td><td>{row['stage']}</td><td>{label}</td><td>{row['state']}</td>"
        f"<td>{row['steps_done']}/{row['steps']}</td><td>{num(row['eval_loss'], '.4g')}</td>"
        f"<td>{num(row['steps_to_converge'], 'd')}</td><td>{num(row['state_bytes'], ',')}</td>"
        f"<td>{num(row['seconds'], '.1f')}</td></tr>"
    )
