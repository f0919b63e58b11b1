"""Stratified calibration sampling: N samples balanced over strata (labels, domains, length buckets), seeded.

Bad calibration data (one class only, too few samples) is the most common reason INT8 loses accuracy.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from dopt_common.errors import CalibrationError

logger = logging.getLogger(__name__)

MODES = ("balanced", "proportional")


@dataclass(frozen=True)
class Selection:
    """The chosen calibration samples with per-stratum counts, a hash of their ids and any warnings."""

    indices: tuple[int, ...]
    counts: dict[str, int]
    available: dict[str, int]
    sample_hash: str
    warnings: tuple[str, ...]


def length_bucket(length: int, edges: Sequence[int] = (16, 32, 64, 128)) -> str:
    """A stratum key for a text length: "<=16", "17-32", "33-64", "65-128", ">128" for the default edges."""
    bounds = [int(e) for e in edges]
    if not bounds or any(b >= a for b, a in pairwise(bounds)) or bounds[0] < 0:
        raise CalibrationError(f"length bucket edges {list(edges)} must be non-empty, non-negative and increasing")
    if length < 0:
        raise CalibrationError(f"sample length {length} is negative")
    if length <= bounds[0]:
        return f"<={bounds[0]}"
    for low, high in pairwise(bounds):
        if length <= high:
            return f"{low + 1}-{high}"
    return f">{bounds[-1]}"


def check_disjoint(calibration_ids: Iterable[str], evaluation_ids: Iterable[str]) -> None:
    """Refuse calibration data that overlaps the evaluation data (it would flatter the accuracy check)."""
    evaluation = {str(i) for i in evaluation_ids}
    shared: list[str] = []
    seen: set[str] = set()
    for sample in calibration_ids:
        sample = str(sample)
        if sample in evaluation and sample not in seen:
            shared.append(sample)
            seen.add(sample)
    if shared:
        raise CalibrationError(
            f"{len(shared)} calibration samples also appear in the evaluation data (e.g. {shared[0]}); "
            "fix: give data.calibration and data.evaluation disjoint splits"
        )


def _largest_remainder(budget: int, weights: dict[str, int]) -> dict[str, int]:
    """Split ``budget`` in proportion to ``weights``; leftover units go by largest remainder, ties by key order."""
    total = sum(weights.values())
    if total == 0:
        return dict.fromkeys(weights, 0)
    shares = {name: budget * w // total for name, w in weights.items()}
    order = sorted(weights, key=lambda name: -(budget * weights[name] % total))  # stable: keeps key order on ties
    for name in order[: budget - sum(shares.values())]:
        shares[name] += 1
    return shares


def _allocate(
    budget: int, weights: dict[str, int], low: int, high: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Shares ∝ weights within [low, high[s]] summing to ``budget``, and the share each capped stratum wanted."""
    fixed: dict[str, int] = {}
    capped: dict[str, int] = {}
    while len(fixed) < len(weights):
        free = {name: w for name, w in weights.items() if name not in fixed}
        shares = _largest_remainder(budget - sum(fixed.values()), free)
        over = {name: s for name, s in shares.items() if s > high[name]}
        under = [name for name, s in shares.items() if s < low]
        if not over and not under:
            fixed.update(shares)
            break
        # Caps go first: they only free budget, which raises the others' shares; repeat until stable.
        capped.update(over)
        fixed.update({name: high[name] for name in over} if over else dict.fromkeys(under, low))
    result = {name: fixed[name] for name in weights}
    # Rounding can leave a unit over or short once every stratum is fixed; settle it in key order.
    for name in weights:
        gap = budget - sum(result.values())
        if gap == 0:
            break
        result[name] += min(gap, high[name] - result[name]) if gap > 0 else max(gap, low - result[name])
    return result, capped


