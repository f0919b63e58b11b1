"""The demo's digits are scikit-learn's, read from the file scikit-learn ships without importing it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from deploy_opt.demo.digits import digits_arrays


def test_the_digits_are_exactly_what_load_digits_returns() -> None:
    reference = pytest.importorskip("sklearn.datasets").load_digits()
    data, target = digits_arrays()
    assert data.dtype == reference.data.dtype and target.dtype == reference.target.dtype
    np.testing.assert_array_equal(data, reference.data)
    np.testing.assert_array_equal(target, reference.target)
    assert not data.flags.writeable and not target.flags.writeable  # one cached copy for every caller


def test_reading_them_does_not_import_scikit_learn() -> None:
    code = "import sys; from deploy_opt.demo import digits; digits.digits_arrays(); print('sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
