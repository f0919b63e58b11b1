"""Stage: activation ranges from streaming passes over the chosen calibration samples.

minmax, entropy and mse need one inference pass: min/max plus an |x| histogram whose range grows by exact
doubling (``calibrators.activations.streaming``).
percentile needs two: min/max, then histograms over those fixed bounds,
which equal the one-shot histogram ONNX Runtime's calibrators build from all activations at once, so its
ranges match ORT's exactly. Either way memory is bins × tensors, whatever the sample count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from calibrators.activations.collect import collect, select_tensors
from calibrators.activations.guards import guard_reason
from calibrators.activations.histogram import Histogram, HistogramObserver
from calibrators.activations.minmax import MinMaxObserver
from calibrators.activations.ranges import histogram_kind, range_for
from calibrators.activations.streaming import StreamingObserver
from deploy_opt.build.calibration_set import CalibrationSet
from deploy_opt.config.build import BuildConfig
from deploy_opt.report.calibration_plot import widest

log = logging.getLogger(__name__)
PLOTTED = 8


@dataclass(frozen=True)
class ActivationRanges:
    """Per tensor: the observed and the chosen range, the method that chose it, and its histograms."""

    observed: dict[str, tuple[float, float]]
    chosen: dict[str, tuple[float, float]]
    methods: dict[str, str]
    signed: dict[str, Histogram]
    absolute: dict[str, Histogram]
    samples: int
    plotted: list[str]
    guards: dict[str, str] = field(default_factory=dict)  # tensor -> why a clipping method gave way to min/max


def calibrate_activations(config: BuildConfig, fp32_path: Path, calibration: CalibrationSet) -> ActivationRanges:
    """Observe every quantizable activation and choose its range with its configured method."""
    from tqdm import tqdm

    cal = config.calibration
    graph_model = onnx.load(str(fp32_path), load_external_data=False)
    names = select_tensors(graph_model, config.quantization.op_types)
    if not names:  # no node of quantization.op_types: nothing to calibrate (the gate reports an FP32 model)
        log.warning("calibration: no tensor feeds a node of op_types %s", list(config.quantization.op_types))
        return ActivationRanges({}, {}, {}, {}, {}, len(calibration.selection.indices), [])

    def feeds(label: str):  # noqa: ANN202 - a generator of feed dicts
        bar = tqdm(calibration.batches, desc=label, unit="batch", leave=False, disable=None)
        return (b.inputs for b in bar)

    symmetric = config.quantization.activations == "symmetric"
    methods = {name: cal.method_for(name) for name in names}
    threads = config.benchmark.threads
    if "percentile" in methods.values():
        # Percentile reproduces ORT's exact histogram edges, which need the global bounds first: two passes.
        magnitude = {n for n in names if symmetric and methods[n] == "percentile"}
        minmax = MinMaxObserver(magnitude)
        samples = collect(fp32_path, feeds("calibrate: ranges"), names, minmax, threads=threads)
        observed = minmax.ranges()
        plotted = widest(observed, PLOTTED)
        kinds = {name: kind for name in observed if (kind := histogram_kind(methods[name], symmetric))}
        for name in plotted:
            kinds[name] = "both" if kinds.get(name) == "signed" else "abs"
        histograms = HistogramObserver(observed, kinds, cal.bins, abs_floors=minmax.magnitude_floors())
        collect(fp32_path, feeds("calibrate: histograms"), list(kinds), histograms, threads=threads)
        signed, absolute = histograms.signed_histograms(), histograms.abs_histograms()
    else:
        # minmax, entropy and mse: ranges and growing |x| histograms in one inference pass.
        streaming = StreamingObserver(set(names), cal.bins)
        samples = collect(fp32_path, feeds("calibrate"), names, streaming, threads=threads)
        observed, signed, absolute = streaming.ranges(), {}, streaming.abs_histograms()
        plotted = widest(observed, PLOTTED)
    methods = {name: methods[name] for name in observed}
    chosen: dict[str, tuple[float, float]] = {}
    guards: dict[str, str] = {}
    inputs = {i.name for i in graph_model.graph.input}
    for name, (low, high) in observed.items():
        kind = histogram_kind(methods[name], symmetric)
        hist = signed.get(name) if kind == "signed" else absolute.get(name)
        chosen[name] = range_for(methods[name], low, high, hist, cal.percentile, symmetric)
        reason = guard_reason(methods[name], name in inputs, hist, chosen[name]) if cal.guards else None
        if reason is not None:
            log.warning("calibration guard: tensor '%s': %s", name, reason)
            guards[name], methods[name] = reason, "minmax"
            chosen[name] = range_for("minmax", low, high, hist, cal.percentile, symmetric)
    log.info("calibration: %d tensors over %d samples (%s)", len(chosen), samples, cal.method)
    return ActivationRanges(observed, chosen, methods, signed, absolute, samples, plotted, guards)
