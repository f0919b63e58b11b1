"""What every trial of the auto search shares: the base models trials vary, the context (models, scorer, latency
probe, clock) that measures each trial, and the choices among bases that several steps make."""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.analysis.sensitivity.analyze import SubsetScorer
from deploy_opt.analysis.sensitivity.variants import exclusion_variant
from deploy_opt.autotune.candidates import Candidate, configured
from deploy_opt.autotune.latency import LatencyProbe
from deploy_opt.autotune.trials import Trial
from deploy_opt.config.setup import SearchSettings
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.evaluation.uncertainty import standard_error
from deploy_opt.stages.benchmark import feed_of_size
from deploy_opt.stages.calibration_set import CalibrationSet
from deploy_opt.stages.quantize import QuantizedModel, quantize
from dopt_common.clock import WorkClock, work_seconds
from dopt_common.ort import create_session
from exporters.ort.graph import quantized_nodes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """A fully quantized candidate (only the static fallback in FP32): what fallback and latency trials vary."""

    candidate: Candidate
    source: Path  # the FP32 model it quantizes (SmoothQuant-ed or not)
    model: QuantizedModel
    smoothing: dict[str, Any] | None
    recovery: dict[str, Any] | None = None  # what each recovery method changed (``autotune.recover``), by method


@dataclass
class SearchContext:
    """What every trial needs: the models, the scorer, the latency probe and the clock (work, not wall time)."""

    settings: SearchSettings
    fp32_path: Path
    fp32: onnx.ModelProto
    scorer: SubsetScorer
    baseline: float
    baseline_scores: np.ndarray  # FP32's per-sample scores, which each trial's are paired with
    metric: Metric
    probe: LatencyProbe | None
    clock: WorkClock
    trials: list[Trial]
    calibration: CalibrationSet
    work: Path  # the search's scratch folder: trials that must be written go there
    models: dict[Candidate, bytes] = dataclasses.field(default_factory=dict)  # each trial's serialized model
    bar: Any = None  # tqdm over the time budget: trials so far, the last one, and the time left at most
    calibration_s: float = 0.0  # the first calibration's work seconds: what SmoothQuant's calibration costs again
    executor: Any = None  # Ray tasks for accuracy evaluations (sensitivity.parallel/address), None: in-process
    variants: int = 0  # chain variants written so far (each its own scratch folder)

    @property
    def parallel(self) -> int:
        """How many accuracy evaluations run at once."""
        return 1 if self.executor is None else int(self.executor.parallel)

    def scores_of(self, models: list[bytes]) -> list[np.ndarray]:
        """Per-sample scores of each serialized model: as Ray tasks when there is an executor (the scorer goes
        to the object store once). Nothing is timed meanwhile: timings run on the driver, with the workers idle."""
        if self.executor is None:
            return [self.scorer.sample_scores(m) for m in models]
        from dopt_common.executor import scatter

        return scatter(self.executor, _scores_of, self.scorer, models)

    def time_left(self, extra: float = 0.0) -> bool:
        """Whether another trial fits: one like the last few, plus ``extra`` work seconds before it (a ViT-S
        trial takes 45 s, so a search that started its last trial just before the deadline ran 52 s over its
        budget; choosing a ViT-S's ranges again for the symmetric scheme took 44 s more). The budget counts work
        (``dopt_common.clock``), so load does not change which trials start; the wall cap only stops a search
        on a machine too loaded to finish it."""
        recent = self.trials[-3:]
        work = statistics.median(t.work_s for t in recent) if recent else 0.0
        wall = statistics.median(t.seconds for t in recent) if recent else 0.0
        return self.clock.left(work + extra, wall)

    def measure(
        self,
        step: str,
        candidate: Candidate,
        model: onnx.ModelProto,
        predicted: float | None = None,
        scores: np.ndarray | None = None,
        nodes: int | None = None,
    ) -> Trial:
        """Score (unless ``scores`` were computed already) and time one candidate, and record the trial."""
        started, working = time.perf_counter(), work_seconds(self.clock.threads)
        data = model.SerializeToString()
        self.models[candidate] = data
        fidelity = None
        if scores is None:
            scores, fidelity = self.scorer.scored(data)
        value = float(np.mean(scores))
        latency, speedup = self.probe.speedup(data) if self.probe else (None, None)
        if nodes is None:  # Q/DQ nodes; a dynamic INT8 model's caller counts its own
            nodes = sum(n.op_type in self.settings.setup.quantization.op_types for n in quantized_nodes(model))
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
            work_s=work_seconds(self.clock.threads) - working,
            fidelity_db=fidelity,
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


