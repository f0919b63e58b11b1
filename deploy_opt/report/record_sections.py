"""The typed sections of build.json that the gate, summary.md, report.html and the CLI read.

Each section reads itself from its JSON (``from_json``, lenient: a field an older or hand-written record lacks is
None, and whoever needs it says so) and writes exactly the JSON the build writes (``to_json``). Sections whose keys
are open (the export's and the quantization's provenance, the backends' artifacts) keep every entry as written
(``fields``) beside the typed fields read from it, so the record reads back byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dopt_common.errors import ReportError


def mapping(data: object, where: str) -> Mapping[str, Any]:
    """``data`` as a section, {} for a missing one; a section that is not an object is a ReportError."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ReportError(f"build.json's '{where}' is not an object; fix: pass a build.json from deploy_opt build")
    return data


def pair(value: Any) -> tuple[float, float] | None:
    """A recorded [low, high] interval, or None."""
    return (value[0], value[1]) if value else None


@dataclass(frozen=True)
class Timing:
    """One session's latency at one batch size (``Latency.to_json``): median, deciles and rounds."""

    median_ms: float | None
    p10_ms: float | None = None
    p90_ms: float | None = None
    repeats: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timing:
        return cls(data.get("median_ms"), data.get("p10_ms"), data.get("p90_ms"), data.get("repeats"))


@dataclass(frozen=True)
class BatchRow:
    """One benchmarked batch size: every session's timing, the speedups over FP32 (``speedup``,
    ``speedup_no_fallback``, ``speedup_int8_vs_original``, ...) and their 95% intervals by speedup name."""

    timings: Mapping[str, Timing]
    speedups: Mapping[str, float]
    intervals: Mapping[str, tuple[float, float]]

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {name: t.to_json() for name, t in self.timings.items()}
        for name, value in self.speedups.items():
            row[name] = value
            if name in self.intervals:
                row[f"{name}_ci95"] = list(self.intervals[name])
        return row

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchRow:
        timings = {k: Timing.from_json(v) for k, v in data.items() if isinstance(v, Mapping)}
        intervals = {k.removesuffix("_ci95"): pair(v) for k, v in data.items() if k.endswith("_ci95") and v}
        speedups = {k: v for k, v in data.items() if k not in timings and not k.endswith("_ci95")}
        return cls(timings, speedups, {k: v for k, v in intervals.items() if v is not None})


