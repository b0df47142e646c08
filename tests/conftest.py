import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Tolerances: float64 kernels agree with the float64 references to a few ulps times the
# condition of the problem; float32 kernels accumulate in float32.
TOL = {np.float64: 1e-12, np.float32: 2e-5}


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))
