"""The release gate: accuracy drop and speedup criteria over a build's ``build.json``.

Exit codes of ``python -m deploy_opt gate``: 0 every criterion passes, 1 one fails, 2 the report cannot
be judged (missing file or field).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from xml.sax.saxutils import quoteattr

from deploy_opt.evaluation.uncertainty import MIN_JUDGED_SAMPLES, NOISY_WIDTH, perplexity_increase_interval
from deploy_opt.report.build_record import READABLE_FORMATS, BuildRecord
from deploy_opt.report.llm_report import LLMReport
from deploy_opt.report.manifest import BUILD_FORMAT
from deploy_opt.report.record_sections import BatchRow, Criterion, GateResult, MetricsRecord
from dopt_common.errors import ConfigError, NumericsError, ReportError
from dopt_common.files import write_text


def load_build(path: str | Path) -> dict[str, Any]:
    """Read build.json, or raise ReportError naming the problem."""
    path = Path(path)
    if path.is_dir():
        llm = path / "quantize_report.json"
        path = llm if llm.is_file() and not (path / "build.json").is_file() else path / "build.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ReportError(f"build report '{path}' does not exist; fix: run 'python -m deploy_opt build' first") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"build report '{path}' is not readable JSON ({exc})") from exc
    if not isinstance(data, dict) or ("metrics" not in data and "perplexity" not in data):
        raise ReportError(
            f"report '{path}' has no 'metrics' section (build.json) nor 'perplexity' (quantize_report.json); "
            "fix: pass a deploy_opt build.json or quantize_report.json"
        )
    found = data.get("format", BUILD_FORMAT) if "metrics" in data else BUILD_FORMAT  # none: a hand-written report
    if found not in READABLE_FORMATS:
        raise ReportError(
            f"build report '{path}' has format {found!r}, which this deploy_opt does not read (it reads "
            f"'{BUILD_FORMAT}'); fix: rebuild with this deploy_opt, or gate it with the version that wrote it"
        )
    return data


def parse_max_increase(value: str | float) -> float:
    """'5%', '0.05' or 0.05 → 0.05; anything else is a ConfigError naming the value."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"max perplexity increase {value!r} is not a number; write it as 5% or 0.05")
    text = str(value).strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(f"max perplexity increase '{value}' is not a number; write it as 5% or 0.05") from None
    if not 0 <= fraction < 100 or math.isnan(fraction):
        raise ConfigError(f"max perplexity increase '{value}' must be >= 0 (e.g. 5% or 0.05)")
    return fraction


def ppl_gate(original_ppl: float, quantized_ppl: float, max_increase: str | float) -> Criterion:
    """Pass when quantized perplexity is at most ``max_increase`` (relative) above the original's."""
    limit = parse_max_increase(max_increase)
    before, after = float(original_ppl), float(quantized_ppl)
    if not math.isfinite(before) or before <= 0:
        raise NumericsError(f"original perplexity {before} is not a positive finite number; re-measure it")
    increase = after / before - 1 if math.isfinite(after) else math.inf
    text = f"perplexity {before:.2f} → {after:.2f} ({increase:+.1%}) <= +{limit * 100:g}%"
    return Criterion("max_ppl_increase", increase, limit, increase <= limit, text)


def parse_increase(value: str | float) -> float:
    """'5%' or 0.05 → 0.05 for a report being judged; anything else is a ReportError naming the value."""
    try:
        return parse_max_increase(value)
    except ConfigError as exc:
        raise ReportError(str(exc)) from None


def ppl_interval_gate(original: Mapping[str, Any], quantized: Mapping[str, Any], limit: float) -> Criterion:
    """The perplexity increase judged by its 95% interval over the evaluation windows (``window_nll``: per window,
    summed NLL and scored tokens): pass only when the interval's upper end is within ``limit``, so that what one
    calibration seed or one window moves cannot flip the verdict. A report without per-window scores (written
    before them, or by hand) is judged on the point value, and says so."""
    criterion = ppl_gate(float(original["ppl"]), float(quantized["ppl"]), limit)
    windows_a, windows_b = original.get("window_nll"), quantized.get("window_nll")
    if not windows_a or not windows_b or len(windows_a) != len(windows_b) or len(windows_a) < 2:
        return dataclasses.replace(criterion, text=f"{criterion.text} (point value: no per-window scores)")
    try:
        interval = perplexity_increase_interval(windows_a, windows_b)
    except ValueError as exc:
        raise ReportError(f"report perplexity windows do not pair ({exc}); re-run quantize-llm") from None
    measured = (
        f"perplexity {float(original['ppl']):.2f} → {float(quantized['ppl']):.2f} ({interval.value:+.1%}, 95% CI "
        f"{interval.low:+.1%} to {interval.high:+.1%} over {len(windows_a)} windows)"
    )
    if interval.high <= limit:
        return dataclasses.replace(criterion, passed=True, text=f"{measured}: within +{limit * 100:g}%")
    why = "above" if interval.low > limit else "not shown within"
    text = f"{measured}: {why} +{limit * 100:g}% (the interval's upper end decides; more windows narrow it)"
    return dataclasses.replace(criterion, passed=False, text=text)


