"""Stage: activation ranges from streaming passes over the chosen calibration samples.

minmax, entropy and mse need one inference pass: min/max plus an |x| histogram whose range grows by exact
doubling (``calibrators.activations.streaming``).
percentile needs two: min/max, then histograms over those fixed bounds,
which equal the one-shot histogram ONNX Runtime's calibrators build from all activations at once, so its
ranges match ORT's exactly. Either way memory is bins × tensors, whatever the sample count.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from calibrators.activations.collect import collect, select_tensors
from calibrators.activations.guards import guard_reason
from calibrators.activations.histogram import Histogram, HistogramObserver
from calibrators.activations.minmax import MinMaxObserver
from calibrators.activations.ranges import histogram_kind, range_for
from calibrators.activations.streaming import StreamingObserver
from deploy_opt.analysis.sensitivity.range_noise import pick_methods, propagated_range_noise
from deploy_opt.config.setup import QuantSetup
from deploy_opt.data.sources import single_rows
from deploy_opt.evaluation.numerics import json_db, noise_db
from deploy_opt.report.calibration_plot import widest
from deploy_opt.stages.calibration_set import CalibrationSet
from dopt_common.clock import work_seconds

log = logging.getLogger(__name__)
PLOTTED = 8
AUTO_METHODS = ("minmax", "entropy", "mse")
AUTO_SAMPLES = 16  # calibration samples that the propagated-error estimate of ``method: auto`` runs at most
# ... within this share of ``auto.budget_s``, counted as tapped activation values at AUTO_VALUES_PER_S (one PicoDet
# sample at 800x608, about 150 M values over its 525 tensors, took 18 s here): a count, not a time, so that the
# ranges do not depend on the machine's load; the range choice must leave the search its trials
AUTO_SHARE = 0.15
AUTO_VALUES_PER_S = 8e6
SCHEMES = ("asymmetric", "symmetric")
# method auto's propagated noise: activation scheme -> tensor -> method -> relative output noise power
SchemeNoise = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True, kw_only=True)
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
    # method: auto, per tensor: each candidate method's propagated output SQNR in dB (the evidence for the choice)
    evidence: dict[str, dict[str, float]] = field(default_factory=dict)
    # choose_ranges' work seconds (dopt_common.clock) without method auto's propagated-noise pass (which measured
    # both schemes): what choosing again for another scheme costs (rescheme), which the auto search counts first
    choice_seconds: float = 0.0
    # method auto: the noise of every candidate range under both schemes, measured in the one pass, so that
    # rescheme chooses for the other scheme without running the model again
    noise: SchemeNoise = field(default_factory=dict)

    @classmethod
    def empty(cls, samples: int) -> ActivationRanges:
        """No tensor calibrated (every node stays in float), over ``samples`` calibration samples."""
        return cls(observed={}, chosen={}, methods={}, signed={}, absolute={}, samples=samples, plotted=[])


@dataclass(frozen=True)
class Statistics:
    """What the calibration passes observed: per tensor its min/max and histograms."""

    observed: dict[str, tuple[float, float]]
    signed: dict[str, Histogram]
    absolute: dict[str, Histogram]
    samples: int
    plotted: list[str]
    noise: SchemeNoise = field(default_factory=dict)  # method auto's, when an earlier choice measured it


def calibrate_activations(setup: QuantSetup, fp32_path: Path, calibration: CalibrationSet) -> ActivationRanges:
    """Observe every quantizable activation and choose its range with its configured method."""
    graph_model = onnx.load(str(fp32_path), load_external_data=False)
    names = select_tensors(graph_model, setup.quantization.op_types)
    if not names:  # no node of quantization.op_types: nothing to calibrate (the gate reports an FP32 model)
        log.warning("calibration: no tensor feeds a node of op_types %s", list(setup.quantization.op_types))
        return ActivationRanges.empty(len(calibration.selection.indices))
    stats = _observe(setup, fp32_path, calibration, names)
    return choose_ranges(setup, fp32_path, calibration, stats)


def rescheme(
    ranges: ActivationRanges, setup: QuantSetup, fp32_path: Path, calibration: CalibrationSet
) -> ActivationRanges | None:
    """The same statistics with ranges chosen for ``setup``'s activation scheme, without another pass.

    None when a tensor takes percentile, whose histogram itself depends on the scheme.
    """
    if any(setup.calibration.method_for(n) == "percentile" for n in ranges.observed):
        return None
    stats = Statistics(ranges.observed, ranges.signed, ranges.absolute, ranges.samples, ranges.plotted, ranges.noise)
    return choose_ranges(setup, fp32_path, calibration, stats)


def _observe(setup: QuantSetup, fp32_path: Path, calibration: CalibrationSet, names: list[str]) -> Statistics:
    """One streaming pass (minmax, entropy, mse, auto), or two for percentile."""
    from tqdm import tqdm

    cal = setup.calibration

    def feeds(label: str):  # noqa: ANN202 - a generator of feed dicts
        bar = tqdm(calibration.batches, desc=label, unit="batch", leave=False, disable=None)
        return (b.inputs for b in bar)

    symmetric = setup.quantization.activations == "symmetric"
    methods = {name: _basis(cal.method_for(name)) for name in names}
    threads = setup.runtime.threads
    if "percentile" not in methods.values():
        # minmax, entropy and mse: ranges and growing |x| histograms in one inference pass.
        streaming = StreamingObserver(set(names), cal.bins)
        samples = collect(fp32_path, feeds("calibrate"), names, streaming, threads=threads)
        observed = streaming.ranges()
        return Statistics(observed, {}, streaming.abs_histograms(), samples, widest(observed, PLOTTED))
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
    return Statistics(observed, histograms.signed_histograms(), histograms.abs_histograms(), samples, plotted)


def _basis(method: str) -> str:
    """The method whose statistics a tensor needs: ``auto`` chooses among min/max, entropy and mse (|x|)."""
    return "mse" if method == "auto" else method


def choose_ranges(
    setup: QuantSetup, fp32_path: Path, calibration: CalibrationSet, stats: Statistics
) -> ActivationRanges:
    """Each tensor's range by its method (``auto``: by propagated output error), then the guards."""
    started = work_seconds(setup.runtime.threads)
    cal = setup.calibration
    symmetric = setup.quantization.activations == "symmetric"
    observed, signed, absolute = stats.observed, stats.signed, stats.absolute
    wanted = {name: cal.method_for(name) for name in observed}
    methods = {name: _basis(m) for name, m in wanted.items()}
    inputs = {i.name for i in onnx.load(str(fp32_path), load_external_data=False).graph.input}
    auto = [n for n in observed if wanted[n] == "auto" and n not in inputs]
    noise, measuring = (stats.noise if scheme_key(setup) in stats.noise else {}), 0.0
    if auto and not noise:
        measuring = work_seconds(setup.runtime.threads)
        noise = scheme_noise(fp32_path, auto, observed, absolute, setup, calibration)
        measuring = (
            work_seconds(setup.runtime.threads) - measuring
        )  # not repeated by rescheme, so not in choice_seconds
    choice = choose_methods(noise.get(scheme_key(setup), {}), auto)
    picked, evidence = choice.methods, choice.evidence
    methods.update({n: "minmax" for n in observed if wanted[n] == "auto" and n in inputs})
    methods.update(picked)
    chosen: dict[str, tuple[float, float]] = {}
    guards: dict[str, str] = {}
    for name, (low, high) in observed.items():
        kind = histogram_kind(methods[name], symmetric)
        hist = signed.get(name) if kind == "signed" else absolute.get(name)
        chosen[name] = range_for(methods[name], low, high, hist, cal.percentile, symmetric)
        guarded = cal.guards and name not in evidence  # auto's choice stands on its measured output error
        reason = guard_reason(methods[name], name in inputs, hist, chosen[name]) if guarded else None
        if reason is not None:
            log.warning("calibration guard: tensor '%s': %s", name, reason)
            guards[name], methods[name] = reason, "minmax"
            chosen[name] = range_for("minmax", low, high, hist, cal.percentile, symmetric)
    log.info("calibration: %d tensors over %d samples (%s)", len(chosen), stats.samples, cal.method)
    return ActivationRanges(
        observed=observed,
        chosen=chosen,
        methods=methods,
        signed=signed,
        absolute=absolute,
        samples=stats.samples,
        plotted=stats.plotted,
        guards=guards,
        evidence=evidence,
        choice_seconds=work_seconds(setup.runtime.threads) - started - measuring,
        noise=noise,
    )


