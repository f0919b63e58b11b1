"""The auto search: quantize a few candidates, measure each on the evaluation set and on the target runtime, and
keep the fastest that meets the gate.

1. **Placement × scheme**: ``inputs`` (Q/DQ only into quantized nodes: residual- and LayerNorm-aware), ORT's
   ``outputs``, and ``outputs+chain`` (also the activations, pools and reshapes between weighted ops, so that ORT
   runs integer chains: ``candidates.CHAIN_OPS``; tried for ORT CPU when the graph has such a chain), for each
   activation scheme the targets accept. Ranges come from one calibration of every tensor any of them quantizes,
   re-chosen per scheme (``calibration.method: auto`` picks each tensor's range method by propagated output error).
2. **SmoothQuant** at ``auto.smoothquant_alpha``, when no candidate meets ``max_drop`` and the graph has
   LayerNorm-fed MatMuls.
3. **Head in float**: each placement again with the model's head (the last weighted nodes and the decode ops
   after them: ``head.py``) in FP32, when no candidate meets ``max_drop``: a detector's hand recipe, found by trial.
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
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.analysis.sensitivity.analyze import SubsetScorer, analyze, pick_subset
from deploy_opt.analysis.sensitivity.fallback import sensitivity_order
from deploy_opt.analysis.sensitivity.mixed_precision import fp32_references
from deploy_opt.analysis.sensitivity.variants import exclusion_variant
from deploy_opt.autotune.candidates import CHAIN_OPS, Candidate, allowed_placements, allowed_schemes, configured
from deploy_opt.autotune.head import float_head
from deploy_opt.autotune.intensity import intensity_groups, reduction_lengths
from deploy_opt.autotune.latency import LatencyProbe
from deploy_opt.autotune.trials import AutoSearch, Trial, best_trial, chosen_trial
from deploy_opt.build.benchmark import feed_of_size
from deploy_opt.build.calibrate import ActivationRanges, calibrate_activations, rescheme
from deploy_opt.build.calibration_set import CalibrationSet
from deploy_opt.build.quantize import QuantizedModel, quantize
from deploy_opt.build.smoothing import smooth_model
from deploy_opt.config.build import BuildConfig
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.evaluation.sources import Batch
from deploy_opt.evaluation.uncertainty import standard_error
from dopt_common.ort import create_session
from exporters.ort.graph import PLACEMENTS, quantized_nodes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """A fully quantized candidate (only the static fallback in FP32): what fallback and latency trials vary."""

    candidate: Candidate
    source: Path  # the FP32 model it quantizes (SmoothQuant-ed or not)
    model: QuantizedModel
    smoothing: dict[str, Any] | None


@dataclass(frozen=True)
class SearchOutcome:
    """The search record and the base the chosen candidate derives from (None when FP32 ships)."""

    search: AutoSearch
    base: Base | None


@dataclass
class _Context:
    """What every trial needs: the models, the scorer, the latency probe and the clock."""

    config: BuildConfig
    fp32_path: Path
    fp32: onnx.ModelProto
    scorer: SubsetScorer
    baseline: float
    baseline_scores: np.ndarray  # FP32's per-sample scores, which each trial's are paired with
    metric: Metric
    probe: LatencyProbe | None
    deadline: float
    trials: list[Trial]
    calibration: CalibrationSet
    work: Path  # the search's scratch folder: trials that must be written go there
    models: dict[Candidate, bytes] = dataclasses.field(default_factory=dict)  # each trial's serialized model
    bar: Any = None  # tqdm over the time budget: trials so far, the last one, and the time left at most
    calibration_s: float = 0.0  # the first calibration's wall time: what SmoothQuant's calibration costs again

    def time_left(self, extra: float = 0.0) -> bool:
        """Whether another trial fits: one like the last few, plus ``extra`` seconds of work before it (a ViT-S
        trial takes 45 s, so a search that started its last trial just before the deadline ran 52 s over its
        budget; choosing a ViT-S's ranges again for the symmetric scheme took 44 s more)."""
        recent = [t.seconds for t in self.trials[-3:]]
        expected = statistics.median(recent) if recent else 0.0
        return time.perf_counter() + expected + extra < self.deadline

    def measure(self, step: str, candidate: Candidate, model: onnx.ModelProto, predicted: float | None = None) -> Trial:
        started = time.perf_counter()
        data = model.SerializeToString()
        self.models[candidate] = data
        scores = self.scorer.sample_scores(data)
        value = float(np.mean(scores))
        latency, speedup = self.probe.speedup(data) if self.probe else (None, None)
        nodes = sum(n.op_type in self.config.quantization.op_types for n in quantized_nodes(model))
        trial = Trial(
            step,
            candidate,
            value,
            self.metric.drop(self.baseline, value),
            predicted,
            latency,
            speedup,
            nodes,
            time.perf_counter() - started,
            drop_error=standard_error(self.metric.drop(self.baseline_scores, scores)),
        )
        self.trials.append(trial)
        if self.bar is not None:
            self.bar.update(min(trial.seconds, self.bar.total - self.bar.n))
            self.bar.set_postfix_str(f"trial {len(self.trials)}: {step} {candidate.label} drop {trial.drop:.3f}")
        log.info(
            "auto %-11s %-24s drop %.3f ± %.3f%s",
            step,
            candidate.label,
            trial.drop,
            trial.drop_error,
            f", {speedup:.2f}x FP32" if speedup is not None else "",
        )
        return trial


def run_search(
    config: BuildConfig,
    fp32_path: Path,
    calibration: CalibrationSet,
    held: list[Batch],
    metric: Metric,
    static: tuple[str, ...],
    work: Path,
) -> SearchOutcome:
    """Search as the module docstring says; ``static`` nodes stay FP32 in every candidate."""
    started = time.perf_counter()
    ctx = _context(config, fp32_path, held, metric, started, calibration, work)
    from tqdm import tqdm

    if sys.stderr.isatty():  # no bar object at all otherwise: a signal landing in its __del__ would be swallowed
        ctx.bar = tqdm(
            total=round(config.auto.budget_s),
            desc="auto search (of its budget)",
            unit="s",
            leave=False,
            bar_format="{desc}: {n:.0f}/{total} s {bar} {postfix}",
        )
    bases = _placement_trials(ctx, fp32_path, calibration, static, work)
    max_drop = config.gate.max_drop
    # Search on while no candidate both meets max_drop and pays (when timed): an accurate candidate slower than
    # FP32 is no answer when a fast one with its head in float, or a few nodes back in FP32, would be.
    goal = config.auto.min_gain if ctx.probe is not None else None
    smoothquant = config.auto.smoothquant_alpha is not None and _has_smoothing_targets(ctx.fp32)
    # SmoothQuant calibrates the smoothed model again: on a ViT-S that started at 165 s of 240 and ended at 297 s
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left(ctx.calibration_s) and smoothquant:
        bases += _smoothquant_trial(ctx, fp32_path, calibration, bases, work)
    if best_trial(ctx.trials, max_drop, goal) is None and ctx.time_left():
        bases += _head_trials(ctx, bases)
    if best_trial(ctx.trials, max_drop, goal) is None:
        for base in _fallback_bases(ctx, bases):
            if ctx.time_left():
                _fallback_trials(ctx, base, held)
    accurate = chosen_trial(ctx.trials, max_drop, None)
    if accurate is not None and ctx.probe is not None and ctx.time_left():
        _latency_trials(ctx, accurate, _base_of(accurate, bases))
    chosen = _confirmed(ctx, chosen_trial(ctx.trials, max_drop, config.auto.min_gain))
    verdict = _verdict(ctx, chosen)
    if ctx.bar is not None:
        ctx.bar.close()
        ctx.bar = None  # gone before the verdict is logged
    log.info("auto: %s", verdict)
    search = AutoSearch(
        chosen.candidate if chosen else None,
        tuple(ctx.trials),
        verdict,
        time.perf_counter() - started,
        len(next(iter(ctx.probe.feed.values()))) if ctx.probe else None,
    )
    return SearchOutcome(search, _base_of(chosen, bases) if chosen else None)


def _confirmed(ctx: _Context, chosen: Trial | None) -> Trial | None:
    """Time the winner again, three times as long: the fastest of several noisy timings is biased upwards."""
    if chosen is None or ctx.probe is None:
        return chosen
    latency, speedup = ctx.probe.speedup(ctx.models[chosen.candidate], scale=3.0)
    again = dataclasses.replace(chosen, step="confirm", latency_ms=latency, speedup=speedup, seconds=0.0)
    ctx.trials.append(again)
    log.info("auto confirm     %-24s %.2fx FP32", chosen.candidate.label, speedup)
    return again if again.pays(ctx.config.auto.min_gain) else None


def _context(
    config: BuildConfig,
    fp32_path: Path,
    held: list[Batch],
    metric: Metric,
    started: float,
    calibration: CalibrationSet,
    work: Path,
) -> _Context:
    threads = config.benchmark.threads
    fp32 = onnx.load(str(fp32_path))
    session = create_session(fp32_path, threads=threads)
    references = [session.run(None, b.inputs)[0] for b in held]
    scorer = SubsetScorer(held, references, metric, threads)
    timed = config.auto.min_gain is not None and "ort-cpu" in config.deploy.targets and config.benchmark.enabled
    batch = config.gate.speedup_batch or max(config.benchmark.batch_sizes)
    probe = LatencyProbe(session, feed_of_size(held[0], batch), threads) if timed else None
    deadline = started + config.auto.budget_s
    baseline = scorer.sample_scores(fp32)
    return _Context(
        config,
        fp32_path,
        fp32,
        scorer,
        float(np.mean(baseline)),
        baseline,
        metric,
        probe,
        deadline,
        [],
        calibration,
        work,
    )


def _placement_trials(
    ctx: _Context, fp32_path: Path, calibration: CalibrationSet, static: tuple[str, ...], work: Path
) -> list[Base]:
    config, bases = ctx.config, []
    placements = allowed_placements(config.deploy.targets, PLACEMENTS)
    shapes = [(p, "weighted") for p in placements] + ([("outputs", "chain")] if _chains_pay(ctx) else [])
    widest = configured(config, Candidate("outputs", config.quantization.activations, None, static, shapes[-1][1]))
    first: ActivationRanges | None = None  # one calibration pass (of every tensor any shape quantizes)
    for scheme in allowed_schemes(config.deploy.targets, config.quantization.activations):
        ranges: ActivationRanges | None = None  # each further scheme only re-chooses the ranges
        for placement, coverage in shapes:
            again = first.choice_seconds if ranges is None and first is not None else 0.0
            if bases and not ctx.time_left(again):
                return bases
            candidate = Candidate(placement, scheme, None, static, coverage)
            setup = configured(config, candidate)
            if ranges is None and first is not None:
                ranges = rescheme(first, setup, fp32_path, calibration)
            if ranges is None:
                calibrating = time.perf_counter()
                ranges = calibrate_activations(widest, fp32_path, calibration)
                ctx.calibration_s = time.perf_counter() - calibrating
            first = first or ranges
            folder = work / f"{placement}-{coverage}-{scheme}"
            model = quantize(setup, fp32_path, calibration, folder, ranges=ranges)
            ctx.measure("placement", candidate, onnx.load(str(model.path)))
            bases.append(Base(candidate, fp32_path, model, None))
    return bases


def _chains_pay(ctx: _Context) -> bool:
    """Chain coverage is a candidate for ORT's CPU kernels when some chain op reads a weighted op's output.

    Not with TensorRT among the targets: chains quantize outputs, which TensorRT's placement never does.
    """
    targets = ctx.config.deploy.targets
    if "ort-cpu" not in targets or "tensorrt" in targets:
        return False
    weighted = set(ctx.config.quantization.op_types)
    produced = {out for n in ctx.fp32.graph.node if n.op_type in weighted for out in n.output}
    return any(n.op_type in CHAIN_OPS and set(n.input) & produced for n in ctx.fp32.graph.node)


def _has_smoothing_targets(model: onnx.ModelProto) -> bool:
    from calibrators.smoothquant import smoothing_targets

    return bool(smoothing_targets(model))


def _smoothquant_trial(
    ctx: _Context, fp32_path: Path, calibration: CalibrationSet, bases: list[Base], work: Path
) -> list[Base]:
    """``smoothquant_base`` again, on the SmoothQuant-ed model (written next to ``work``: it may ship)."""
    base = smoothquant_base(ctx, bases)
    candidate = dataclasses.replace(base.candidate, smoothing_alpha=ctx.config.auto.smoothquant_alpha)
    setup = configured(ctx.config, candidate)
    source, smoothing = smooth_model(setup, fp32_path, calibration, work.parent / ".smoothed.onnx")
    model = quantize(setup, source, calibration, work / "smoothquant", smoothing=smoothing)
    ctx.measure("smoothquant", candidate, onnx.load(str(model.path)))
    return [Base(candidate, source, model, smoothing)]


def smoothquant_base(ctx: _Context, bases: list[Base]) -> Base:
    """The most accurate base that pays (of all, when none does). SmoothQuant changes accuracy, not speed: on
    PP-OCRv4's recogniser the most accurate base (drop 0.05) ran at 0.45x FP32, and smoothing it spent 40 s of
    the budget on a model that could not ship."""
    return _most_accurate(ctx.trials, _paying(ctx, bases) or bases)


def _paying(ctx: _Context, bases: list[Base]) -> list[Base]:
    """The bases faster than FP32 by ``auto.min_gain`` (all of them when the search is not timed)."""
    measured = {t.candidate: t for t in ctx.trials}
    return [b for b in bases if ctx.probe is None or measured[b.candidate].pays(ctx.config.auto.min_gain)]


def _most_accurate(trials: list[Trial], bases: list[Base]) -> Base:
    """The base SmoothQuant and the fallback start from: the smallest drop, near-ties going to "inputs".

    In the inputs placement a node kept float really reads a float input, and SmoothQuant's Mul sits before the
    quantized tensor; "outputs" keeps quantizing a quantized producer's output whatever reads it, so neither
    step can remove that error there. Drops within 0.01 points (or 1 %) of the best count as tied: which of two
    such bases measures better depends on the CPU's int8 kernels (7- or 8-bit weights), not on the model.
    """
    measured = {t.candidate: t for t in trials}
    best = min(measured[b.candidate].drop for b in bases)
    near = [b for b in bases if measured[b.candidate].drop <= best + max(0.01, 0.01 * abs(best))]
    return min(
        near,
        key=lambda b: (
            b.candidate.placement != "inputs",
            measured[b.candidate].drop,
            -(measured[b.candidate].speedup or 0.0),
        ),
    )


def _head_trials(ctx: _Context, bases: list[Base]) -> list[Base]:
    """Each placement again with the model's head in float (``head.py``): a detector's recipe, found by trial.

    Each head base is what the fallback may start from: its nodes stay float in every further variant. When
    timed, only bases that pay are tried: floating a few head nodes does not make a base slower than FP32 fast
    (on a YOLOv8n, four of six head trials were of bases at 0.45x-0.65x, 35 s of a 240 s budget).
    """
    heads: list[Base] = []
    for base in _paying(ctx, bases):
        op_types = base.candidate.op_types(ctx.config.quantization.op_types)
        head = tuple(n for n in float_head(ctx.fp32, op_types) if n not in base.candidate.excluded)
        if not head or not ctx.time_left():
            continue
        candidate = dataclasses.replace(base.candidate, excluded=base.candidate.excluded + head)
        qdq, source = onnx.load(str(base.model.path)), onnx.load(str(base.source))
        ctx.measure("head", candidate, _variant(ctx, base, candidate, qdq, source))
        heads.append(dataclasses.replace(base, candidate=candidate))
    return heads


def _fallback_bases(ctx: _Context, bases: list[Base]) -> list[Base]:
    """The bases the fallback starts from, in turn while time is left: the most accurate base that pays, then
    the fastest of the paying bases about as accurate (within a quarter of its drop, or a tenth of ``max_drop``).

    Every float node the fallback adds costs speed, so a base already slower than FP32 cannot end faster (ORT
    CPU's "inputs" placement of a CNN runs float convs between Q/DQ pairs). Which of the two ends faster is not
    known before: on a YOLOv8n the faster chained base (1.45x, drop 9.9) needed 159 float nodes, the more
    accurate plain one 17. So both are searched, and the fastest trial that meets ``max_drop`` wins. Untimed,
    or when no base pays, the most accurate of all.
    """
    measured = {t.candidate: t for t in ctx.trials}
    paying = _paying(ctx, bases) if ctx.probe is not None else []
    if not paying:
        return [_most_accurate(ctx.trials, bases)]
    accurate = _most_accurate(ctx.trials, paying)
    best = measured[accurate.candidate].drop
    band = best + max(0.25 * abs(best), 0.1 * ctx.config.gate.max_drop)
    near = [b for b in paying if measured[b.candidate].drop <= band]
    fastest = max(near, key=lambda b: measured[b.candidate].speedup or 0.0)
    return [accurate] if fastest is accurate else [accurate, fastest]


def _base_of(trial: Trial, bases: list[Base]) -> Base:
    settings = dataclasses.replace(trial.candidate, excluded=())
    return next(b for b in bases if dataclasses.replace(b.candidate, excluded=()) == settings)


def _fallback_trials(ctx: _Context, base: Base, held: list[Batch]) -> None:
    """Fewest FP32 nodes, in the proxy's order, that meet max_drop: doubling prefixes, then bisection."""
    config = ctx.config
    qdq = onnx.load(str(base.model.path))
    subset = pick_subset(held, config.sensitivity.subset, config.seed)
    threads = config.benchmark.threads
    scorer = SubsetScorer(subset, fp32_references(ctx.fp32_path, subset, threads), ctx.metric, threads)
    op_types = base.candidate.op_types(config.quantization.op_types)
    record = analyze(base.source, base.model.path, scorer, op_types, "proxy", 1)
    order = [group[0] for group in sensitivity_order(record, "node") if group[0] not in base.candidate.excluded]
    predicted = {n["name"]: n["proxy"].get("predicted_drop") for n in record["nodes"]}
    source = onnx.load(str(base.source))  # its initializers restore the float weights (SmoothQuant-ed or not)

    def attempt(count: int) -> Trial:
        excluded = base.candidate.excluded + tuple(order[:count])
        rest = [predicted[n] for n in order[count:]]
        guess = sum(rest) if rest and all(p is not None for p in rest) else None
        candidate = dataclasses.replace(base.candidate, excluded=excluded)
        variant = _variant(ctx, base, candidate, qdq, source)
        return ctx.measure("fallback", candidate, variant, guess)

    low, high, count = 0, None, 1
    while order and ctx.time_left():
        if attempt(count).meets(config.gate.max_drop):
            high = count
            break
        if count == len(order):
            break
        low, count = count, min(count * 2, len(order))
    while high is not None and high - low > 1 and ctx.time_left():
        middle = (low + high) // 2
        low, high = (low, middle) if attempt(middle).meets(config.gate.max_drop) else (middle, high)


def _latency_trials(ctx: _Context, accurate: Trial, base: Base) -> None:
    """Keep low-intensity nodes in FP32 where INT8 there costs more in Q/DQ than it saves."""
    qdq = onnx.load(str(base.model.path))
    source = onnx.load(str(base.source))
    lengths = reduction_lengths(source, ctx.config.quantization.op_types)
    live = {n: k for n, k in lengths.items() if n not in accurate.candidate.excluded}
    for _, group in intensity_groups(live):
        if not ctx.time_left():
            return
        candidate = dataclasses.replace(accurate.candidate, excluded=accurate.candidate.excluded + group)
        ctx.measure("latency", candidate, _variant(ctx, base, candidate, qdq, source))


def _variant(
    ctx: _Context, base: Base, candidate: Candidate, qdq: onnx.ModelProto, source: onnx.ModelProto
) -> onnx.ModelProto:
    """``base`` with ``candidate.excluded`` in FP32: derived from its Q/DQ model, or written again for chains.

    Chain coverage lets ORT's writer remove a Relu or Clip and do its clip in the producer's Q/DQ pair; excluding
    that producer would take the clip away with the pair, so those variants are written by the writer itself.
    """
    op_types = candidate.op_types(ctx.config.quantization.op_types)
    if candidate.coverage != "chain":
        return exclusion_variant(qdq, source, op_types, candidate.excluded, candidate.placement)
    folder = ctx.work / f"variant-{len(ctx.trials)}"
    written = quantize(
        configured(ctx.config, candidate),
        base.source,
        ctx.calibration,
        folder,
        ranges=base.model.ranges,
        smoothing=base.smoothing,
    )
    return onnx.load(str(written.path))


def _unfinished(ctx: _Context, min_gain: float | None) -> str:
    """What the budget cut short: the fastest paying model that missed max_drop, and how to let the search on."""
    paying = [t for t in ctx.trials if t.quantized_nodes > 0 and t.speedup is not None and t.pays(min_gain)]
    if not paying:
        return ""
    fast = max(paying, key=lambda t: t.speedup or 0.0)
    return (
        f" ({fast.candidate.label} ran at {fast.speedup:.2f}x with drop {fast.drop:.3f} when auto.budget_s ran out "
        f"before the fallback could bring it within max_drop; raise auto.budget_s to search on)"
    )


def _verdict(ctx: _Context, chosen: Trial | None) -> str:
    max_drop, min_gain = ctx.config.gate.max_drop, ctx.config.auto.min_gain
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
        verdict = (
            f"FP32 is fastest here{timed}: the fastest INT8 model that meets max_drop ({fastest.candidate.label}) "
            f"runs at {fastest.speedup:.3f}x FP32, under the {min_gain:g}x that INT8 must gain; FP32 ships"
        )
        return verdict + _unfinished(ctx, min_gain) if timed else verdict
    quantized = [t for t in ctx.trials if t.quantized_nodes > 0] or ctx.trials
    closest = min(quantized, key=lambda t: t.drop)
    return (
        f"no INT8 model met max_drop {max_drop:g}{timed} (closest: {closest.candidate.label}, drop "
        f"{closest.drop:.3f}); FP32 ships"
    )
