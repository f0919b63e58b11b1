"""The auto search: quantize a few candidates, measure each on the evaluation set and on the target runtime, and
keep the fastest that meets the gate.

1. **Placement × scheme**: ``inputs`` (Q/DQ only into quantized nodes: residual- and LayerNorm-aware), ORT's
   ``outputs``, and ``outputs+chain`` (also the activations, pools and reshapes between weighted ops, so that ORT
   runs integer chains: ``candidates.CHAIN_OPS``; tried for ORT CPU when the graph has such a chain), for each
   activation scheme the targets accept. Ranges come from one calibration of every tensor any of them quantizes,
   re-chosen per scheme (``calibration.method: auto`` picks each tensor's range method by propagated output error).
   **Dynamic INT8** then, for ORT CPU alone, while none meets ``max_drop`` and pays: ORT's weights-ahead,
   activations-at-run-time INT8 of MatMul/Gemm/LSTM/Attention (``build/dynamic.py``).
2. **SmoothQuant** at ``auto.smoothquant_alpha``, when no candidate meets ``max_drop`` and the graph has
   LayerNorm-fed MatMuls.
3. **Head in float**: each placement again with the model's head (the last weighted nodes and the decode ops
   after them: ``head.py``) in FP32, when no candidate meets ``max_drop``: a detector's hand recipe, found by trial.
   **Recovery** then, while none meets it: cross-layer equalization, bias correction and learned rounding on the
   most accurate base that pays, stacked while each helps (``recover.py``).
4. **Fallback**: the linearised proxy ranks the nodes of the most accurate candidate; exact evaluations of
   growing prefixes of that ranking (doubling, then bisection) find the fewest FP32 nodes that meet ``max_drop``.
   Each variant equals the model the quantizer writes with those nodes excluded (``exclusion_variant``).
5. **Latency**: low-intensity nodes (small reduction length) go back to FP32 where that makes the model faster.
6. **No INT8**: when no trial that meets ``max_drop`` is ``auto.min_gain`` faster than FP32, FP32 ships.

The search stops starting trials once ``auto.budget_s`` is spent, and chooses among what it measured. A trial
"meets ``max_drop``" only with one standard error of its drop to spare (``Trial.meets``): the fastest of many
candidates scored on the same decision samples is the one those samples flatter most, and the gate judges others.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from deploy_opt.autotune.candidates import CHAIN_OPS, Candidate, allowed_placements, allowed_schemes, configured
from deploy_opt.autotune.context import (
    Base,
    SearchContext,
    base_of,
    most_accurate,
    new_context,
    paying,
    variant_model,
)
from deploy_opt.autotune.head import float_head
from deploy_opt.autotune.recover import recovery_trials
from deploy_opt.autotune.refine import fallback_bases, fallback_trials, latency_trials
from deploy_opt.autotune.trials import SPEED_TIE, AutoSearch, Trial, best_trial, chosen_trial
from deploy_opt.config.setup import SearchSettings
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.stages.calibrate import ActivationRanges, calibrate_activations, rescheme
from deploy_opt.stages.calibration_set import CalibrationSet
from deploy_opt.stages.quantize import quantize
from deploy_opt.stages.smoothing import smooth_model
from dopt_common.clock import WorkClock
from exporters.ort.graph import PLACEMENTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchOutcome:
    """The search record and the base the chosen candidate derives from (None when FP32 ships)."""

    search: AutoSearch
    base: Base | None


def run_search(
    settings: SearchSettings,
    fp32_path: Path,
    calibration: CalibrationSet,
    held: list[Batch],
    metric: Metric,
    static: tuple[str, ...],
    work: Path,
) -> SearchOutcome:
    """Search as the module docstring says; ``static`` nodes stay FP32 in every candidate.

    With ``sensitivity.parallel`` > 1 (or an address) the fallback scores its next doublings as Ray tasks at once
    and then walks them in the serial order, so it takes the serial run's decisions (``refine.py``)."""
    auto = settings.setup.auto
    clock = WorkClock.start(auto.budget_s, auto.budget_s * auto.wall_cap, settings.setup.runtime.threads)
    ctx = new_context(settings, fp32_path, held, metric, clock, calibration, work)
    try:
        return _search(ctx, fp32_path, calibration, held, static, work)
    finally:
        if ctx.executor is not None:
            ctx.executor.close()


