"""``report.html`` of a build folder: the verdict first, then why, from build.json and the files beside it.

Sections: the gate and what shipped; each runtime's metric drop against FP32 beside max_drop, and latency per batch
size; the auto-mode search as drop against speedup, max_drop drawn and the shipped point marked; the per-layer table
(op, PyTorch module, weight shape, bytes before and after, share of weights, precision shipped, measured or predicted
drop); the sensitivity heatmap and its table; the histograms of the quantized activations and what each guard
decided; the compat summary per target; the cross-backend comparison (top-1 agreement for class scores only, the
SQNR chart saying how many tensors it shows); the config snapshot, versions and seed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deploy_opt.analysis.comparison import read_comparison
from deploy_opt.report import charts, html_parts
from deploy_opt.report.layers import layer_rows

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _gate(build: dict[str, Any]) -> str:
    gate = build.get("gate") or {}
    criteria = gate.get("criteria") or []
    metrics = build.get("metrics") or {}
    batches = (build.get("benchmark") or {}).get("batches") or {}
    speed = ", ".join(f"{b}: {v.get('speedup', 0):.2f}x" for b, v in batches.items() if v.get("speedup"))
    headline = (
        f"{metrics.get('name', 'metric')} FP32 {html_parts.fmt(metrics.get('ort_fp32'))} → INT8 "
        f"{html_parts.fmt(metrics.get('ort_int8'))} (drop {html_parts.fmt(metrics.get('drop'), '.3g')} points); "
        f"INT8 speedup by batch {speed or 'not measured'}"
    )
    reasons = "; ".join(c.get("text", "") for c in criteria)
    box = html_parts.verdict(
        gate.get("passed") if criteria else None, f"{headline}. {reasons}" if reasons else headline
    )
    auto = (build.get("auto") or {}).get("verdict")
    qat = build.get("qat") or {}
    qat_line = None
    if qat.get("why"):
        qat_line = f"{qat.get('shipped')} ships; {qat['why']}" if qat.get("ran") else f"not run: {qat['why']}"
    notes = [
        ("shipped", shipped_model(build)),
        ("auto mode", auto),
        ("QAT", qat_line),
        ("targets", "; ".join(f"{k}: {v}" for k, v in (build.get("targets") or {}).items())),
    ]
    return box + html_parts.key_values(notes)


def shipped_label(auto: dict[str, Any]) -> str | None:
    """The label of the auto search's chosen candidate: build.json's ``auto.chosen`` holds its settings, and the
    trials that measured it (its last timing is the confirming one) hold the same settings and its label."""
    chosen = auto.get("chosen")
    if not chosen:
        return None
    return next((t.get("label") for t in reversed(auto.get("trials") or []) if t.get("settings") == chosen), None)


def shipped_model(build: dict[str, Any]) -> str | None:
    """What model.int8.onnx is, in words: QAT's model, the auto search's candidate, or FP32 (None: plain PTQ)."""
    qat, auto = build.get("qat") or {}, build.get("auto")
    label = shipped_label(auto) if auto else None
    if qat.get("ran") and qat.get("shipped") == "qat":
        return f"the QAT model, fine-tuned from {label or 'the all-INT8 PTQ model'}"
    if qat.get("ran") and qat.get("shipped") == "ptq_all_int8":
        return "the all-INT8 PTQ model (QAT's start)"
    if auto is None:
        return None
    return f"{label} (auto search)" if label else "FP32: no INT8 candidate both met max_drop and paid"


_RUNTIMES = {
    "torch_fp32": "torch FP32",
    "ort_fp32_original": "ORT FP32 before pruning",
    "ort_fp32": "ORT FP32",
    "ort_int8": "ORT INT8 (shipped)",
    "ort_int8_no_fallback": "ORT INT8 without fallback",
    "ort_int8_qat": "ORT INT8, QAT",
    "ort_int8_ptq": "ORT INT8, PTQ",
    "ort_int8_ptq_all_int8": "ORT INT8, PTQ all-INT8",
    "tensorrt": "TensorRT",
}


def _runtime(key: str) -> str:
    return _RUNTIMES.get(key, key)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _accuracy(build: dict[str, Any]) -> str:
    """Every runtime's drop against the FP32 reference, beside max_drop: 100 and 99.34 must not look alike."""
    metrics = build.get("metrics") or {}
    base = metrics.get("drop_vs", "ort_fp32")
    reference = metrics.get(base)
    if not _number(reference):
        return ""
    sign = 1.0 if metrics.get("higher_is_better", True) else -1.0
    rows = [
        (f"{_runtime(key)}: {html_parts.fmt(value)}", sign * (reference - value))
        for key, value in metrics.items()
        if key.startswith(("torch_", "ort_", "tensorrt")) and key != base and _number(value)
    ]
    max_drop = ((build.get("config") or {}).get("gate") or {}).get("max_drop")
    title = (
        f"{metrics.get('name', 'metric')} drop against {_runtime(base)} ({html_parts.fmt(reference)}), "
        f"on {metrics.get('samples', '?')} judged samples"
    )
    return charts.drop_chart(title, rows, max_drop if _number(max_drop) else None)


