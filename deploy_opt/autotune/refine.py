"""The auto search's refinements of a base: the fallback (fewest FP32 nodes that meet ``max_drop``, in the proxy's
order) and the latency trials (low-intensity nodes back to FP32 where that is faster)."""

from __future__ import annotations

import dataclasses

import onnx

from deploy_opt.analysis.sensitivity.analyze import SubsetScorer, analyze, pick_subset
from deploy_opt.analysis.sensitivity.fallback import sensitivity_order
from deploy_opt.analysis.sensitivity.mixed_precision import fp32_references
from deploy_opt.autotune.context import Base, SearchContext, most_accurate, paying, variant_model
from deploy_opt.autotune.intensity import intensity_groups, reduction_lengths
from deploy_opt.autotune.islands import Islands
from deploy_opt.autotune.trials import Trial, fastest
from deploy_opt.data.sources import Batch


def fallback_bases(ctx: SearchContext, bases: list[Base]) -> list[Base]:
    """The bases the fallback starts from, in turn while time is left: the most accurate base that pays, then
    the fastest of the paying bases about as accurate (within a quarter of its drop, or a tenth of ``max_drop``).

    Every float node the fallback adds costs speed, so a base already slower than FP32 cannot end faster (ORT
    CPU's "inputs" placement of a CNN runs float convs between Q/DQ pairs). Which of the two ends faster is not
    known before: on a YOLOv8n the faster chained base (1.45x, drop 9.9) needed 159 float nodes, the more
    accurate plain one 17. So both are searched, and the fastest trial that meets ``max_drop`` wins. Untimed,
    or when no base pays, the most accurate of all.
    """
    measured = {t.candidate: t for t in ctx.trials}
    fast_enough = paying(ctx, bases) if ctx.probe is not None else []
    if not fast_enough:
        return [most_accurate(ctx.trials, bases)]
    accurate = most_accurate(ctx.trials, fast_enough)
    best = measured[accurate.candidate].drop
    band = best + max(0.25 * abs(best), 0.1 * ctx.settings.gate.max_drop)
    near = [b for b in fast_enough if measured[b.candidate].drop <= band]
    quickest = fastest([measured[b.candidate] for b in near]).candidate
    other = next(b for b in near if b.candidate == quickest)
    return [accurate] if quickest == accurate.candidate else [accurate, other]


def fallback_trials(ctx: SearchContext, base: Base, held: list[Batch]) -> None:
    """Fewest FP32 nodes, in the proxy's order, that meet max_drop: doubling prefixes, then bisection.

    Each prefix also keeps in float the INT8 islands it leaves whose conversions cost more than INT8 saves
    there (``islands.Islands``), so the float nodes form contiguous regions rather than alternating with INT8.
    """
    settings, setup = ctx.settings, ctx.settings.setup
    qdq = onnx.load(str(base.model.path))
    subset = pick_subset(held, settings.sensitivity.subset, settings.seed)
    threads = setup.runtime.threads
    scorer = SubsetScorer(subset, fp32_references(ctx.fp32_path, subset, threads), ctx.metric, threads)
    op_types = base.candidate.op_types(setup.quantization.op_types)
    record = analyze(base.source, base.model.path, scorer, op_types, "proxy", 1)
    order = [group[0] for group in sensitivity_order(record, "node") if group[0] not in base.candidate.excluded]
    predicted = {n.name: n.proxy.get("predicted_drop") for n in record.nodes}
    source = onnx.load(str(base.source))  # its initializers restore the float weights (SmoothQuant-ed or not)
    islands = Islands(source, op_types) if ctx.probe is not None else None  # untimed: speed is no aim

    ahead: dict[int, tuple[onnx.ModelProto, object]] = {}  # count → (variant, its scores), evaluated in advance

    def candidate_of(count: int):
        floating = base.candidate.excluded + tuple(order[:count])
        filled = islands.fill(floating) if islands is not None else ()
        return dataclasses.replace(base.candidate, excluded=floating + filled)

    def attempt(count: int) -> Trial:
        rest = [predicted[n] for n in order[count:]]
        guess = sum(rest) if rest and all(p is not None for p in rest) else None
        candidate = candidate_of(count)
        variant, scores = ahead.pop(count, (None, None))
        variant = variant if variant is not None else variant_model(ctx, base, candidate, qdq, source)
        return ctx.measure("fallback", candidate, variant, guess, scores)

    def look_ahead(count: int) -> None:
        """With several workers, score the next doublings at once; the walk below then takes them in turn."""
        steps = [count]
        while len(steps) < ctx.parallel and steps[-1] < len(order):
            steps.append(min(steps[-1] * 2, len(order)))
        if len(steps) < 2 or count in ahead:
            return
        variants = [variant_model(ctx, base, candidate_of(c), qdq, source) for c in steps]
        scores = ctx.scores_of([v.SerializeToString() for v in variants])
        ahead.update({c: (v, s) for c, v, s in zip(steps, variants, scores, strict=True)})

    low, high, count = 0, None, 1
    while order and ctx.time_left():
        look_ahead(count)
        if attempt(count).meets(settings.gate.max_drop):
            high = count
            break
        if count == len(order):
            break
        low, count = count, min(count * 2, len(order))
    while high is not None and high - low > 1 and ctx.time_left():
        middle = (low + high) // 2
        low, high = (low, middle) if attempt(middle).meets(settings.gate.max_drop) else (middle, high)


def latency_trials(ctx: SearchContext, accurate: Trial, base: Base) -> None:
    """Keep low-intensity nodes in FP32 where INT8 there costs more in Q/DQ than it saves."""
    qdq = onnx.load(str(base.model.path))
    source = onnx.load(str(base.source))
    lengths = reduction_lengths(source, ctx.settings.setup.quantization.op_types)
    live = {n: k for n, k in lengths.items() if n not in accurate.candidate.excluded}
    for _, group in intensity_groups(live):
        if not ctx.time_left():
            return
        candidate = dataclasses.replace(accurate.candidate, excluded=accurate.candidate.excluded + group)
        ctx.measure("latency", candidate, variant_model(ctx, base, candidate, qdq, source))
