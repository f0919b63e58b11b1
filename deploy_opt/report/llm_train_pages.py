"""``report.html`` for a ``quantize-llm`` run and for a training run (``train run``), from their own files.

- LLM: the gate verdict; perplexity before and after (and with the KV cache simulated); the reference GPTQ beside
  it when the run asked for one; per-Linear weight and
  output error by layer; the stability generations, FP and quantized side by side; the GGUF read-back; the serve
  command; the scheme and calibration; the run snapshot.
- Training: loss, learning rate, gradient norm and optimizer state bytes over the steps (inline SVG), the evaluation,
  and the recommender's reasons when the run asked for them.
"""

from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path
from typing import Any

from deploy_opt.report import charts, html_parts

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"


def write_llm_page(folder: Path) -> Path:
    """``folder/report.html`` from ``quantize_report.json``."""
    report = json.loads((folder / "quantize_report.json").read_text(encoding="utf-8"))
    ppl = report.get("perplexity") or {}
    gate = report.get("gate") or {}
    kv = report.get("kv_cache") or {}
    criteria = "; ".join(c.get("text", "") for c in gate.get("criteria") or [])
    groups = ["original", "quantized"] + ([f"quantized + KV {kv['kv_cache']}"] if kv else [])
    values = [(ppl.get("original") or {}).get("ppl"), (ppl.get("quantized") or {}).get("ppl")]
    values += [(kv.get("perplexity") or {}).get("ppl")] if kv else []
    layers = (report.get("quantization") or {}).get("layers") or []
    body = "".join(
        [
            f"<h1>{html_parts.esc(report.get('name', folder.name))}: quantize-llm report</h1>",
            html_parts.verdict(
                gate.get("passed"),
                f"{report.get('method')}: perplexity {html_parts.fmt(values[0], '.4g')} → "
                f"{html_parts.fmt(values[1], '.4g')} ({html_parts.fmt(ppl.get('increase'), '+.2%')}). {criteria}",
            ),
            html_parts.key_values(
                [
                    ("scheme", (report.get("scheme") or {}).get("reason")),
                    ("model", (report.get("model") or {}).get("source")),
                    ("reference", (report.get("model") or {}).get("reference")),
                    ("source tensor types", _tensor_types(report)),
                    ("checkpoint", (report.get("checkpoint") or {}).get("format")),
                ]
            ),
            html_parts.section(
                "Held-out perplexity",
                charts.bar_chart("perplexity (lower is better)", groups, {"perplexity": values}, "")
                + html_parts.key_values(
                    [
                        ("protocol", (ppl.get("original") or {}).get("protocol")),
                        ("calibration windows start with BOS", (report.get("calibration") or {}).get("bos")),
                    ]
                ),
            ),
            html_parts.section("Reference GPTQ, same calibration and evaluation windows", _reference(report)),
            html_parts.section("KV cache", _kv(kv)),
            html_parts.section(
                "Per-Linear error by layer",
                _layer_chart(layers)
                + html_parts.table(
                    ("Linear", "shape", "weight error", "output error", "seconds"),
                    [
                        (
                            r.get("name"),
                            "×".join(map(str, r.get("shape") or [])),
                            r.get("weight_error"),
                            r.get("output_error"),
                            r.get("seconds"),
                        )
                        for r in layers
                    ],
                    text_columns=(0, 1),
                ),
            ),
            html_parts.section(
                "Stability: FP and quantized generations side by side", _stability(report.get("stability"))
            ),
            html_parts.section("GGUF", _gguf(report)),
            html_parts.section("Serve", _serve(report.get("serve") or {})),
            html_parts.section(
                "Run snapshot: seed, versions, config",
                html_parts.key_values([("seed", report.get("seed"))] + list((report.get("versions") or {}).items()))
                + f"<pre>{html_parts.esc(json.dumps(report.get('config') or {}, indent=1))}</pre>",
            ),
        ]
    )
    return html_parts.write_page(folder / REPORT_NAME, f"{report.get('name', folder.name)} quantize-llm report", body)


def _tensor_types(report: dict[str, Any]) -> str | None:
    """A GGUF source's tensor types as 'Q4_K 120, Q6_K 25, F32 65' (None for a Hugging Face folder)."""
    types = (report.get("model") or {}).get("tensor_types")
    return ", ".join(f"{name} {count}" for name, count in types.items()) if isinstance(types, dict) else None


