"""The stratified calibration sampler: shares, determinism, warnings, errors and the disjointness check."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

import numpy as np
import pytest

from calibrators.sampling import Selection, check_disjoint, length_bucket, stratified_sample
from dopt_common.errors import CalibrationError

LOGGER = "calibrators.sampling"


def chosen_per_key(keys: list, selection: Selection) -> Counter:
    """How many chosen candidates each original key has."""
    return Counter(keys[i] for i in selection.indices)


def test_balanced_remainder_rule_and_determinism() -> None:
    keys = [c for c in range(10) for _ in range(100)]
    first = stratified_sample(keys, 512, seed=0)
    # 512 = 10 × 51 + 2: the first two keys in str order ("0", "1") get the extra sample.
    assert first.counts == {str(c): 52 if c < 2 else 51 for c in range(10)}
    assert chosen_per_key(keys, first) == Counter({c: 52 if c < 2 else 51 for c in range(10)})
    assert first.available == {str(c): 100 for c in range(10)}
    assert list(first.indices) == sorted(set(first.indices)) and len(first.indices) == 512
    assert first.warnings == ()

    again = stratified_sample(keys, 512, seed=0)
    other = stratified_sample(keys, 512, seed=1)
    assert again == first
    assert other.indices != first.indices and other.counts == first.counts
    assert other.sample_hash != first.sample_hash
    expected = hashlib.sha256("\n".join(str(i) for i in first.indices).encode()).hexdigest()
    assert first.sample_hash == expected


def test_sample_hash_uses_ids() -> None:
    keys = ["a", "b"] * 10
    ids = [f"sha-{i:03d}" for i in range(20)]
    selection = stratified_sample(keys, 6, ids=ids, seed=3)
    assert selection.sample_hash == hashlib.sha256("\n".join(ids[i] for i in selection.indices).encode()).hexdigest()
    assert selection.sample_hash != stratified_sample(keys, 6, seed=3).sample_hash


def test_underfilled_stratum_warns_and_redistributes(caplog: pytest.LogCaptureFixture) -> None:
    keys = ["cat"] * 100 + ["dog"] * 100 + ["rare"] * 5
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        selection = stratified_sample(keys, 90, seed=0)
    assert selection.counts == {"cat": 43, "dog": 42, "rare": 5}
    assert sum(selection.counts.values()) == len(selection.indices) == 90
    assert chosen_per_key(keys, selection) == Counter(selection.counts)
    records = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(records) == 1 and records == list(selection.warnings)
    assert "'rare'" in records[0] and "only 5 candidates" in records[0] and "share of 30" in records[0]


def test_redistribution_repeats_until_stable(caplog: pytest.LogCaptureFixture) -> None:
    # Share 25 each; 'a' (10) is short, then the share grows to 30 and 'b' (28) is short too.
    keys = ["a"] * 10 + ["b"] * 28 + ["c"] * 100 + ["d"] * 100
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        selection = stratified_sample(keys, 100, seed=0)
    assert selection.counts == {"a": 10, "b": 28, "c": 31, "d": 31}
    text = caplog.text
    assert "'a' has only 10 candidates, below its balanced share of 25" in text
    assert "'b' has only 28 candidates, below its balanced share of 30" in text


def test_below_min_per_stratum_raises() -> None:
    keys = ["a"] * 50 + ["b"] * 50 + ["tiny"] * 2
    with pytest.raises(CalibrationError, match=r"stratum 'tiny' has 2 candidates.*min_per_stratum=3.*drop the stratum"):
        stratified_sample(keys, 20, min_per_stratum=3)
    assert stratified_sample(keys, 20, min_per_stratum=2).counts["tiny"] == 2


def test_too_few_samples_for_the_minimum_raises() -> None:
    keys = [c for c in range(10) for _ in range(5)]
    with pytest.raises(CalibrationError, match=r"cannot give 10 strata.*at least 10"):
        stratified_sample(keys, 5)
    assert sum(stratified_sample(keys, 5, min_per_stratum=0).counts.values()) == 5


def test_proportional_skewed(caplog: pytest.LogCaptureFixture) -> None:
    keys = ["big"] * 700 + ["mid"] * 200 + ["small"] * 100
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        selection = stratified_sample(keys, 100, mode="proportional", seed=0)
    assert selection.counts == {"big": 70, "mid": 20, "small": 10}
    assert chosen_per_key(keys, selection) == Counter(selection.counts)
    assert any("'big' dominates" in w and "70 of 100" in w for w in selection.warnings)
    assert "'big' dominates" in caplog.text


def test_proportional_min_per_stratum_lifts_tiny_stratum() -> None:
    keys = ["big"] * 700 + ["mid"] * 200 + ["small"] * 100 + ["tiny"] * 5
    plain = stratified_sample(keys, 100, mode="proportional", min_per_stratum=0)
    assert plain.counts["tiny"] == 0
    lifted = stratified_sample(keys, 100, mode="proportional", min_per_stratum=3)
    assert lifted.counts == {"big": 68, "mid": 19, "small": 10, "tiny": 3}
    assert sum(lifted.counts.values()) == 100


def test_proportional_largest_remainder_ties_by_key() -> None:
    keys = ["b"] * 10 + ["a"] * 10 + ["c"] * 10
    assert stratified_sample(keys, 10, mode="proportional").counts == {"a": 4, "b": 3, "c": 3}


def test_more_requested_than_available(caplog: pytest.LogCaptureFixture) -> None:
    keys = ["x"] * 3 + ["y"] * 4
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        selection = stratified_sample(keys, 50)
    assert selection.indices == tuple(range(7))
    assert selection.counts == {"x": 3, "y": 4}
    assert "asked for 50 samples but only 7" in caplog.text


@pytest.mark.parametrize(
    "keys,n,kwargs,message",
    [
        ([], 10, {}, r"^calibration data is empty; fix: data\.calibration must yield samples$"),
        (["a"] * 5, 0, {}, r"positive sample count, got 0"),
        (["a"] * 5, -3, {}, r"positive sample count, got -3"),
        (["a"] * 5, 2, {"mode": "random"}, r"calibration\.mode 'random' is unknown; use balanced or proportional"),
        (["a"] * 5, 2, {"min_per_stratum": -1}, r"min_per_stratum must be >= 0"),
        (["a"] * 5, 2, {"ids": ["x"]}, r"5 stratum keys but 1 sample ids"),
        ([1, "1"], 2, {}, r"share the text '1'"),
        ([[1], [2]], 2, {}, r"not hashable"),
    ],
)
def test_bad_input_raises(keys: list, n: int, kwargs: dict, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        stratified_sample(keys, n, **kwargs)


def test_non_string_keys_and_ids() -> None:
    keys = [
        (domain, length_bucket(length)) for domain in ("wiki", "code") for length in (5, 20, 200) for _ in range(10)
    ]
    ids = [f"doc{i}" for i in range(len(keys))]
    selection = stratified_sample(keys, 30, ids=ids, seed=7)
    assert set(selection.counts.values()) == {5}
    assert "('wiki', '<=16')" in selection.counts and "('code', '>128')" in selection.counts
    assert list(selection.counts) == sorted(selection.counts)

    ints = stratified_sample([i % 3 for i in range(30)], 9, seed=7)
    assert ints.counts == {"0": 3, "1": 3, "2": 3}
    numpy_ints = stratified_sample(list(np.arange(30) % 3), 9, seed=7)
    assert numpy_ints == ints


def test_length_bucket() -> None:
    assert [length_bucket(n) for n in (0, 16, 17, 32, 33, 64, 65, 128, 129, 4096)] == [
        "<=16",
        "<=16",
        "17-32",
        "17-32",
        "33-64",
        "33-64",
        "65-128",
        "65-128",
        ">128",
        ">128",
    ]
    assert length_bucket(10, edges=(8,)) == ">8"
    with pytest.raises(CalibrationError, match="increasing"):
        length_bucket(10, edges=(32, 16))
    with pytest.raises(CalibrationError, match="negative"):
        length_bucket(-1)


def test_check_disjoint() -> None:
    check_disjoint(["a", "b"], ["c", "d"])
    check_disjoint([], ["c"])
    with pytest.raises(CalibrationError, match=r"^2 calibration samples also appear .*\(e\.g\. b\); fix: give data"):
        check_disjoint(iter(["a", "b", "c", "b"]), iter(["c", "b", "z"]))


@pytest.mark.parametrize("seed", range(20))
def test_random_configurations_keep_invariants(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 60, size=int(rng.integers(1, 8)))
    keys = [k for k, size in enumerate(sizes) for _ in range(int(size))]
    n = int(rng.integers(len(sizes), 2 * len(keys)))
    for mode in ("balanced", "proportional"):
        selection = stratified_sample(keys, n, mode=mode, seed=seed)
        assert len(selection.indices) == min(n, len(keys)) == sum(selection.counts.values())
        assert len(set(selection.indices)) == len(selection.indices)
        assert all(1 <= selection.counts[k] <= selection.available[k] for k in selection.counts)
        if mode == "balanced":
            free = [c for k, c in selection.counts.items() if c < selection.available[k]]
            # Strata that could give more are within one of the largest share; the rest gave all they had.
            assert not free or min(free) >= max(selection.counts.values()) - 1


def test_real_digits_labels_balanced() -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    labels = datasets.load_digits().target.tolist()
    selection = stratified_sample(labels, 500, seed=0)
    assert selection.counts == {str(c): 50 for c in range(10)}
    assert chosen_per_key(labels, selection) == Counter(dict.fromkeys(range(10), 50))
    assert selection.warnings == ()