def scheme_key(setup: QuantSetup) -> str:
    """The activation scheme ``setup`` quantizes with: the key of its noise in ``SchemeNoise``."""
    return "symmetric" if setup.quantization.activations == "symmetric" else "asymmetric"


def scheme_noise(
    fp32_path: Path,
    names: list[str],
    observed: dict[str, tuple[float, float]],
    absolute: dict[str, Histogram],
    setup: QuantSetup,
    calibration: CalibrationSet,
) -> SchemeNoise:
    """``calibration.method: auto``'s evidence: per scheme, tensor and candidate method, the propagated output
    noise of that range. Both schemes in one pass: the forward and the backward probes are the same, only each
    candidate's quantization noise differs. Each scheme's is empty when the torch evaluator cannot run the graph.
    """
    candidates = {
        name: {
            (scheme, m): range_for(m, *observed[name], absolute.get(name), symmetric=scheme == "symmetric")
            for scheme in SCHEMES
            for m in AUTO_METHODS
        }
        for name in names
    }
    # The first samples, one at a time: each is an independent draw for the estimator.
    feeds = list(itertools.islice(single_rows(calibration.batches), AUTO_SAMPLES))
    model = onnx.load(str(fp32_path))  # with its weights: the evaluator runs the graph
    started = time.perf_counter()
    values = AUTO_SHARE * setup.auto.budget_s * AUTO_VALUES_PER_S
    noise = propagated_range_noise(model, candidates, lambda key: key[0], feeds, metric=setup.metric, values=values)
    if noise is None:  # no evidence for either scheme: recorded, so that rescheme does not load the model again
        return {scheme: {} for scheme in SCHEMES}
    log.info(
        "calibration auto: propagated output error of %d tensors x %d ranges (at most %d samples, %.1f s)",
        len(noise),
        len(SCHEMES) * len(AUTO_METHODS),
        len(feeds),
        time.perf_counter() - started,
    )
    return {scheme: {n: {m: by[(scheme, m)] for m in AUTO_METHODS} for n, by in noise.items()} for scheme in SCHEMES}


@dataclass(frozen=True)
class MethodChoice:
    """``calibration.method: auto``'s answer: each tensor's method, and each candidate's output SQNR (dB)."""

    methods: dict[str, str]
    evidence: dict[str, dict[str, float]]


def choose_methods(noise: dict[str, dict[str, float]], names: list[str]) -> MethodChoice:
    """``calibration.method: auto``: per tensor, the chosen method and each candidate's propagated output SQNR.

    Empty when there is no evidence (the torch evaluator cannot run the graph): those tensors keep mse's range,
    under the guards.
    """
    measured = {n: noise[n] for n in names if n in noise}
    if not measured:
        return MethodChoice({}, {})
    picked = pick_methods(measured)
    log.info(
        "calibration auto: %s over %d tensors (propagated output error)",
        {m: sum(v == m for v in picked.values()) for m in AUTO_METHODS},
        len(picked),
    )
    return MethodChoice(picked, {n: {m: json_db(noise_db(v), 2) for m, v in by.items()} for n, by in measured.items()})
