"""Decide on one split, judge on another.

The auto search, the fallback bisection, QAT's checkpoint choice and pruning compare dozens of candidates on
the samples they are given; the best of them looks better on those samples than it is. So they decide on
``data.validation`` when the config names it, else on a seeded half of the evaluation data, and the gate
judges on the evaluation samples none of them saw. Both numbers are reported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from deploy_opt.config.build import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.sources import Batch, iter_batches, sample_ids, select_rows
from deploy_opt.evaluation.uncertainty import split_indices
from deploy_opt.stages.calibration_set import CalibrationSet, refuse_overlap
from dopt_common.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationSplit:
    """What decides and what is judged. ``decide`` is empty when nothing in the build chooses among candidates
    (a manual build without fallback): then every evaluation sample is judged, streamed."""

    decide: tuple[Batch, ...]
    judge: list[Batch] | Iterator[Batch]
    how: str  # one line for build.json and the report
    shared: bool = False  # too few samples to split: the decisions were taken on the judged samples

    @property
    def separate_decision(self) -> tuple[Batch, ...]:
        """The decision samples to score apart from the judged ones (none when they are the same samples)."""
        return () if self.shared else self.decide


def split_evaluation(
    data: DataConfig,
    specs: tuple[InputSpec, ...],
    base_dir: str,
    evaluation: list[Batch] | Iterator[Batch],
    calibration: CalibrationSet,
    seed: int,
) -> EvaluationSplit:
    """``data.validation`` decides when given; else a held evaluation set is halved by ``seed``; a streamed one
    (nothing decides) is judged whole."""
    if data.validation is not None:
        decide = tuple(iter_batches(data.validation, specs, data, base_dir, "data.validation"))
        if not decide:
            raise InputError(f"data.validation '{data.validation}' yielded no samples; fix the data function")
        refuse_overlap(calibration, [i for b in decide for i in sample_ids(b)])
        judge = evaluation if isinstance(evaluation, list) else list(evaluation)
        _refuse_shared(decide, judge, data.validation)
        return EvaluationSplit(
            decide,
            judge,
            f"decided on data.validation ({_count(decide)} samples), judged on "
            f"data.evaluation ({_count(judge)} samples)",
        )
    if not isinstance(evaluation, list):
        return EvaluationSplit((), evaluation, "judged on data.evaluation (nothing in this build decides on it)")
    total = _count(evaluation)
    chosen, judged = split_indices(total, seed)
    if not chosen:
        log.warning("data.evaluation has %d sample(s): too few to split; the search decides on what is judged", total)
        return EvaluationSplit(
            tuple(evaluation), evaluation, f"decided and judged on the same {total} sample(s)", shared=True
        )
    decide, judge = tuple(select_rows(evaluation, chosen)), select_rows(evaluation, judged)
    how = (
        f"data.evaluation split by seed {seed}: {len(chosen)} samples decide (search, fallback, QAT), "
        f"{len(judged)} are judged; name data.validation to decide on samples of your own"
    )
    log.info("%s", how)
    return EvaluationSplit(decide, judge, how)


def _count(batches: Iterable[Batch]) -> int:
    return sum(b.size for b in batches)


def _refuse_shared(decide: Iterable[Batch], judge: Iterable[Batch], ref: str) -> None:
    seen = {i for b in decide for i in sample_ids(b)}
    shared = [i for b in judge for i in sample_ids(b) if i in seen]
    if shared:
        raise InputError(
            f"data.validation '{ref}' shares {len(shared)} sample(s) with data.evaluation (first: {shared[0]}); "
            "fix: point them at disjoint splits, or drop data.validation to split the evaluation data"
        )