def apply_ppl_gate(report: LLMReport, max_increase: str | float) -> GateResult:
    """Judge a quantize_report.json: the held-out perplexity increase, original → quantized, by its interval."""
    limit = parse_increase(max_increase)
    criteria = [ppl_interval_gate(report.perplexity.original, report.perplexity.quantized, limit)]
    stability = report.stability or {}
    if report.stable is not None:
        flagged = int(stability.get("flagged", 0))
        total = stability.get("generations", "?")
        text = f"stability run: {flagged} of {total} generations flagged (NaN/Inf logits, repetition)"
        if "baseline" in stability:
            text += f" that the FP model does not show ({stability.get('excused', 0)} excused: the FP model does too)"
        criteria.append(Criterion("stability", flagged, 0, report.stable, text))
    kv = report.kv_cache or {}
    if kv:
        criterion = ppl_interval_gate(report.perplexity.original, kv["perplexity"], limit)
        criteria.append(
            dataclasses.replace(
                criterion, name="perplexity_kv_cache", text=f"{criterion.text} with the {kv['kv_cache']} KV cache"
            )
        )
        judged = kv["stability"]
        criteria.append(
            Criterion(
                "stability_kv_cache",
                judged["flagged"],
                0,
                bool(judged["ok"]),
                f"stability run with the {kv['kv_cache']} KV cache: {judged['flagged']} of "
                f"{judged['generations']} generations flagged that the FP model does not show",
            )
        )
    criteria += read_back_criteria(report)
    return GateResult(all(c.passed for c in criteria), tuple(criteria))


def read_back_criteria(report: LLMReport) -> list[Criterion]:
    """The written file read back as a user loads it (a GGUF's ``meaning``): its perplexity against the in-process
    model's, within ``max_gap``. Judged with or without a perplexity limit: a file that is not the model fails."""
    meaning = ((report.checkpoint or {}).get("reload") or {}).get("meaning")
    if not meaning:
        return []
    gap = meaning["gap"]
    file_ppl = "non-finite logits" if gap is None else f"{meaning['ppl_file']:.4g} (gap {gap:.2%})"
    worst = ", ".join(t["name"] for t in meaning.get("differing_tensors", [])[:3]) or "none"
    text = (
        f"read-back: {meaning['reader']} scores the file {file_ppl} against {meaning['ppl_in_process']:.4g} in "
        f"process, limit {meaning['max_gap']:.0%}; the tensors differing most: {worst}"
    )
    measured = sys.float_info.max if gap is None else float(gap)  # JSON has no inf
    return [Criterion("read_back", measured, float(meaning["max_gap"]), bool(meaning["passed"]), text)]


class GateThresholds(Protocol):
    """What the gate checks: the build config's ``gate`` section, or the ``gate`` command's flags over it."""

    @property
    def max_drop(self) -> float | None: ...

    @property
    def min_speedup(self) -> float | None: ...

    @property
    def speedup_batch(self) -> int | None: ...

    @property
    def allow_fp32(self) -> bool: ...


def apply_gate(build: BuildRecord, gate: GateThresholds) -> GateResult:
    """Judge a build: metric drop (FP32 → INT8, in metric points) and INT8 speedup at one batch size.

    A build whose Q/DQ model quantizes no node is never passed off as INT8: it fails unless ``gate.allow_fp32``.
    """
    max_drop, min_speedup = gate.max_drop, gate.min_speedup
    if max_drop is not None and not math.isfinite(max_drop):
        raise ConfigError(f"gate: --max-drop {max_drop} is not a finite number; give the largest drop in points")
    if min_speedup is not None and not (math.isfinite(min_speedup) and min_speedup >= 0):
        raise ConfigError(f"gate: --min-speedup {min_speedup} must be a finite factor >= 0, e.g. 1.2")
    quantized_nodes = build.quantization.quantized_nodes if build.quantization else None
    criteria: list[Criterion] = _int8_criterion(quantized_nodes, gate.allow_fp32)
    if max_drop is not None:
        criteria.append(_accuracy_criterion(build.metrics, max_drop))
    if min_speedup is not None:
        criteria.append(_speed_criterion(build, min_speedup, gate.speedup_batch))
    return GateResult(all(c.passed for c in criteria), tuple(criteria))


