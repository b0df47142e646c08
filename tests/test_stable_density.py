"""The symmetric alpha-stable density against closed forms, numerical integration and series."""
import math
import warnings

import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag
import reference as ref

X_MID = np.array([0.0, 1e-3, 0.05, 0.3, 0.9, 1.7, 3.1, 6.0, 11.0, 20.0])


@pytest.mark.parametrize("c", [0.5, 1.0, 3.0])
def test_closed_forms_alpha_2_and_1(c):
    x = np.concatenate([-np.geomspace(1e-4, 1e3, 60), [0.0], np.geomspace(1e-4, 1e3, 60)])
    g = np.exp(-x**2 / (4 * c)) / (2 * np.sqrt(np.pi * c))
    ok = g > 1e-300
    assert rel_err(ag.stable_density(x[ok], 2.0, c), g[ok]) < 1e-12
    logg = -x**2 / (4 * c) - np.log(2 * np.sqrt(np.pi * c))
    assert np.max(np.abs(ag.stable_density(x, 2.0, c, log=True) - logg) / np.abs(logg)) < 1e-12
    cauchy = c / (np.pi * (c**2 + x**2))
    assert np.max(np.abs(ag.stable_density(x, 1.0, c) / cauchy - 1)) < 1e-13


@pytest.mark.parametrize("alpha", [0.9, 0.999, 1.001, 1.2, 1.5, 1.8, 1.95, 2.0])
@pytest.mark.parametrize("c", [0.5, 1.0, 3.0])
def test_against_numerical_integration(alpha, c):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = ref.stable_density(X_MID, alpha, c)
    f = ag.stable_density(X_MID, alpha, c)
    ok = r > 1e-8  # relative accuracy of the oscillatory quadrature itself
    assert np.max(np.abs(f[ok] / r[ok] - 1)) < 1e-11


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, 0.8, 0.95, 0.999])
def test_heavy_tails_against_convergent_series(alpha):
    """alpha < 1: the tail series converges for every x > 0 (an independent evaluation)."""
    x = np.geomspace(1e-3, 1e6, 40)
    r = ref.stable_tail_series(x, alpha)
    ok = np.isfinite(r)
    assert ok.sum() >= 20  # the series is well conditioned from x ~ 1 (alpha -> 1) or less
    assert np.max(np.abs(ag.stable_density(x[ok], alpha) / r[ok] - 1)) < 1e-11


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.7, 1.0, 1.5, 2.0])
def test_value_at_zero_and_scaling(alpha):
    assert abs(ag.stable_density(0.0, alpha) / (math.gamma(1 + 1 / alpha) / math.pi) - 1) < 3e-11
    x = np.linspace(-7, 7, 29)
    c = 2.5
    scaled = c ** (-1 / alpha) * ag.stable_density(x * c ** (-1 / alpha), alpha)
    np.testing.assert_allclose(ag.stable_density(x, alpha, c), scaled, rtol=1e-11)


@pytest.mark.parametrize("alpha", [0.5, 0.8, 1.3, 1.7])
def test_normalised_symmetric_monotone(alpha):
    from scipy import integrate

    f = lambda t: float(ag.stable_density(t, alpha))
    total = 2 * sum(integrate.quad(f, a, b, epsabs=0, epsrel=1e-12, limit=500)[0]
                    for a, b in [(0, 1), (1, 10), (10, 1e3), (1e3, np.inf)])
    assert abs(total - 1) < 1e-9
    x = np.geomspace(1e-6, 1e8, 400)
    y = ag.stable_density(x, alpha)
    assert np.array_equal(y, ag.stable_density(-x, alpha))
    assert np.all(np.diff(y) < 0)
    # log density: consistent where f is representable, finite where it is not
    assert np.allclose(ag.stable_density(x, alpha, log=True), np.log(y), rtol=0, atol=1e-13 * 50)
    assert np.isfinite(ag.stable_density(1e300, alpha, log=True))


