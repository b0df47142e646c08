import numpy as np
import pytest

import attngeom as ag
import reference as ref


@pytest.mark.parametrize("kernel,params", [("exp", {}), ("gaussian", {"sigma": 0.3}), ("cauchy", {"gamma": 2.0})])
def test_psi_formulas(kernel, params):
    tau = np.linspace(-2, 2, 5)[:, None]
    s = np.linspace(-3, 3, 7)[None, :]
    out = ag.psi(tau, s, kernel, **params)
    assert out.shape == (5, 7) and out.dtype == np.float64
    np.testing.assert_allclose(out, np.exp(ref.log_psi(kernel, tau, s, **params)), rtol=1e-15)
    assert np.all(out > 0)
    assert ag.psi(np.float32(1), np.ones(3, np.float32), kernel, **params).dtype == np.float32


def test_shift_invariant_kernels_depend_on_difference():
    for kernel, params in (("gaussian", {"sigma": 0.5}), ("cauchy", {"gamma": 0.5})):
        a = ag.psi(1.0, np.array([0.2, 0.9]), kernel, **params)
        b = ag.psi(11.0, np.array([10.2, 10.9]), kernel, **params)
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_kernel_argument_errors():
    with pytest.raises(ValueError, match="kernel must be one of"):
        ag.psi(1.0, 1.0, "nope")
    with pytest.raises(ValueError, match="gamma must be > 0"):
        ag.psi(1.0, 1.0, "cauchy", gamma=-1)
    with pytest.raises(TypeError, match="tau must be a real"):
        ag.psi(1j, 1.0)
    assert ag.KERNELS == ("exp", "gaussian", "cauchy", "stable")