def _accuracy_criterion(metrics: MetricsRecord | None, max_drop: float) -> Criterion:
    """The drop on the judged samples, with its interval, sample count and resolution; not judged (and not
    passed) on fewer than ``MIN_JUDGED_SAMPLES`` samples."""
    try:
        drop = float(metrics.drop)  # type: ignore[union-attr, arg-type]
    except (AttributeError, TypeError, ValueError) as exc:
        raise ReportError("build report: metrics.drop is missing; rebuild with this deploy_opt") from exc
    base = metrics.drop_vs or "ort_fp32"
    fp32, int8 = metrics.scores.get(base, float("nan")), metrics.scores.get("ort_int8", float("nan"))
    what = "unpruned FP32" if base == "ort_fp32_original" else "FP32"
    samples, u = metrics.samples, metrics.uncertainty
    step = u.resolution if u else None
    interval = f" (95% CI {u.low:.3f} to {u.high:.3f})" if u else ""
    on = f" on {samples} judged samples" if samples is not None else ""
    text = (
        f"{metrics.name or 'metric'} drop {drop:.3f} points{interval}{on} ({what} {fp32:.3f} → INT8 "
        f"{int8:.3f}) <= {max_drop:g}"
    )
    if step:
        text += f"; one sample moves it {step:.3g} points" + (", more than max_drop" if step > max_drop else "")
    if samples is not None and samples < MIN_JUDGED_SAMPLES:
        text = (
            f"accuracy not judged: {samples} evaluation sample(s), fewer than {MIN_JUDGED_SAMPLES}; {text}; fix: "
            "give data.evaluation more samples"
        )
        return Criterion("max_drop", drop, max_drop, False, text, judged=False)
    return Criterion("max_drop", drop, max_drop, drop <= max_drop, text)


def _speed_criterion(build: BuildRecord, min_speedup: float, speedup_batch: int | None) -> Criterion:
    """INT8 speedup at one batch size, timed where the build deploys; not judged when model.int8.onnx is the FP32
    model (timed against itself)."""
    targets = list(build.targets.status)  # build.json: target -> what was built for it
    if targets and "ort-cpu" not in targets:
        return _gpu_speed_criterion(build, min_speedup, speedup_batch, targets)
    batches = build.benchmark.batches if build.benchmark else {}
    if not batches:  # benchmark.enabled=false: the build's own gate leaves speed out, so does this one
        text = (
            f"speed not measured: the build ran without a benchmark (benchmark.enabled=false), so min_speedup "
            f"{min_speedup:g}x is not judged; rebuild with benchmark.enabled=true to gate speed"
        )
        return Criterion("min_speedup", 0.0, min_speedup, True, text, judged=False)
    size = str(speedup_batch or max(int(b) for b in batches))
    if size not in batches or "speedup" not in batches[size].speedups:
        raise ReportError(
            f"build report has no speedup at batch {size}; measured batches: {', '.join(sorted(batches))}"
        )
    row = batches[size]
    vs_original = "speedup_int8_vs_original" in row.speedups  # a pruned build: judged against the unpruned FP32
    speedup = float(row.speedups["speedup_int8_vs_original" if vs_original else "speedup"])
    if build.quantization is not None and build.quantization.quantized_nodes == 0:
        text = f"speed not judged: model.int8.onnx is the FP32 model ({speedup:.2f}x against itself is noise)"
        return Criterion("min_speedup", speedup, min_speedup, True, text, judged=False)
    against = " over the unpruned FP32" if vs_original else ""
    ci = None if vs_original else row.intervals.get("speedup")
    if not ci:  # a build.json from before intervals, or a pruned build's unpruned baseline: the median alone
        text = f"INT8 speedup{against} {speedup:.2f}x at batch {size} (median, no interval) >= {min_speedup:g}x"
        return Criterion("min_speedup", speedup, min_speedup, speedup >= min_speedup, text)
    return _interval_speed(row, speedup, (float(ci[0]), float(ci[1])), min_speedup, size)