def _reference(report: dict[str, Any]) -> str:
    """deploy_opt's increase beside the reference GPTQ's (``llm/reference_gptq.py``), or why it did not run."""
    record = report.get("reference_gptq")
    if not record:
        return ""
    if not record.get("ran"):
        return f"<p>not run: {html_parts.esc(record.get('reason'))}</p>"
    ours, ref = record.get("deploy_opt") or {}, record.get("reference") or {}
    version = (record.get("versions") or {}).get("llmcompressor", "")
    rows = [
        (f"deploy_opt {ours.get('method')}", *_reference_row(ours)),
        (f"{record.get('tool')} {version}", *_reference_row(ref)),
    ]
    return html_parts.table(
        ("quantizer", "perplexity FP", "perplexity quantized", "increase", "95% CI"), rows, text_columns=(0, 4)
    ) + html_parts.key_values(
        [
            ("reference settings", record.get("settings")),
            ("windows, tokens", f"{record.get('windows')}, {record.get('tokens')}"),
            ("deploy_opt's quantized perplexity over the reference's", _paired(record.get("quantized_vs_reference"))),
            ("reference float perplexity vs deploy_opt's", html_parts.fmt(record.get("float_ppl_gap"), "+.4%")),
            ("reference versions", json.dumps(record.get("versions") or {})),
            ("reference quantize seconds", html_parts.fmt(record.get("quantize_s"), ".1f")),
        ]
    )


def _paired(paired: dict[str, Any] | None) -> str | None:
    if not paired:
        return None
    low, high = paired["ci95"]
    return f"{paired['value']:+.2%} (95% CI {low:+.2%} to {high:+.2%}; below 0: deploy_opt's is better)"


def _reference_row(side: dict[str, Any]) -> tuple[Any, ...]:
    ci = side.get("ci95")
    interval = f"{ci[0]:+.2%} to {ci[1]:+.2%}" if ci else "(no per-window scores)"
    return (side.get("ppl_original"), side.get("ppl_quantized"), html_parts.fmt(side.get("increase"), "+.2%"), interval)


def _kv(kv: dict[str, Any]) -> str:
    if not kv:
        return ""
    memory = kv.get("memory") or {}
    return html_parts.key_values(
        [
            ("KV cache", kv.get("kv_cache")),
            (
                "perplexity change against the quantized weights alone",
                html_parts.fmt(kv.get("increase_vs_quantized"), "+.3%"),
            ),
            ("perplexity change against the original", html_parts.fmt(kv.get("increase_vs_original"), "+.3%")),
            (
                f"KV memory at {memory.get('session_len')} tokens, fp16 → quantized",
                f"{memory.get('fp16_bytes', 0) / 2**20:.1f} → {memory.get('bytes', 0) / 2**20:.1f} MiB "
                f"({html_parts.fmt(memory.get('saved_fraction'), '.1%')} saved)",
            ),
            ("stability with the quantized KV cache", f"{(kv.get('stability') or {}).get('flagged')} flagged"),
            ("simulation", kv.get("simulation")),
        ]
    )


def _layer_chart(layers: list[dict[str, Any]]) -> str:
    by_layer: dict[str, list[float]] = {}
    for record in layers:
        parts = str(record.get("name", "")).split(".")
        index = next((p for p in parts if p.isdigit()), "?")
        by_layer.setdefault(index, []).append(float(record.get("output_error") or 0.0))
    labels = sorted(by_layer, key=lambda k: int(k) if k.isdigit() else 1 << 30)
    return charts.bar_chart(
        "mean relative output error of the quantized Linears, by decoder layer",
        [f"layer {k}" for k in labels],
        {"output error": [sum(by_layer[k]) / len(by_layer[k]) for k in labels]},
        "",
        bar_height=8,
    )


def _stability(stability: dict[str, Any] | None) -> str:
    if not stability:
        return ""
    if "skipped" in stability:
        return f"<p>{html.escape(str(stability['skipped']))}</p>"
    rows = [
        (
            i,
            r.get("mode"),
            r.get("prompt", "")[:80],
            r.get("fp_text", ""),
            r.get("text", ""),
            ", ".join(r.get("new_flags", r.get("flags", []))) or "-",
            ", ".join(r.get("excused_flags", [])) or "-",
        )
        for i, r in enumerate(stability.get("runs") or [])
    ]
    head = html_parts.verdict(
        stability.get("ok"),
        f"{stability.get('flagged')} of {stability.get('generations')} "
        f"generations flagged; {stability.get('excused', 0)} excused (the FP model does the same)",
    )
    return head + html_parts.table(
        ("#", "mode", "prompt", "FP generation", "quantized generation", "flagged", "excused"),
        rows,
        text_columns=(1, 2, 3, 4, 5, 6),
    )


