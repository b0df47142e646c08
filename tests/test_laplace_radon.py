"""The Laplace-Radon picture: tilts, radii, projections, Z and N, the exact identity,
cumulants and the exponential-family gradient (Lawrence, Laplace-Radon s.4, s.9, s.10)."""
import math

import numpy as np
import pytest
from conftest import TOL, rel_err

import attngeom as ag
import reference as ref


def heads(rng, b=(2, 3), n_q=40, n_k=70, d_k=16, d_v=8, dtype=np.float64):
    q = rng.standard_normal(b + (n_q, d_k)).astype(dtype)
    k = rng.standard_normal(b + (n_k, d_k)).astype(dtype)
    v = rng.standard_normal(b + (n_k, d_v)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tilt_radius(rng, dtype):
    q = rng.standard_normal((3, 20, 7)).astype(dtype)
    q[1, 4] = 0
    u, tau = ag.tilt_radius(q)
    u_r, tau_r = ref.tilt_radius(q)
    assert u.dtype == dtype and tau.dtype == dtype and u.shape == q.shape and tau.shape == q.shape[:-1]
    assert rel_err(u, u_r) < TOL[dtype] and rel_err(tau, tau_r) < TOL[dtype]
    norms = np.linalg.norm(u, axis=-1)
    assert np.all(u[1, 4] == 0) and tau[1, 4] == 0
    np.testing.assert_allclose(np.delete(norms.reshape(-1), 1 * 20 + 4), 1, rtol=TOL[dtype])
    # reconstruction q = |q| u and the logit identity tau u.k = q.k / sqrt(d) (eq. 9)
    np.testing.assert_allclose(tau[..., None] * math.sqrt(7) * u, q, rtol=TOL[dtype] * 10, atol=TOL[dtype])
    u2, tau2 = ag.tilt_radius(q, scale=2.0)
    assert rel_err(tau2, 2 * np.linalg.norm(q.astype(np.float64), axis=-1)) < TOL[dtype]


def test_radon_project(rng):
    q, k, _ = heads(rng)
    u, tau = ag.tilt_radius(q)
    s = ag.radon_project(u, k)
    assert s.shape == (2, 3, 40, 70)
    assert rel_err(s, np.einsum("...jd,...id->...ji", u, k)) < 1e-14
    # logits factor through the projection: l = tau s (eq. 9, 15)
    logits = q @ np.swapaxes(k, -1, -2) / 4.0
    assert rel_err(tau[..., None] * s, logits) < 1e-14
    with pytest.raises(ValueError, match="k must have shape"):
        ag.radon_project(u, k[..., :3])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exact_identity_laplace_radon_equals_softmax(rng, dtype):
    """Theorem 1 (eq. 14): N/Z on the Radon projections is softmax attention."""
    for shape in [((2, 3), 40, 70, 16, 8), ((), 1, 1, 1, 1), ((5,), 129, 300, 64, 32)]:
        b, n_q, n_k, d_k, d_v = shape
        q, k, v = heads(rng, b, n_q, n_k, d_k, d_v, dtype)
        y = ag.laplace_radon_attention(*ag.tilt_radius(q), k, v)
        y_sm = ag.softmax_attention(q, k, v)
        assert rel_err(y, y_sm) <= (1e-14 if dtype == np.float64 else 2e-6)


def test_identity_with_masks_and_causal(rng):
    q, k, v = heads(rng)
    mask = rng.random((40, 70)) < 0.6
    for causal in (False, True, "bottom_right"):
        y = ag.laplace_radon_attention(*ag.tilt_radius(q), k, v, mask=mask, causal=causal)
        assert rel_err(y, ag.softmax_attention(q, k, v, mask=mask, causal=causal)) <= 1e-14


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_real_tau(rng, dtype):
    q, k, v = heads(rng, dtype=dtype)
    u, tau = ag.tilt_radius(q)
    Z, N = ag.laplace_radon_transform(u, tau, k, v)
    Z_r, N_r = ref.transform(u, tau, k, v)
    assert Z.dtype == dtype and N.dtype == dtype
    assert rel_err(Z, Z_r) < TOL[dtype] * 10 and rel_err(N, N_r) < TOL[dtype] * 10
    Z_only, none = ag.laplace_radon_transform(u, tau, k)
    assert none is None and rel_err(Z_only, Z_r) < TOL[dtype] * 10
    # y = N / Z (eq. 14) and the log domain agrees
    log_Z, y = ag.laplace_radon_transform(u, tau, k, v, log_domain=True)
    assert rel_err(log_Z, np.log(Z_r)) < TOL[dtype] * 10
    assert rel_err(y, ag.softmax_attention(q, k, v)) < TOL[dtype] * 10


def test_transform_log_domain_never_overflows(rng):
    q, k, v = heads(rng, (), 10, 50, 4, 3)
    u, tau = ag.tilt_radius(q)
    tau_big = tau * 1e4  # exp(tau s) overflows float64: Z is refused, log Z is not
    with pytest.raises(ValueError, match="beyond the float range.*log_domain=True"):
        ag.laplace_radon_transform(u, tau_big, k, v)
    log_Z, y = ag.laplace_radon_transform(u, tau_big, k, v, log_domain=True)
    s = u @ k.T
    expected = tau_big * s.max(-1) + np.log(np.exp(tau_big[:, None] * (s - s.max(-1, keepdims=True))).sum(-1))
    assert np.all(np.isfinite(log_Z)) and rel_err(log_Z, expected) < 1e-14
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_complex_tau(rng, dtype):
    q, k, v = heads(rng, (3,), 20, 60, 8, 5, dtype)
    u, tau = ag.tilt_radius(q)
    ctype = np.complex64 if dtype == np.float32 else np.complex128
    for t in (1j * tau * 3, tau * (0.5 + 2j), (1j * np.linspace(-20, 20, 20)).astype(ctype)):
        Z, N = ag.laplace_radon_transform(u, t, k, v)
        Z_r, N_r = ref.transform(u, t, k, v)
        assert Z.dtype == ctype and N.dtype == ctype
        assert rel_err(Z, Z_r) < TOL[dtype] * 10 and rel_err(N, N_r) < TOL[dtype] * 10
        log_Z, y = ag.laplace_radon_transform(u, t, k, v, log_domain=True)
        assert rel_err(np.exp(log_Z), Z_r) < TOL[dtype] * 10
    # imaginary tau: the characteristic function of the projected measure, |Z| <= n_k, Z(0) = n_k
    Z, _ = ag.laplace_radon_transform(u, 1j * tau * 50, k)
    assert np.all(np.abs(Z) <= 60 * (1 + 1e-6))
    Z0, _ = ag.laplace_radon_transform(u, np.zeros_like(tau) + 0j, k)
    np.testing.assert_allclose(Z0, 60, rtol=TOL[dtype])
    with pytest.raises(ValueError, match="complex tau is supported for kernel='exp' only"):
        ag.laplace_radon_transform(u, 1j * tau, k, kernel="cauchy")


@pytest.mark.parametrize("kernel,params", [("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.3})])
def test_generalized_transform(rng, kernel, params):
    q, k, v = heads(rng, (2,), 15, 40, 6, 3)
    u, tau = ag.tilt_radius(q)
    Z, N = ag.laplace_radon_transform(u, tau, k, v, kernel=kernel, **params)
    w = np.exp(ref.log_psi(kernel, tau[..., None], u @ np.swapaxes(k, -1, -2), **params))
    assert rel_err(Z, w.sum(-1)) < 1e-13 and rel_err(N, w @ v) < 1e-13
    y = ag.laplace_radon_attention(u, tau, k, v, kernel=kernel, **params)
    assert rel_err(y, N / Z[..., None]) < 1e-13
    assert rel_err(y, ag.kernel_attention(q, k, v, kernel=kernel, **params)) < 1e-14


@pytest.mark.parametrize("kernel,params", [("exp", {}), ("gaussian", {"sigma": 0.5}), ("cauchy", {"gamma": 2.0})])
def test_projected_cumulants_reference(rng, kernel, params):
    q, k, _ = heads(rng, (2,), 30, 90, 8, 1)
    q *= 3
    u, tau = ag.tilt_radius(q)
    for order in (1, 2, 3, 4):
        c = ag.projected_cumulants(u, tau, k, order, kernel=kernel, **params)
        c_r = ref.cumulants(u, tau, k, order, kernel, **params)
        assert c.shape == (2, 30, order)
        assert np.max(np.abs(c - c_r)) < 1e-12 * max(1, np.abs(c_r).max())


def test_cumulants_are_derivatives_of_log_Z(rng):
    """eq. 51: d/dtau log Z = E[S], d2/dtau2 log Z = Var(S); checked by high-order central
    differences of the independently computed log Z."""
    q, k, _ = heads(rng, (), 12, 50, 6, 1)
    u, tau = ag.tilt_radius(q)
    c = ag.projected_cumulants(u, tau, k, 4)
    h = 1e-2
    logZ = lambda t: ag.laplace_radon_transform(u, t, k, log_domain=True).log_Z
    f = {m: logZ(tau + m * h) for m in (-3, -2, -1, 0, 1, 2, 3)}
    d1 = (-f[-3] + 9 * f[-2] - 45 * f[-1] + 45 * f[1] - 9 * f[2] + f[3]) / (60 * h)
    d2 = (2 * f[-3] - 27 * f[-2] + 270 * f[-1] - 490 * f[0] + 270 * f[1] - 27 * f[2] + 2 * f[3]) / (180 * h * h)
    assert np.max(np.abs(d1 - c[..., 0])) < 1e-9
    assert np.max(np.abs(d2 - c[..., 1])) < 1e-6
    assert np.all(c[..., 1] >= 0)


def test_cumulants_no_cancellation(rng):
    # keys with a large common offset along u: Var(S) tiny relative to E[S]^2
    k = 1e6 + rng.standard_normal((100, 1)) * 1e-3
    u = np.ones((3, 1))
    tau = np.array([0.0, 1.0, 100.0])
    c = ag.projected_cumulants(u, tau, k, 2)
    c_r = ref.cumulants(u, tau, k, 2)
    assert rel_err(c[:, 1], c_r[:, 1]) < 1e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_log_partition_gradient_and_hessian(rng, dtype):
    q, k, _ = heads(rng, (2,), 9, 40, 5, 1, dtype)
    g, H = ag.log_partition_gradient(q, k, hessian=True)
    _, P, _ = ref.softmax_attention(q, k, k)
    kk = k.astype(np.float64)
    mean = P @ kk
    s = 1 / math.sqrt(5)
    cov = np.einsum("bqi,bid,bie->bqde", P, kk, kk) - np.einsum("bqd,bqe->bqde", mean, mean)
    assert g.dtype == dtype and H.dtype == dtype and H.shape == (2, 9, 5, 5)
    assert rel_err(g, s * mean) < TOL[dtype] * 10
    assert rel_err(H, s * s * cov) < TOL[dtype] * 100
    if dtype == np.float64:  # gradient of log Z by central differences
        eps = 1e-6
        logZ = lambda qq: ag.softmax_attention(qq, k, k, return_log_partition=True)[1]
        num = np.stack([(logZ(q + eps * e) - logZ(q - eps * e)) / (2 * eps) for e in np.eye(5)], -1)
        assert np.max(np.abs(num - g)) < 1e-8
        assert np.allclose(H, np.swapaxes(H, -1, -2), atol=1e-15)
        assert np.all(np.linalg.eigvalsh(H) > -1e-14)


def test_bad_inputs(rng):
    q, k, v = heads(rng, (2,), 5, 6, 3, 4)
    u, tau = ag.tilt_radius(q)
    with pytest.raises(ValueError, match=r"tau must have shape \(\.\.\., n_q\) with n_q = 5"):
        ag.laplace_radon_attention(u, tau[:, :3], k, v)
    with pytest.raises(ValueError, match="tau contains NaN"):
        ag.laplace_radon_attention(u, np.full_like(tau, np.nan), k, v)
    with pytest.raises(TypeError, match="tau must be real"):
        ag.laplace_radon_attention(u, tau + 1j, k, v)
    with pytest.raises(ValueError, match="tau contains NaN"):
        ag.laplace_radon_transform(u, tau + 1j * np.inf, k, v)
    with pytest.raises(ValueError, match="order must be an integer in 1..4"):
        ag.projected_cumulants(u, tau, k, 5)
    with pytest.raises(ValueError, match="kernel must be one of"):
        ag.laplace_radon_transform(u, tau, k, kernel="box")
    with pytest.raises(ValueError, match=r"k must have shape .*d_k = 3"):
        ag.log_partition_gradient(q, k[..., :2])
    with pytest.raises(ValueError, match="q must be non-empty"):
        ag.tilt_radius(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.tilt_radius(np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        ag.laplace_radon_transform(u, tau, np.concatenate([k, k, k]))


@pytest.mark.parametrize("a", [1e15, 1e19, 1e20, 1e100])
def test_complex_tau_with_a_large_real_part(a):
    """log Z at tau = a + i w equals the real-tau log Z for w = 0, however large a: the top term
    is exactly exp(0) (the exponent a s - a s_top, fused into one FMA, was off by the rounding
    of a s: log Z = -inf at a = 1e20)."""
    u, k = np.array([[0.6, 0.8]]), np.array([[0.3, 0.7], [-0.2, 0.1]])
    real = ag.laplace_radon_transform(u, np.array([a]), k, log_domain=True).log_Z
    cplx = ag.laplace_radon_transform(u, np.array([a + 0j]), k, log_domain=True).log_Z
    assert np.isfinite(real[0]) and abs(cplx[0] - real[0]) <= 1e-15 * abs(real[0])
