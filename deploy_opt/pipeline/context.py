"""What the build's stages share, so that each takes one argument for it instead of the same parameter list."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.metrics import Metric
from dopt_common.runs import Timings


@dataclass(frozen=True)
class StageContext:
    """One build's staging folder, its stage timer and progress bars, and what its choices are made on: the metric
    and the decision samples (the decide split of the evaluation set; the gate judges another split)."""

    stage: Path  # the staging folder the build is assembled in (``staged_dir``)
    times: Timings  # build.json's ``timings_s``: each stage runs inside ``times.stage(name)``
    progress: bool  # show progress bars (training loops)
    metric: Metric
    evaluation: list[Batch]  # held in memory: the search, the fallback, sensitivity and QAT revisit it