def _search(
    ctx: SearchContext,
    fp32_path: Path,
    calibration: CalibrationSet,
    held: list[Batch],
    static: tuple[str, ...],
    work: Path,
) -> SearchOutcome:
    from tqdm import tqdm

    auto = ctx.settings.setup.auto

    if sys.stderr.isatty():  # no bar object at all otherwise: a signal landing in its __del__ would be swallowed
        ctx.bar = tqdm(
            total=round(auto.budget_s),
            desc="auto search (of its budget)",
            unit="s",
            leave=False,
            bar_format="{desc}: {n:.0f}/{total} s {bar} {postfix}",
        )
    bases = _placement_trials(ctx, fp32_path, calibration, static, work)
    max_drop = ctx.settings.gate.max_drop
    # Search on while no candidate both meets max_drop and pays (when timed): an accurate candidate slower than
    # FP32 is no answer when a fast one with its head in float, or a few nodes back in FP32, would be.
    goal = auto.min_gain if ctx.probe is not None else None
    dynamic: list[Base] = []  # kept apart: the steps below vary Q/DQ models, which a dynamic one is not
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left() and _dynamic_pays(ctx):
        dynamic = _dynamic_trial(ctx, fp32_path, static, work)
    smoothquant = auto.smoothquant_alpha is not None and _has_smoothing_targets(ctx.fp32)
    # SmoothQuant calibrates the smoothed model again: on a ViT-S that started at 165 s of 240 and ended at 297 s
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left(ctx.calibration_s) and smoothquant:
        bases += _smoothquant_trial(ctx, fp32_path, calibration, bases, work)
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left():
        bases += _head_trials(ctx, bases)
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left() and auto.recovery:
        bases += recovery_trials(ctx, bases, work)
    if best_trial(ctx.trials, max_drop, goal) is None:
        for base in fallback_bases(ctx, bases):
            if ctx.time_left():
                fallback_trials(ctx, base, held)
    static_trials = [t for t in ctx.trials if not t.candidate.dynamic]  # latency varies Q/DQ models
    accurate = chosen_trial(static_trials, max_drop, None)
    if accurate is not None and ctx.probe is not None and ctx.time_left():
        latency_trials(ctx, accurate, base_of(accurate, bases))
    chosen = chosen_trial(ctx.trials, max_drop, auto.min_gain)
    if chosen is None and ctx.probe is not None and auto.min_gain is not None:
        # The ranking's one-thread CPU time can undersell INT8 at benchmark.threads (textdet's fallback: 1.02x on
        # one thread, 1.12x on the wall clock at two): one within the tie band is timed as users run it.
        chosen = chosen_trial(ctx.trials, max_drop, auto.min_gain / (1 + SPEED_TIE))
    chosen = _confirmed(ctx, chosen)
    verdict = _verdict(ctx, chosen)
    if ctx.bar is not None:
        ctx.bar.close()
        ctx.bar = None  # gone before the verdict is logged
    log.info("auto: %s", verdict)
    search = AutoSearch(
        chosen.candidate if chosen else None,
        tuple(ctx.trials),
        verdict,
        ctx.clock.wall(),
        len(next(iter(ctx.probe.feed.values()))) if ctx.probe else None,
        work_s=ctx.clock.spent(),
        capped=ctx.clock.capped(),
    )
    return SearchOutcome(search, base_of(chosen, bases + dynamic) if chosen else None)


def _confirmed(ctx: SearchContext, chosen: Trial | None) -> Trial | None:
    """Time the winner again, three times as long: the fastest of several noisy timings is biased upwards."""
    if chosen is None or ctx.probe is None:
        return chosen
    latency, speed = ctx.probe.speedup_interval(ctx.models[chosen.candidate], scale=3.0)
    again = dataclasses.replace(
        chosen, step="confirm", latency_ms=latency, speedup=speed.value, speedup_low=speed.low, seconds=0.0
    )
    ctx.trials.append(again)
    interval = f"{speed.value:.2f}x FP32 (95% CI {speed.low:.2f}-{speed.high:.2f}x)"
    log.info("auto confirm     %-24s %s", chosen.candidate.label, interval)
    return again if again.pays(ctx.settings.setup.auto.min_gain) else None