def test_kernel_attention_stable_matches_gaussian_and_cauchy(rng):
    """alpha = 2 and 1 reproduce the Gaussian (sigma^2 = 2c) and Cauchy (gamma = c) kernels."""
    q, k, v = rng.standard_normal((2, 30, 6)), rng.standard_normal((2, 80, 6)), rng.standard_normal((2, 80, 4))
    for c in (0.3, 1.0):
        y2 = ag.kernel_attention(q, k, v, kernel="stable", alpha=2.0, c=c)
        yg = ag.kernel_attention(q, k, v, kernel="gaussian", sigma=math.sqrt(2 * c))
        assert rel_err(y2, yg) < 1e-10
        y1 = ag.kernel_attention(q, k, v, kernel="stable", alpha=1.0, c=c)
        yc = ag.kernel_attention(q, k, v, kernel="cauchy", gamma=c)
        assert rel_err(y1, yc) < 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_attention_stable_against_reference(rng, dtype):
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in ((3, 20, 5), (3, 50, 5), (3, 50, 3)))
    mask = rng.random((20, 50)) < 0.8
    for alpha in (0.7, 1.3):
        y, P = ag.kernel_attention(q, k, v, kernel="stable", alpha=alpha, c=0.5, mask=mask, causal=True,
                                   return_routing=True)
        u, tau = ref.tilt_radius(q)
        logw = ref.log_psi("stable", tau[..., None], u @ np.swapaxes(k.astype(np.float64), -1, -2), alpha=alpha, c=0.5)
        keep = mask & ref.causal_keep(20, 50, True)
        P_r, _ = ref.normalise(logw, np.broadcast_to(keep, logw.shape))
        tol = 1e-11 if dtype == np.float64 else 2e-5
        assert np.max(np.abs(P - P_r)) < tol
        assert np.all(P >= 0)
        np.testing.assert_allclose(P.sum(-1), 1, atol=tol)


def test_bad_arguments():
    for alpha in (0, -1, 2.0001, np.nan, np.inf):
        with pytest.raises(ValueError, match="alpha"):
            ag.stable_density(1.0, alpha)
    with pytest.raises(ValueError, match="c must be > 0"):
        ag.stable_density(1.0, 1.5, 0)
    with pytest.raises(TypeError, match="x must be a real"):
        ag.stable_density(1j, 1.5)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        ag.stable_density(1.0, "1.5")
    assert np.isnan(ag.stable_density(np.nan, 1.5))


def test_extreme_scales_give_finite_logs_or_clear_errors():
    """c**(-1/alpha) beyond the float range used to crash (a NaN became a table index)."""
    alpha, c = 0.5, 1e-200
    log_s = math.log(c) / alpha  # log of the scale s = c^(1/alpha) = 1e-400, not representable
    at0 = ag.stable_density(np.zeros(1), alpha, c, log=True)[0]
    assert math.isclose(at0, math.lgamma(1 + 1 / alpha) - math.log(math.pi) - log_s, rel_tol=1e-12)
    # f(x; c) = f_1(x / s) / s; x = 1e-300 is u = x / s = 1e100, x = 1e-5 beyond the float range
    x = np.array([1e-300, 1e-200])
    expected = ag.stable_density(np.array([1e100, 1e200]), alpha, log=True) - log_s
    np.testing.assert_allclose(ag.stable_density(x, alpha, c, log=True), expected, rtol=1e-12)
    far = ag.stable_density(np.array([1e-5, 1.0]), alpha, c, log=True)
    # the leading tail term c Gamma(alpha + 1) sin(pi alpha / 2) / (pi |x|^(alpha + 1)) is exact there
    lead = (math.log(c) + math.lgamma(alpha + 1) + math.log(math.sin(math.pi * alpha / 2)) - math.log(math.pi)
            - (alpha + 1) * np.log([1e-5, 1.0]))
    np.testing.assert_allclose(far, lead, rtol=1e-12)
    with pytest.raises(ValueError, match="exceeds the float64 range.*log=True"):
        ag.stable_density(np.zeros(1), alpha, c)
    # huge c: the scale overflows the other way
    big = ag.stable_density(np.array([0.0, 1e300]), 0.5, 1e200, log=True)
    assert np.all(np.isfinite(big))
    q = np.zeros((3, 4))
    y = ag.kernel_attention(q, np.ones((5, 4)), np.ones((5, 2)), kernel="stable", alpha=0.5, c=1e-200)
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_closed_forms_far_out(alpha):
    """Cauchy and Gaussian logs stay finite and exact far out (x^2 overflows for the Cauchy)."""
    x = np.array([1e160, 1e200]) if alpha == 1.0 else np.array([1e100, 1e150])
    got = ag.stable_density(x, alpha, 3.0, log=True)
    if alpha == 1.0:
        want = math.log(3.0 / math.pi) - 2 * np.log(x)
    else:
        want = -(x / 2) ** 2 / 3.0 - math.log(2 * math.sqrt(math.pi * 3.0))
    np.testing.assert_allclose(got, want, rtol=1e-12)