def _accuracy_latency(build: dict[str, Any]) -> str:
    batches = (build.get("benchmark") or {}).get("batches") or {}
    names = sorted({k for v in batches.values() for k, r in v.items() if isinstance(r, dict) and "median_ms" in r})
    latency = charts.bar_chart(
        "median latency per batch (ms, lower is better)",
        [f"batch {b}" for b in batches],
        {_runtime(n): [(batches[b].get(n) or {}).get("median_ms") for b in batches] for n in names},
        "ms",
    )
    return f'<div class="grid"><div>{_accuracy(build)}</div><div>{latency}</div></div>'


def _auto_search(build: dict[str, Any]) -> str:
    auto = build.get("auto") or {}
    trials = auto.get("trials") or []
    config = build.get("config") or {}
    chosen = shipped_label(auto)
    shipped = max((i for i, t in enumerate(trials) if t.get("label") == chosen), default=None)
    points = [
        charts.Point(
            float(t.get("speedup") or float("nan")),
            float(t["drop"]) if t.get("drop") is not None else float("nan"),
            t.get("label", "?"),
            i == shipped,
        )
        for i, t in enumerate(trials)
    ]
    limits = []
    max_drop = (config.get("gate") or {}).get("max_drop")
    if _number(max_drop):
        limits.append(charts.Limit("y", float(max_drop), f"max_drop {html_parts.fmt(max_drop)}"))
    min_gain = (config.get("auto") or {}).get("min_gain")
    if _number(min_gain):
        limits.append(charts.Limit("x", float(min_gain), f"min_gain {html_parts.fmt(min_gain)}x"))
    chart = charts.scatter_chart(
        "auto-mode trials: metric drop against INT8 speedup",
        points,
        f"speedup at batch {auto.get('latency_batch', '?')} (x FP32)",
        "drop (points)",
        limits,
    )
    rows = [
        (
            t.get("label"),
            t.get("step"),
            t.get("drop"),
            t.get("predicted_drop"),
            t.get("speedup"),
            t.get("quantized_nodes"),
            t.get("seconds"),
        )
        for t in trials
    ]
    table = html_parts.table(
        ("trial", "step", "drop", "predicted drop", "speedup", "INT8 nodes", "seconds"),
        rows,
        text_columns=(0, 1),
        highlight=() if shipped is None else (shipped,),
    )
    return chart + table


def _calibration(build: dict[str, Any], folder: Path) -> str:
    quant = build.get("quantization") or {}
    rows = []
    for name, tensor in (quant.get("tensors") or {}).items():
        observed = tensor.get("observed") or [None, None]
        chosen = tensor.get("range") or [None, None]
        rows.append(
            (
                name,
                tensor.get("method"),
                observed[0],
                observed[1],
                chosen[0],
                chosen[1],
                tensor.get("guard") or tensor.get("decision") or "",
            )
        )
    table = html_parts.table(
        ("tensor", "method", "observed min", "observed max", "range min", "range max", "guard"),
        rows,
        text_columns=(0, 1, 6),
    )
    return html_parts.image(folder / "calibration.png", "calibration histograms") + table