def _placement_trials(
    ctx: SearchContext, fp32_path: Path, calibration: CalibrationSet, static: tuple[str, ...], work: Path
) -> list[Base]:
    setup, bases = ctx.settings.setup, []
    placements = allowed_placements(setup.deploy.targets, PLACEMENTS)
    shapes = [(p, "weighted") for p in placements] + ([("outputs", "chain")] if _chains_pay(ctx) else [])
    widest = configured(setup, Candidate("outputs", setup.quantization.activations, None, static, shapes[-1][1]))
    first: ActivationRanges | None = None  # one calibration pass (of every tensor any shape quantizes)
    for scheme in allowed_schemes(setup.deploy.targets, setup.quantization.activations):
        ranges: ActivationRanges | None = None  # each further scheme only re-chooses the ranges
        for placement, coverage in shapes if first is None else _affordable(ctx, shapes, scheme, first):
            again = first.choice_seconds if ranges is None and first is not None else 0.0
            if bases and not ctx.time_left(again):
                return bases
            candidate = Candidate(placement, scheme, None, static, coverage)
            chosen = configured(setup, candidate)
            if ranges is None and first is not None:
                ranges = rescheme(first, chosen, fp32_path, calibration)
            if ranges is None:
                calibrating = ctx.clock.spent()
                ranges = calibrate_activations(widest, fp32_path, calibration)
                ctx.calibration_s = ctx.clock.spent() - calibrating
            first = first or ranges
            folder = work / f"{placement}-{coverage}-{scheme}"
            model = quantize(chosen, fp32_path, calibration, folder, ranges=ranges)
            ctx.measure("placement", candidate, onnx.load(str(model.path)))
            bases.append(Base(candidate, fp32_path, model, None))
    return bases


def _affordable(
    ctx: SearchContext, shapes: list[tuple[str, str]], scheme: str, first: ActivationRanges
) -> list[tuple[str, str]]:
    """The shapes a further scheme is tried on: all of them while they cost at most a third of the budget left,
    else only the first scheme's most accurate one (a ViT-S spent 150 of its 240 work seconds on six placements,
    and the budget ran out before SmoothQuant, recovery or the fallback)."""
    done = [t for t in ctx.trials if t.step == "placement"]
    if len(shapes) < 2 or not done:
        return shapes
    projected = len(shapes) * statistics.median(t.work_s for t in done) + first.choice_seconds
    left = ctx.clock.budget_s - ctx.clock.spent()
    if projected <= left / 3:
        return shapes
    best = min(done, key=lambda t: (t.drop, -t.fidelity, done.index(t))).candidate
    log.info(
        "auto: the %s scheme is tried on %s only (all %d shapes would take ~%.0f of %.0f work seconds left)",
        scheme,
        best.label,
        len(shapes),
        projected,
        left,
    )
    return [(best.placement, best.coverage)]


def _chains_pay(ctx: SearchContext) -> bool:
    """Chain coverage is a candidate for ORT's CPU kernels when some chain op reads a weighted op's output.

    Not with TensorRT among the targets: chains quantize outputs, which TensorRT's placement never does.
    """
    targets = ctx.settings.setup.deploy.targets
    if "ort-cpu" not in targets or "tensorrt" in targets:
        return False
    weighted = set(ctx.settings.setup.quantization.op_types)
    produced = {out for n in ctx.fp32.graph.node if n.op_type in weighted for out in n.output}
    return any(n.op_type in CHAIN_OPS and set(n.input) & produced for n in ctx.fp32.graph.node)


def _dynamic_pays(ctx: SearchContext) -> bool:
    """Dynamic INT8 is a candidate for ORT CPU alone (``dynamic_allowed``) when the graph has MatMul, Gemm, LSTM
    or Attention nodes that ORT's dynamic mode quantizes."""
    from deploy_opt.stages.dynamic import dynamic_allowed, dynamic_nodes

    return (
        ctx.settings.setup.auto.dynamic
        and dynamic_allowed(ctx.settings.setup.deploy.targets)
        and bool(dynamic_nodes(ctx.fp32))
    )


def _dynamic_trial(ctx: SearchContext, fp32_path: Path, static: tuple[str, ...], work: Path) -> list[Base]:
    """ORT's dynamic INT8 (weights ahead of time, activations at run time) as one more candidate: where static
    INT8 loses too much, recurrent models and transformers often keep their accuracy with it."""
    from deploy_opt.stages.dynamic import quantize_dynamic
    from exporters.ort.dynamic import NothingToQuantize

    candidate = Candidate("dynamic", "asymmetric", None, static)
    samples = len(ctx.calibration.selection.indices)
    try:
        model = quantize_dynamic(ctx.settings.setup, fp32_path, work / "dynamic", static, samples)
    except NothingToQuantize as exc:  # e.g. every MatMul reads two activations (attention scores), none a weight
        log.info("auto dynamic: no candidate: %s", exc)
        return []
    nodes = int(model.info.quantized_nodes)
    ctx.measure("dynamic", candidate, onnx.load(str(model.path)), nodes=nodes)
    return [Base(candidate, fp32_path, model, None)]