def _scores_of(scorer: SubsetScorer, model: bytes) -> np.ndarray:
    """A task's body: the scorer's per-sample scores of one serialized model."""
    return scorer.sample_scores(model)


def new_context(
    settings: SearchSettings,
    fp32_path: Path,
    held: list[Batch],
    metric: Metric,
    clock: WorkClock,
    calibration: CalibrationSet,
    work: Path,
) -> SearchContext:
    setup, bench = settings.setup, settings.benchmark
    threads = setup.runtime.threads
    fp32 = onnx.load(str(fp32_path))
    session = create_session(fp32_path, threads=threads, spin=False)  # its CPU time is budgeted work
    references = [session.run(None, b.inputs)[0] for b in held]
    scorer = SubsetScorer(held, references, metric, threads)
    timed = setup.auto.min_gain is not None and "ort-cpu" in setup.deploy.targets and bench.enabled
    batch = settings.gate.speedup_batch or max(bench.batch_sizes)
    probe = None
    if timed:  # the final timing runs as the benchmark does (spinning, benchmark.threads); the ranking on one
        # thread's CPU time
        timing = bench.threads
        timed_fp32, single = create_session(fp32_path, threads=timing), create_session(fp32_path, threads=1)
        probe = LatencyProbe(timed_fp32, feed_of_size(held[0], batch), timing, fp32_single=single)
    baseline = scorer.sample_scores(fp32)
    from deploy_opt.analysis.sensitivity.mixed_precision import task_executor

    executor = task_executor(settings.sensitivity)
    return SearchContext(
        settings,
        fp32_path,
        fp32,
        scorer,
        float(np.mean(baseline)),
        baseline,
        metric,
        probe,
        clock,
        [],
        calibration,
        work,
        executor=executor,
    )


def paying(ctx: SearchContext, bases: list[Base]) -> list[Base]:
    """The bases faster than FP32 by ``auto.min_gain`` (all of them when the search is not timed)."""
    measured = {t.candidate: t for t in ctx.trials}
    return [b for b in bases if ctx.probe is None or measured[b.candidate].pays(ctx.settings.setup.auto.min_gain)]


def most_accurate(trials: list[Trial], bases: list[Base]) -> Base:
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
            -measured[b.candidate].fidelity,
            -(measured[b.candidate].speedup or 0.0),
        ),
    )


def base_of(trial: Trial, bases: list[Base]) -> Base:
    settings = dataclasses.replace(trial.candidate, excluded=())
    return next(b for b in bases if dataclasses.replace(b.candidate, excluded=()) == settings)


def variant_model(
    ctx: SearchContext, base: Base, candidate: Candidate, qdq: onnx.ModelProto, source: onnx.ModelProto
) -> onnx.ModelProto:
    """``base`` with ``candidate.excluded`` in FP32: derived from its Q/DQ model, or written again for chains.

    Chain coverage lets ORT's writer remove a Relu or Clip and do its clip in the producer's Q/DQ pair; excluding
    that producer would take the clip away with the pair, so those variants are written by the writer itself.
    """
    op_types = candidate.op_types(ctx.settings.setup.quantization.op_types)
    if candidate.coverage != "chain":
        return exclusion_variant(qdq, source, op_types, candidate.excluded, candidate.placement)
    ctx.variants += 1
    folder = ctx.work / f"variant-{ctx.variants}"
    written = quantize(
        configured(ctx.settings.setup, candidate),
        base.source,
        ctx.calibration,
        folder,
        ranges=base.model.ranges,
        smoothing=base.smoothing,
        recovery=base.recovery,
    )
    return onnx.load(str(written.path))