def _compat(folder: Path, build: dict[str, Any]) -> str:
    """One table per compat file; a target the build does not deploy to is shown for information, never as a fault."""
    configured = ((build.get("config") or {}).get("deploy") or {}).get("targets") or []
    parts = []
    for name in ("compat.json", "compat.int8.json", "compat.trt.json"):
        data = _load(folder / name)
        if not data:
            continue
        deployed = set(data.get("targets") or configured)
        summary = data.get("summary") or {}
        order = sorted(summary, key=lambda target: target not in deployed)
        rows = [
            (
                target,
                "deployed" if target in deployed else "informational: not deployed to",
                summary[target].get("ok"),
                summary[target].get("fallback"),
                summary[target].get("fail"),
            )
            for target in order
        ]
        flagged = [
            (f.get("name") or f.get("node"), f.get("op_type"), f.get("target"), f.get("why") or f.get("reason"))
            if isinstance(f, dict)
            else (str(f), "", "", "")
            for f in (data.get("flagged") or [])
        ][:50]
        parts.append(
            f"<h3>{html_parts.esc(name)}</h3>"
            + _compat_verdict(summary, deployed)
            + html_parts.table(("target", "role", "ok", "fallback", "fail"), rows, text_columns=(0, 1))
            + html_parts.table(("flagged node", "op", "target", "why"), flagged, text_columns=(0, 1, 2, 3))
        )
    return "".join(parts)


def _compat_verdict(summary: dict[str, Any], deployed: set[str]) -> str:
    """Red only for a deployed target with failing nodes; other targets' counts are information."""
    failing = [f"{t}: {c.get('fail')} nodes fail" for t, c in summary.items() if t in deployed and c.get("fail")]
    if failing:
        return html_parts.verdict(False, "; ".join(failing))
    others = [t for t, c in summary.items() if t not in deployed and (c.get("fail") or c.get("fallback"))]
    if others:
        return html_parts.verdict(
            None,
            f"{', '.join(others)}: not deployed to by this build (deploy.targets: "
            f"{', '.join(sorted(deployed)) or 'none'}); their counts are for information",
        )
    return ""


SQNR_SHOWN = 40  # more bars than this do not read at a glance: the lowest are shown, and the chart says so


def sqnr_chart(layers: Sequence[Mapping[str, Any]], modules: dict[str, str]) -> str:
    """Each quantized tensor's SQNR in graph order; over SQNR_SHOWN tensors, the lowest SQNR_SHOWN, counted."""
    measured = [layer for layer in layers if layer.get("quant_sqnr_db") is not None]
    shown = measured
    what = f"all {len(measured)} quantized tensors, in graph order"
    if len(measured) > SQNR_SHOWN:
        lowest = {id(layer) for layer in sorted(measured, key=lambda layer: layer["quant_sqnr_db"])[:SQNR_SHOWN]}
        shown = [layer for layer in measured if id(layer) in lowest]
        what = (
            f"{SQNR_SHOWN} of {len(measured)} quantized tensors: the {SQNR_SHOWN} lowest, in graph order "
            "(compare.json holds every one)"
        )
    names = [f"{modules.get(str(layer.get('node')), layer.get('node'))}: {layer.get('name')}" for layer in shown]
    return charts.bar_chart(
        "quantization SQNR per tensor, INT8 against FP32 (dB, higher is better)",
        names,
        {"SQNR": [layer.get("quant_sqnr_db") for layer in shown]},
        "dB",
        note=what,
    )