def _has_smoothing_targets(model: onnx.ModelProto) -> bool:
    from calibrators.smoothquant import smoothing_targets

    return bool(smoothing_targets(model))


def _smoothquant_trial(
    ctx: SearchContext, fp32_path: Path, calibration: CalibrationSet, bases: list[Base], work: Path
) -> list[Base]:
    """``smoothquant_base`` again, on the SmoothQuant-ed model (written next to ``work``: it may ship)."""
    base = smoothquant_base(ctx, bases)
    candidate = dataclasses.replace(base.candidate, smoothing_alpha=ctx.settings.setup.auto.smoothquant_alpha)
    setup = configured(ctx.settings.setup, candidate)
    smoothed = smooth_model(
        setup.quantization, setup.export, setup.runtime, fp32_path, calibration, work.parent / ".smoothed.onnx"
    )
    source, smoothing = smoothed.path, smoothed.to_json()
    model = quantize(setup, source, calibration, work / "smoothquant", smoothing=smoothing)
    ctx.measure("smoothquant", candidate, onnx.load(str(model.path)))
    return [Base(candidate, source, model, smoothing)]


def smoothquant_base(ctx: SearchContext, bases: list[Base]) -> Base:
    """The most accurate base that pays (of all, when none does). SmoothQuant changes accuracy, not speed: on
    PP-OCRv4's recogniser the most accurate base (drop 0.05) ran at 0.45x FP32, and smoothing it spent 40 s of
    the budget on a model that could not ship."""
    return most_accurate(ctx.trials, paying(ctx, bases) or bases)


def _head_trials(ctx: SearchContext, bases: list[Base]) -> list[Base]:
    """Each placement again with the model's head in float (``head.py``): a detector's recipe, found by trial.

    Each head base is what the fallback may start from: its nodes stay float in every further variant. When
    timed, only bases that pay are tried: floating a few head nodes does not make a base slower than FP32 fast
    (on a YOLOv8n, four of six head trials were of bases at 0.45x-0.65x, 35 s of a 240 s budget).
    """
    heads: list[Base] = []
    for base in paying(ctx, bases):
        op_types = base.candidate.op_types(ctx.settings.setup.quantization.op_types)
        head = tuple(n for n in float_head(ctx.fp32, op_types) if n not in base.candidate.excluded)
        if not head or not ctx.time_left():
            continue
        candidate = dataclasses.replace(base.candidate, excluded=base.candidate.excluded + head)
        qdq, source = onnx.load(str(base.model.path)), onnx.load(str(base.source))
        ctx.measure("head", candidate, variant_model(ctx, base, candidate, qdq, source))
        heads.append(dataclasses.replace(base, candidate=candidate))
    return heads


def _unfinished(ctx: SearchContext, min_gain: float | None) -> str:
    """What the budget cut short: the fastest paying model that missed max_drop, and how to let the search on."""
    quick = [t for t in ctx.trials if t.quantized_nodes > 0 and t.speedup is not None and t.pays(min_gain)]
    if not quick:
        return ""
    fast = max(quick, key=lambda t: t.speedup or 0.0)
    return (
        f" (the fastest model measured, {fast.candidate.label} at {fast.speedup:.2f}x, missed max_drop with drop "
        f"{fast.drop:.3f}; auto.budget_s ran out, so raise it to let the search go on)"
    )


def _verdict(ctx: SearchContext, chosen: Trial | None) -> str:
    """The search's answer in one line, and what bounded it: the work budget, or the wall cap on a loaded machine
    (then the trials differ from an idle run's), and whether load may have moved the timings INT8 was judged on."""
    return _answer(ctx, chosen) + _bounds(ctx)