def _gpu_speed_criterion(
    build: BuildRecord, min_speedup: float, speedup_batch: int | None, targets: list[str]
) -> Criterion:
    """A GPU profile's speed: the TensorRT engine against ORT CUDA running the FP32 model, where both ran here;
    otherwise not measured. A CPU timing is never shown under a GPU profile's targets."""
    trt = build.backends.artifacts.tensorrt if build.backends else None
    rows = trt.speedups if trt is not None else {}
    if rows and (build.quantization is None or build.quantization.quantized_nodes != 0):
        size = str(speedup_batch) if str(speedup_batch) in rows else max(rows, key=int)
        speedup = float(rows[size])
        sign = ">=" if speedup >= min_speedup else "<"
        text = f"TensorRT INT8 over ORT CUDA FP32: {speedup:.2f}x at batch {size} (median) {sign} {min_speedup:g}x"
        return Criterion("min_speedup", speedup, min_speedup, speedup >= min_speedup, text)
    found = [str(trt.status)] if trt is not None and trt.status else []
    if trt is not None and trt.ort_cuda is not None:
        found.append(f"ORT CUDA: {trt.ort_cuda}")
    why = f" ({'; '.join(found)})" if found else ""
    text = (
        f"speed not measured: no GPU timing here{why}; the build deploys to {', '.join(targets)}, whose speed a "
        f"CPU timing does not tell, so min_speedup {min_speedup:g}x is not judged; build on the GPU to gate speed"
    )
    return Criterion("min_speedup", 0.0, min_speedup, True, text, judged=False)


def _interval_speed(row: BatchRow, speedup: float, ci: tuple[float, float], limit: float, size: str) -> Criterion:
    """Pass only when the interval's lower end clears ``limit``; fail when its upper end is below it; a wide
    interval across ``limit`` is timing noise and is not judged."""
    low, high = ci
    spread = "; ".join(
        f"{name[4:].upper()} p10/median/p90 {t.p10_ms:.3g}/{t.median_ms:.3g}/{t.p90_ms:.3g} ms"
        for name, t in row.timings.items()
        if name in ("ort_fp32", "ort_int8")
    )
    measured = f"{speedup:.2f}x (95% CI {low:.2f}-{high:.2f}x) at batch {size}"
    if low >= limit:
        return Criterion("min_speedup", speedup, limit, True, f"INT8 speedup {measured} >= {limit:g}x")
    if high >= limit and (high - low) / speedup > NOISY_WIDTH:
        text = f"speed not judged: timing too noisy (INT8 speedup {measured}; {spread}); rerun on an idle machine"
        return Criterion("min_speedup", speedup, limit, True, text, judged=False)
    text = f"INT8 speedup {measured}: the interval's lower end is below {limit:g}x ({spread})"
    return Criterion("min_speedup", speedup, limit, False, text)


def _int8_criterion(count: int | None, allow_fp32: bool) -> list[Criterion]:
    """A failing criterion when model.int8.onnx quantizes no node (a passing one when FP32 is allowed)."""
    if count is None or count > 0:
        return []
    if allow_fp32:
        return [Criterion("int8_nodes", 0, 0, True, "no node is quantized: FP32 ships (gate.allow_fp32 is true)")]
    text = "model.int8.onnx quantizes 0 nodes, so it is the FP32 model; set gate.allow_fp32: true to ship it"
    return [Criterion("int8_nodes", 0, 1, False, text)]


def junit_xml(result: GateResult, suite: str) -> str:
    """A JUnit XML report, one test case per criterion, for CI systems to display."""
    failures = sum(not c.passed for c in result.criteria)
    cases = []
    for c in result.criteria:
        body = "" if c.passed else f"<failure message={quoteattr(c.text)}/>"
        cases.append(f"    <testcase classname={quoteattr(suite)} name={quoteattr(c.name)}>{body}</testcase>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name={quoteattr("deploy_opt.report.gate." + suite)} tests="{len(result.criteria)}" '
        f'failures="{failures}" errors="0">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )


def write_junit(result: GateResult, path: str | Path, suite: str) -> Path:
    """``junit_xml`` written atomically to ``path`` (a regular file: never a link, device or FIFO)."""
    return write_text(path, junit_xml(result, suite))