def _gguf(report: dict[str, Any]) -> str:
    record = (report.get("quantization") or {}).get("gguf")
    if not record:
        return ""
    back = record.get("read_back") or {}
    return html_parts.key_values(
        [
            ("file", record.get("file")),
            ("types", ", ".join(record.get("types") or [])),
            ("bytes", record.get("bytes")),
            (
                "read back",
                f"{back.get('tensors_checked')} tensors, exact: {back.get('exact')}, "
                f"max |diff| {back.get('max_abs_diff')}",
            ),
            ("llama.cpp", json.dumps(record.get("llama_cpp"))),
        ]
    )


def _serve(serve: dict[str, Any]) -> str:
    if not serve:
        return ""
    if serve.get("servable"):
        return f"<pre>{html_parts.esc(' '.join(serve.get('command') or []))}</pre>"
    command = serve.get("llama_cpp_command")
    extra = f"<pre>{html_parts.esc(' '.join(command))}</pre>" if command else ""
    return f"<p>{html_parts.esc(serve.get('reason', ''))}</p>{extra}"


def write_train_page(folder: Path) -> Path:
    """``folder/report.html`` from ``train_log.jsonl`` (and ``train_result.json``)."""
    events = [
        json.loads(line)
        for line in (folder / "train_log.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    steps = [e for e in events if e.get("event") == "step"]
    start = next((e for e in events if e.get("event") in ("start", "resume")), {})
    evals = [e for e in events if e.get("event") == "eval"]
    result_path = folder / "train_result.json"
    result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else {}
    config = start.get("config") or {}
    reasons = (start.get("recommendation") or {}).get("reasons") or []
    last = evals[-1] if evals else {}
    body = "".join(
        [
            f"<h1>{html_parts.esc(config.get('description') or folder.name)}: training report</h1>",
            html_parts.verdict(
                bool(result.get("completed")) if result else None,
                f"{len(steps)} of {start.get('total_steps', '?')} steps; final loss "
                f"{html_parts.fmt(result.get('final_loss'))}; "
                + ", ".join(f"{k} {html_parts.fmt(v)}" for k, v in last.items() if k not in ("event", "step")),
            ),
            html_parts.section(
                "Over the steps",
                "".join(
                    _curve(steps, key, label)
                    for key, label in (
                        ("loss", "training loss"),
                        ("lr", "learning rate"),
                        ("grad_norm", "gradient norm (before clipping)"),
                        ("optimizer_state_bytes", "optimizer state bytes"),
                    )
                ),
            ),
            html_parts.section(
                "The recommender's reasons",
                html_parts.table(("choice", "because"), [tuple(r) for r in reasons], text_columns=(0, 1)),
            ),
            html_parts.section(
                "Run snapshot",
                html_parts.key_values(
                    [("parameters", start.get("parameters")), ("skipped steps", result.get("skipped_steps"))]
                )
                + f"<pre>{html_parts.esc(json.dumps(config, indent=1))}</pre>",
            ),
        ]
    )
    return html_parts.write_page(folder / REPORT_NAME, f"{folder.name} training report", body)


def _curve(steps: list[dict[str, Any]], key: str, label: str, width: int = 640, height: int = 180) -> str:
    points = [
        (float(e["step"]), float(e[key]))
        for e in steps
        if isinstance(e.get(key), (int, float)) and math.isfinite(float(e[key]))
    ]
    if len(points) < 2:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    left, right, top, bottom = 60, width - 10, 24, height - 24
    path = " ".join(
        f"{left + (x - x0) / (x1 - x0) * (right - left):.1f},{bottom - (y - y0) / (y1 - y0) * (bottom - top):.1f}"
        for x, y in points
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
        f'<text x="8" y="16" font-size="12" font-weight="bold">{html_parts.esc(label)}</text>'
        f'<polyline fill="none" stroke="#4c72b0" stroke-width="1.2" points="{path}"/>'
        f'<text x="{left - 4}" y="{top + 4}" font-size="10" text-anchor="end">{html_parts.fmt(y1, ".3g")}</text>'
        f'<text x="{left - 4}" y="{bottom}" font-size="10" text-anchor="end">{html_parts.fmt(y0, ".3g")}</text>'
        f'<text x="{left}" y="{height - 6}" font-size="10">step {int(x0)}</text>'
        f'<text x="{right}" y="{height - 6}" font-size="10" text-anchor="end">step {int(x1)}</text></svg>'
    )