def _bounds(ctx: SearchContext) -> str:
    clock, parts = ctx.clock, []
    if clock.capped():
        parts.append(
            f"the wall-clock cap ({clock.wall_cap_s:.0f} s = auto.wall_cap x auto.budget_s) ended the search after "
            f"{clock.spent():.0f} of its {clock.budget_s:g} work seconds: the machine was loaded, so an idle run "
            "tries more candidates"
        )
    coarse = _coarse_decisions(ctx)
    if coarse:
        parts.append(coarse)
    untimed = _untimed_targets(ctx)
    if untimed:
        parts.append(untimed)
    share = clock.others_share()
    if ctx.probe is not None and share is not None and clock.loaded():
        parts.append(
            f"the machine was loaded (other processes used {share:.0%} of its CPUs during the search), so INT8 "
            "against FP32, timed on the wall clock, may go the other way on an idle machine"
        )
    return "".join(f" [{p}]" for p in parts)


def _untimed_targets(ctx: SearchContext) -> str:
    """What to say when a GPU profile's search could not time its candidates where they will run."""
    if ctx.probe is not None or ctx.settings.setup.auto.min_gain is None:
        return ""
    targets = ctx.settings.setup.deploy.targets
    if "ort-cpu" in targets:
        return ""
    return (
        f"candidates were not timed: the targets ({', '.join(targets)}) run on GPUs and the search times only ORT "
        "CPU, so it chose on accuracy alone; the TensorRT engine's timing, where built, is the build's speed"
    )


def _coarse_decisions(ctx: SearchContext) -> str:
    """What to say when one decide sample moves the metric by more than ``max_drop`` (64 decide samples move a
    top-1 in 1.56-point steps): the search then told candidates apart by output SQNR, and more samples would let
    it decide on the metric itself."""
    from deploy_opt.analysis.sensitivity.resolution import STEP_METRICS
    from deploy_opt.evaluation.uncertainty import resolution

    scores = np.asarray(ctx.baseline_scores)
    max_drop = ctx.settings.gate.max_drop
    step = resolution([scores], right_or_wrong=ctx.settings.setup.metric in STEP_METRICS) if scores.size else None
    if step is None or step <= max_drop or max_drop <= 0:
        return ""
    needed = math.ceil(scores.size * step / max_drop)
    return (
        f"the search decided on {scores.size} samples, where one sample moves the metric {step:.3g} points, more "
        f"than max_drop {max_drop:g}: candidates a step apart were told apart by output SQNR; name "
        f"data.validation with at least {needed} samples to decide on the metric itself"
    )


def _answer(ctx: SearchContext, chosen: Trial | None) -> str:
    max_drop, min_gain = ctx.settings.gate.max_drop, ctx.settings.setup.auto.min_gain
    timed = " within the time budget" if not ctx.time_left() else ""
    if chosen is not None:
        speed = f", {chosen.speedup:.2f}x FP32" if chosen.speedup is not None else ""
        spare = ""
        if chosen.drop_error and chosen.meets(max_drop):
            spare = f" + {chosen.drop_error:.3f} (one standard error)"
        elif chosen.drop_error:
            spare = f" (± {chosen.drop_error:.3f}: no candidate met it with a standard error to spare)"
        return (
            f"{chosen.candidate.label}: drop {chosen.drop:.3f}{spare} <= {max_drop:g}{speed} ({len(ctx.trials)} trials)"
        )
    accurate = [t for t in ctx.trials if t.meets(max_drop, spare=False) and t.quantized_nodes > 0]
    if accurate:
        confirm = [t for t in accurate if t.step == "confirm"]  # the winner timed again outranks its first timing
        fastest = confirm[-1] if confirm else max(accurate, key=lambda t: t.speedup or 0.0)
        short = f"under the {min_gain:g}x that INT8 must gain"
        if fastest.speedup_low is not None and fastest.speedup >= min_gain:
            short = f"but its 95% interval reaches down to {fastest.speedup_low:.3f}x: not surely faster than FP32"
        verdict = (
            f"FP32 is fastest here{timed}: the fastest INT8 model that meets max_drop ({fastest.candidate.label}) "
            f"runs at {fastest.speedup:.3f}x FP32, {short}; FP32 ships"
        )
        return verdict + _unfinished(ctx, min_gain) if timed else verdict
    quantized = [t for t in ctx.trials if t.quantized_nodes > 0] or ctx.trials
    closest = min(quantized, key=lambda t: t.drop)
    return (
        f"no INT8 model met max_drop {max_drop:g}{timed} (closest: {closest.candidate.label}, drop "
        f"{closest.drop:.3f}); FP32 ships"
    )