def _comparison(folder: Path, modules: dict[str, str], metric: str | None) -> str:
    if not (folder / "compare.json").is_file():
        return ""
    data = read_comparison(folder / "compare.json")
    rows = []
    for backend, record in data.backends.items():
        for output, numbers in (record.outputs or {}).items():
            rows.append(
                [
                    backend,
                    output,
                    numbers.get("cosine"),
                    numbers.get("sqnr_db"),
                    numbers.get("max_abs"),
                    numbers.get("top1_agreement"),
                    "pass" if record.passed else "fail",
                ]
            )
        if not record.outputs:
            rows.append([backend, "", None, None, None, None, record.status])
    headers = ["backend", "output", "cosine", "SQNR (dB)", "max abs", "top-1 agreement", "status"]
    # top-1 agreement means something for class scores only: an embedding's argmax is no prediction
    if metric not in (None, "top1") or all(row[5] is None for row in rows):
        headers.pop(5)
        rows = [row[:5] + row[6:] for row in rows]
    table = html_parts.table(headers, rows, text_columns=(0, 1, len(headers) - 1))
    first = divergence_text(data.first_divergence)
    failing = [name for name, record in data.backends.items() if record.passed is False]
    text = f"comparison {data.verdict}; first diverging layer: {first}"
    text += f"; backends that fail: {', '.join(failing)}" if failing else ""
    note = html_parts.verdict(data.verdict == "pass", text)
    return note + table + sqnr_chart(list(data.layers), modules)


def divergence_text(first: Mapping[str, Any] | None) -> str:
    """compare.json's first divergence in words ("none" when there is none)."""
    if not first:
        return "none"
    where = f"tensor '{first.get('tensor')}' ({first.get('op')}, node '{first.get('node')}')"
    if first.get("reason") == "drop":
        return (
            f"{where}: output {html_parts.fmt(first.get('drop_db'), '.1f')} dB worse than its inputs' noise predicts "
            f"(limit {html_parts.fmt(first.get('threshold'))} dB)"
        )
    return (
        f"{where}: its own quantization SQNR is {html_parts.fmt(first.get('sqnr_db'), '.1f')} dB, below "
        f"{html_parts.fmt(first.get('threshold'))} dB"
    )


def _snapshot(build: dict[str, Any]) -> str:
    versions = html_parts.key_values(list((build.get("versions") or {}).items()))
    config = json.dumps(build.get("config") or {}, indent=1)
    return (
        html_parts.key_values(
            [
                ("seed", build.get("seed")),
                ("created", build.get("created")),
                ("profile", (build.get("profile") or {}).get("name")),
            ]
        )
        + versions
        + f"<pre>{html_parts.esc(config)}</pre>"
    )


def write_build_page(folder: Path) -> Path:
    """Write ``folder/report.html`` from the build's own files; returns its path."""
    build = _load(folder / "build.json")
    if build is None:
        raise FileNotFoundError(folder / "build.json")
    sensitivity = folder / "sensitivity.html"
    body = "".join(
        [
            f"<h1>{html_parts.esc(build.get('name', folder.name))}: build report</h1>",
            f'<p class="muted">{html_parts.esc(build.get("description", ""))}</p>',
            _gate(build),
            html_parts.section("Accuracy and latency: FP32 against INT8", _accuracy_latency(build)),
            html_parts.section("Auto-mode search", _auto_search(build), "each trial's measured drop and speedup"),
            html_parts.section(
                "Per layer",
                layer_rows(folder, build),
                "module paths come from the exporter's name scopes; bytes are the weight's, before and after",
            ),
            html_parts.section(
                "Sensitivity",
                html_parts.image(folder / "sensitivity.png", "sensitivity heatmap")
                + (
                    f'<p><a href="{sensitivity.name}">sortable per-node sensitivity table</a></p>'
                    if sensitivity.is_file()
                    else ""
                ),
            ),
            html_parts.section("Calibration", _calibration(build, folder)),
            html_parts.section(
                "Compatibility per target",
                _compat(folder, build),
                "deployed targets are judged; the others are shown for information",
            ),
            html_parts.section(
                "Cross-backend comparison",
                _comparison(
                    folder,
                    (build.get("export") or {}).get("module_names") or {},
                    (build.get("metrics") or {}).get("name"),
                ),
            ),
            html_parts.section("Run snapshot: seed, versions, config", _snapshot(build)),
        ]
    )
    return html_parts.write_page(folder / REPORT_NAME, f"{build.get('name', folder.name)} build report", body)