@dataclass(frozen=True)
class BenchmarkRecord:
    """The benchmark stage's result: latencies per batch size and session, with the FP32/INT8 speedups."""

    threads: int | None
    warmup: int | None
    repeats: int | None
    input_shapes: Mapping[str, list[int]] | None
    max_seconds: float | None
    batches: Mapping[str, BatchRow]
    same_model: Mapping[str, str] | None = None  # sessions that run another's graph, timed once

    def to_json(self) -> dict[str, Any]:
        """The build.json ``benchmark`` section."""
        return {
            **({"same_model": dict(self.same_model)} if self.same_model else {}),
            "threads": self.threads,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "input_shapes": self.input_shapes,
            "max_seconds": self.max_seconds,
            "batches": {size: row.to_json() for size, row in self.batches.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchmarkRecord:
        batches = mapping(data.get("batches"), "benchmark.batches")
        return cls(
            threads=data.get("threads"),
            warmup=data.get("warmup"),
            repeats=data.get("repeats"),
            input_shapes=data.get("input_shapes"),
            max_seconds=data.get("max_seconds"),
            batches={str(k): BatchRow.from_json(mapping(v, f"benchmark.batches.{k}")) for k, v in batches.items()},
            same_model=data.get("same_model"),
        )


@dataclass(frozen=True)
class DropUncertainty:
    """A drop's paired 95% bootstrap interval, and the resolution (None: a continuous score)."""

    low: float
    high: float
    resolution: float | None

    def to_json(self) -> dict[str, Any]:
        return {"drop_ci95": [self.low, self.high], "resolution": self.resolution}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DropUncertainty | None:
        ci = pair(data.get("drop_ci95"))
        return None if ci is None else cls(ci[0], ci[1], data.get("resolution"))


_METRIC_KEYS = ("name", "higher_is_better", "samples", "reference", "drop", "drop_vs", "drop_ci95", "resolution")
_OPTIONAL_METRICS = ("drop_pruned_fp32", "drop_no_fallback", "split", "decision")


@dataclass(frozen=True)
class DecisionScores:
    """The reference and shipped scores on the samples the search decided on (biased in its favour)."""

    samples: int
    scores: Mapping[str, float]
    drop: float
    uncertainty: DropUncertainty | None

    def to_json(self) -> dict[str, Any]:
        tail = self.uncertainty.to_json() if self.uncertainty else {}
        return {"samples": self.samples, **self.scores, "drop": self.drop, **tail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionScores:
        scores = {k: v for k, v in data.items() if k not in _METRIC_KEYS}
        return cls(data.get("samples"), scores, data.get("drop"), DropUncertainty.from_json(data))


@dataclass(frozen=True)
class MetricsRecord:
    """The evaluate stage's verdict: every runtime's score on the judged samples and the FP32 → INT8 drop.

    Read back, a field an older or hand-written record lacks is None (``higher_is_better``, ``reference`` and
    ``drop_vs`` are then left out of its JSON)."""

    name: str
    higher_is_better: bool | None
    samples: int
    reference: str | None  # "labels", or the runner every other is compared with
    scores: Mapping[str, float]  # by runtime: ort_fp32, ort_int8, ...
    drop: float
    drop_vs: str | None  # the baseline of ``drop``: ort_fp32, or a pruned build's ort_fp32_original
    uncertainty: DropUncertainty | None = None
    drop_pruned_fp32: float | None = None
    drop_no_fallback: float | None = None
    split: str | None = None
    decision: DecisionScores | None = None

    def to_json(self) -> dict[str, Any]:
        """The build.json ``metrics`` section (runtime scores at the top level, as the gate reads them)."""
        newer = {"higher_is_better": self.higher_is_better, "reference": self.reference, "drop_vs": self.drop_vs}
        given = {k: v for k, v in newer.items() if v is not None}  # an older record's lack stays a lack
        record: dict[str, Any] = {
            "name": self.name,
            **{k: given[k] for k in ("higher_is_better",) if k in given},
            "samples": self.samples,
            **{k: given[k] for k in ("reference",) if k in given},
            **self.scores,
            "drop": self.drop,
            **{k: given[k] for k in ("drop_vs",) if k in given},
            **(self.uncertainty.to_json() if self.uncertainty else {}),
        }
        optional = {
            "drop_pruned_fp32": self.drop_pruned_fp32,
            "drop_no_fallback": self.drop_no_fallback,
            "split": self.split,
            "decision": self.decision.to_json() if self.decision else None,
        }
        return record | {k: v for k, v in optional.items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricsRecord:
        decision = data.get("decision")
        skip = (*_METRIC_KEYS, *_OPTIONAL_METRICS)
        return cls(
            name=data.get("name"),
            higher_is_better=data.get("higher_is_better"),
            samples=data.get("samples"),
            reference=data.get("reference"),
            scores={k: v for k, v in data.items() if k not in skip},
            drop=data.get("drop"),
            drop_vs=data.get("drop_vs"),
            uncertainty=DropUncertainty.from_json(data),
            drop_pruned_fp32=data.get("drop_pruned_fp32"),
            drop_no_fallback=data.get("drop_no_fallback"),
            split=data.get("split"),
            decision=DecisionScores.from_json(decision) if isinstance(decision, Mapping) else None,
        )


@dataclass(frozen=True)
class Targets:
    """Each deploy target and what was built for it, or why not (build.json ``targets``)."""

    status: Mapping[str, str]

    def to_json(self) -> dict[str, str]:
        return dict(self.status)


@dataclass(frozen=True)
class Criterion:
    """One gate check with its measured value and limit."""

    name: str
    measured: float
    limit: float
    passed: bool
    text: str
    # False: the evidence cannot settle it (too few samples, timing too noisy). An accuracy criterion that is not
    # judged does not pass; a speed criterion that is not judged is skipped and says why.
    judged: bool = True

    @property
    def status(self) -> str:
        """PASS, FAIL, or SKIP for a criterion that could not be judged."""
        return "SKIP" if not self.judged else "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class GateResult:
    """The verdict and every criterion behind it."""

    passed: bool
    criteria: tuple[Criterion, ...]

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {"passed": self.passed, "verdict": self.verdict, "criteria": [asdict(c) for c in self.criteria]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateResult:
        """The recorded verdict (a record from before ``judged`` has every criterion judged)."""
        fields = ("name", "measured", "limit", "passed", "text", "judged")
        criteria = tuple(Criterion(**{k: c[k] for k in fields if k in c}) for c in data.get("criteria") or ())
        return cls(bool(data.get("passed")), criteria)

    @property
    def verdict(self) -> str:
        """PASSED, FAILED, or NOT JUDGED when a criterion that must pass could not be judged."""
        if self.passed:
            return "PASSED"
        return "FAILED" if any(c.judged and not c.passed for c in self.criteria) else "NOT JUDGED"

    def lines(self) -> list[str]:
        """One human line per criterion, then the verdict."""
        return [f"{c.status}  {c.text}" for c in self.criteria] + [f"gate: {self.verdict}"]