def _group(keys: Sequence[Hashable]) -> dict[str, list[int]]:
    """Candidate positions per stratum, keyed by ``str(key)`` and sorted by it."""
    groups: dict[str, list[int]] = {}
    originals: dict[str, Hashable] = {}
    for position, key in enumerate(keys):
        try:
            hash(key)
        except TypeError as exc:
            raise CalibrationError(f"calibration stratum key {key!r} is not hashable; use str, int or tuple") from exc
        name = str(key)
        first = originals.setdefault(name, key)
        if first is not key and first != key:
            raise CalibrationError(
                f"calibration strata {first!r} and {key!r} share the text '{name}'; fix: use keys of one type"
            )
        groups.setdefault(name, []).append(position)
    return {name: groups[name] for name in sorted(groups)}


def stratified_sample(
    keys: Sequence[Hashable],
    n: int,
    *,
    ids: Sequence[str] | None = None,
    mode: str = "balanced",
    min_per_stratum: int = 1,
    seed: int = 0,
) -> Selection:
    """Choose ``n`` candidates balanced (equal share) or proportionally over the strata ``keys``, seeded."""
    if mode not in MODES:
        raise CalibrationError(f"calibration.mode '{mode}' is unknown; use balanced or proportional")
    if n <= 0:
        raise CalibrationError(f"calibration needs a positive sample count, got {n}; fix: set calibration.samples >= 1")
    if min_per_stratum < 0:
        raise CalibrationError(f"calibration.min_per_stratum must be >= 0, got {min_per_stratum}")
    if len(keys) == 0:
        raise CalibrationError("calibration data is empty; fix: data.calibration must yield samples")
    if ids is not None and len(ids) != len(keys):
        raise CalibrationError(f"calibration has {len(keys)} stratum keys but {len(ids)} sample ids; they must match")
    sample_ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(keys))]

    groups = _group(keys)
    available = {name: len(positions) for name, positions in groups.items()}
    for name, count in available.items():
        if count < min_per_stratum:
            raise CalibrationError(
                f"calibration stratum '{name}' has {count} candidates, fewer than calibration.min_per_stratum="
                f"{min_per_stratum}; fix: add data for it, lower calibration.min_per_stratum, or drop the stratum"
            )

    messages: list[str] = []
    total = len(keys)
    if n >= total:
        if n > total:
            messages.append(f"calibration asked for {n} samples but only {total} exist; taking all {total}")
        counts = dict(available)
    else:
        if n < min_per_stratum * len(groups):
            raise CalibrationError(
                f"calibration.samples={n} cannot give {len(groups)} strata calibration.min_per_stratum="
                f"{min_per_stratum} each; fix: raise calibration.samples to at least {min_per_stratum * len(groups)}"
            )
        weights = dict.fromkeys(groups, 1) if mode == "balanced" else available
        counts, capped = _allocate(n, weights, min_per_stratum, available)
        if mode == "balanced":
            for name, wanted in capped.items():
                messages.append(
                    f"calibration stratum '{name}' has only {available[name]} candidates, below its balanced "
                    f"share of {wanted}; took all {available[name]} and gave the shortfall to the other strata"
                )

    chosen_total = sum(counts.values())
    if len(groups) > 1:
        for name, count in counts.items():
            if 2 * count > chosen_total:
                messages.append(
                    f"calibration stratum '{name}' dominates: {count} of {chosen_total} chosen samples "
                    f"({100 * count / chosen_total:.0f}%); consider calibration.mode=balanced or more data elsewhere"
                )

    rng = np.random.default_rng(seed)
    indices: list[int] = []
    for name, positions in groups.items():
        picks = rng.choice(len(positions), size=counts[name], replace=False)
        indices.extend(positions[int(p)] for p in picks)
    indices.sort()

    digest = hashlib.sha256("\n".join(sample_ids[i] for i in indices).encode("utf-8")).hexdigest()
    for message in messages:
        logger.warning(message)
    return Selection(tuple(indices), counts, available, digest, tuple(messages))
