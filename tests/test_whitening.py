"""Whitened self-attention ("Whitened Self-Attention" s.3-6): the recursion, the scan, the
covariance models, WSA, and the whiteness and stationarity measures."""
import math

import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag
import reference as ref


def stable_filter(rng, D, lower=True):
    L = np.tril(rng.standard_normal((D, D))) + 3 * np.eye(D)
    if not lower:
        L = L + 0.5 * np.triu(rng.standard_normal((D, D)), 1)
    M = 0.5 * rng.standard_normal((D, D))
    A = -np.linalg.solve(L, M)
    M *= 0.8 / max(1.0, np.max(np.abs(np.linalg.eigvals(A))))  # spectral radius of A below 1
    return L, M


@pytest.mark.parametrize("lower", [True, False])
def test_whiten_equals_block_bidiagonal_solve(rng, lower):
    B, T, D = 5, 40, 4
    x = rng.standard_normal((B, T, D))
    L, M = stable_filter(rng, D, lower)
    w = ag.whiten(x, L, M)
    want = ref.block_bidiagonal_solve(x, np.broadcast_to(L, (T, D, D)), np.broadcast_to(M, (T, D, D)))
    assert rel_err(w, want) <= 1e-12
    # time-varying blocks
    Ls = np.tril(rng.standard_normal((T, D, D))) + 3 * np.eye(D)
    Ms = 0.3 * rng.standard_normal((T, D, D))
    assert rel_err(ag.whiten(x, Ls, Ms), ref.block_bidiagonal_solve(x, Ls, Ms)) <= 1e-12
    # leading axes, float32, non-contiguous input
    xs = rng.standard_normal((2, 3, T, D))
    assert rel_err(ag.whiten(xs, L, M), ag.whiten(xs.reshape(6, T, D), L, M).reshape(xs.shape)) <= 1e-15
    w32 = ag.whiten(x.astype(np.float32), L, M)
    assert w32.dtype == np.float32 and rel_err(w32, w) <= 1e-5
    assert rel_err(ag.whiten(np.asfortranarray(x), L, M), w) <= 1e-15


@pytest.mark.parametrize("block", [1, 3, 16, 40, 100])
def test_scan_equals_recursion(rng, block):
    B, T, D = 3, 40, 5
    x = rng.standard_normal((B, T, D))
    L, M = stable_filter(rng, D)
    assert rel_err(ag.whiten_scan(x, L, M, block=block), ag.whiten(x, L, M)) <= 1e-10


def test_threads_agree(rng):
    x = rng.standard_normal((7, 50, 6))
    L, M = stable_filter(rng, 6)
    old = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.whiten(x, L, M), ag.whiten_scan(x, L, M, block=8)
        ag.set_num_threads(2)
        two = ag.whiten(x, L, M), ag.whiten_scan(x, L, M, block=8)
    finally:
        ag.set_num_threads(old)
    assert rel_err(one[0], two[0]) <= 1e-12 and rel_err(one[1], two[1]) <= 1e-12


def test_block_cholesky_and_steady_state(rng):
    D = 3
    Theta = 0.6 * rng.standard_normal((D, D))
    lam0, lam1 = np.eye(D) + Theta @ Theta.T, Theta  # MA(1): exactly block-tridiagonal
    Ls, Ms = ag.block_cholesky_factors(lam0, lam1, 30)
    T = 30
    full = np.zeros((T * D, T * D))
    for i in range(T):
        full[i * D:(i + 1) * D, i * D:(i + 1) * D] = lam0
        if i:
            full[i * D:(i + 1) * D, (i - 1) * D:i * D] = lam1
            full[(i - 1) * D:i * D, i * D:(i + 1) * D] = lam1.T
    chol = np.linalg.cholesky(full)
    for i in range(T):
        assert rel_err(Ls[i], chol[i * D:(i + 1) * D, i * D:(i + 1) * D]) <= 1e-12
        if i:
            assert rel_err(Ms[i], chol[i * D:(i + 1) * D, (i - 1) * D:i * D]) <= 1e-12
    ss = ag.steady_state_factor(lam0, lam1)
    assert ss.converged and ss.change <= 1e-12 and ss.iterations > 1
    # the steady state is a fixed point: L L^T + M M^T = Lambda_0, M L^T = Lambda_1
    assert rel_err(ss.L @ ss.L.T + ss.M @ ss.M.T, lam0) <= 1e-12
    assert rel_err(ss.M @ ss.L.T, lam1) <= 1e-12
    far = ag.block_cholesky_factors(lam0, lam1, ss.iterations + 1)[0][-1]
    assert rel_err(far, ss.L) <= 1e-10  # the time-varying blocks converge to the steady state
    L0, M0 = ag.block_diagonal_factor(lam0)
    assert rel_err(L0 @ L0.T, lam0) <= 1e-14 and np.all(M0 == 0)


def test_ma1_chain_reaches_white_noise(rng):
    B, T, D = 2000, 12, 3
    Theta = 0.6 * np.linalg.qr(rng.standard_normal((D, D)))[0]  # invertible MA(1), away from the boundary
    x = ag.vector_ma1(Theta, B, T, seed=1)
    lam0, lam1 = ag.block_covariances(x)
    lam0_true = np.eye(D) + Theta @ Theta.T
    noise = 5 * np.abs(lam0_true).max() / math.sqrt(B * T)  # five standard errors of a sample covariance
    assert np.max(np.abs(lam1 - Theta)) < noise and np.max(np.abs(lam0 - lam0_true)) < noise
    Ls, Ms = ag.block_cholesky_factors(lam0, lam1, T)
    psi_x = ag.whiteness(x)
    psi_w = ag.whiteness(ag.whiten(x, Ls, Ms))
    psi_white = np.mean([ag.whiteness(np.random.default_rng(s).standard_normal((B, T, D))) for s in range(3)])
    assert psi_x == pytest.approx(ref.whiteness(x), rel=1e-12, abs=0)
    assert psi_w < 1.2 * psi_white < psi_x  # down to the white-noise level of this B, T, D
    ss = ag.steady_state_factor(lam0, lam1)
    psi_ss = ag.whiteness(ag.whiten(x, ss.L, ss.M))
    assert psi_w < psi_ss < psi_x  # the steady-state filter whitens less (the transient)


def test_ar1_strong_correlation_is_detected(rng):
    D, B, T = 3, 1000, 10
    Q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    weak = ag.vector_ar1(0.3 * Q, B, T, seed=2)
    lam0, lam1 = ag.block_covariances(weak)
    Ls, Ms = ag.block_cholesky_factors(lam0, lam1, T)
    assert ag.whiteness(ag.whiten(weak, Ls, Ms)) < ag.whiteness(weak)
    strong = ag.vector_ar1(0.9 * Q, B, T, seed=2)
    with pytest.raises(ValueError, match="not positive definite"):
        ag.steady_state_factor(*ag.block_covariances(strong))
    with pytest.raises(ValueError, match="not positive definite"):
        ag.block_cholesky_factors(*ag.block_covariances(strong), T)


def test_non_stationary_shows_in_rho(rng):
    D, B, T = 3, 2000, 12
    Theta = 0.6 * rng.standard_normal((D, D))
    stationary = ag.vector_ma1(Theta, B, T, seed=3)
    drifting = ag.vector_ma1(np.linspace(0.0, 2.0, T)[:, None, None] * Theta, B, T, seed=3)
    assert ag.stationarity(drifting) > 3 * ag.stationarity(stationary)

    def whitened_psi(x):
        Ls, Ms = ag.block_cholesky_factors(*ag.block_covariances(x), T)
        return ag.whiteness(ag.whiten(x, Ls, Ms)) / ag.whiteness(x)

    assert whitened_psi(drifting) > whitened_psi(stationary)


def test_full_whitening_and_measures(rng):
    B, T, D = 400, 3, 4
    x = ag.vector_ma1(0.5 * rng.standard_normal((D, D)), B, T, seed=4)
    w = ag.full_whitening(x)
    cov = np.cov(w.reshape(B, T * D), rowvar=False)
    np.testing.assert_allclose(cov, np.eye(T * D), atol=1e-10)
    assert ag.whiteness(w) < 1e-10
    # stationarity by its definition (eq. 13-14)
    c = x - x.mean(0)
    lags = np.stack([c[:, t].T @ c[:, t + 1] / (B - 1) for t in range(T - 1)])
    assert ag.stationarity(x) == pytest.approx(np.sum(np.linalg.norm(lags - lags.mean(0), axis=(1, 2))), rel=1e-12, abs=0)
    with pytest.raises(ValueError, match="more sequences"):
        ag.full_whitening(x[:10])


def test_whitened_attention(rng):
    B, T, D, d_k = 2, 9, 4, 3
    x = rng.standard_normal((B, T, D))
    L, M = stable_filter(rng, D)
    W_Q, W_K = rng.standard_normal((2, D, d_k))
    y, P = ag.whitened_attention(x, W_Q, W_K, L, M, return_routing=True)
    w = ag.whiten(x, L, M)
    logits = (w @ W_Q) @ np.swapaxes(w @ W_K, -1, -2) / math.sqrt(d_k)
    logits = np.where(np.tri(T, dtype=bool), logits, -np.inf)
    Pref = np.exp(logits - logits.max(-1, keepdims=True))
    Pref /= Pref.sum(-1, keepdims=True)
    assert rel_err(P, Pref) <= 1e-13 and rel_err(y, Pref @ w) <= 1e-13
    with pytest.raises(ValueError, match="W_K"):
        ag.whitened_attention(x, W_Q, W_K[:, :2], L, M)


def test_bad_input(rng):
    x = rng.standard_normal((2, 5, 3))
    L, M = stable_filter(rng, 3)
    with pytest.raises(ValueError, match="condition number"):
        ag.whiten(x, np.diag([1.0, 1.0, 0.0]), M)
    with pytest.raises(ValueError, match="L must have shape"):
        ag.whiten(x, np.eye(4), M)
    with pytest.raises(ValueError, match="M must have"):
        ag.whiten(x, L, np.eye(2))
    with pytest.raises(ValueError, match="x contains NaN"):
        ag.whiten(np.full_like(x, np.nan), L, M)
    with pytest.raises(ValueError, match="block"):
        ag.whiten_scan(x, L, M, block=0)
    with pytest.raises(ValueError, match="one \\(D, D\\) pair"):
        ag.whiten_scan(x, np.broadcast_to(L, (5, 3, 3)), np.broadcast_to(M, (5, 3, 3)))
    with pytest.raises(ValueError, match="Lambda0 is not positive definite"):
        ag.steady_state_factor(-np.eye(3), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="symmetric"):
        ag.steady_state_factor(np.triu(np.ones((3, 3))), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="at least 2 sequences"):
        ag.whiteness(x[:1])
    with pytest.raises(ValueError, match="Theta"):
        ag.vector_ma1(np.eye(3)[:2], 4, 5)


@pytest.mark.parametrize("varying", [False, True])
@pytest.mark.parametrize("burn_in", [0, 7])
def test_vector_ar1_equals_step_by_step(rng, varying, burn_in):
    """The kernel-driven AR(1) equals the step-by-step simulation with the same draws."""
    D, T = 3, 11
    Phi = 0.4 * rng.standard_normal((T, D, D) if varying else (D, D))
    x = ag.vector_ar1(Phi, 4, T, seed=5, burn_in=burn_in)
    assert x.shape == (4, T, D)
    assert rel_err(x, ref.vector_ar1_steps(Phi, 4, T, 5, burn_in)) <= 1e-14


def test_condition_check_is_a_lower_bound_of_kappa_2(rng):
    # The filter's singularity check uses kappa_1 / D <= kappa_2 (the core's condition_bound,
    # in double precision on the calling thread): it never refuses an L that the exact 2-norm
    # check accepts, and it refuses one that is singular to working precision. The bound is
    # compared with kappa_1 and kappa_2 only where those are meaningful (kappa_2 well below
    # 1 / eps); for a matrix singular to working precision the computed kappa_2 is rounding
    # noise that depends on the BLAS kernels (OpenBLAS's Haswell kernels gave 6.4e16 where
    # others gave 1.7e17 for one such L), so there only the refusal is checked.
    from attngeom import _core

    eps = np.finfo(float).eps

    def kappa1(L):
        return max(np.abs(a).sum(0).max() * np.abs(np.linalg.inv(a)).sum(0).max() / a.shape[-1]
                   for a in L.reshape(-1, *L.shape[-2:]))

    checked = refused = 0
    for D in (2, 7, 64):
        for scale in (1e-3, 1.0, 1e3):
            L = np.tril(rng.standard_normal((D, D)) * scale) + np.eye(D)
            full = L + np.triu(rng.standard_normal((D, D)) * scale, 1)
            for a, lower in ((L, True), (full, False), (np.stack([L, 2 * L, L.T @ L]), False)):
                bound = _core.condition_bound(np.ascontiguousarray(a), lower)
                kappa2 = max(np.linalg.cond(m, 2) for m in a.reshape(-1, D, D))
                if kappa2 * eps > 10:  # singular to working precision, by any rounding
                    assert bound * eps > 0.1  # the filter refuses it
                    with pytest.raises(ValueError, match="singular to working precision"):
                        ag.whiten(np.zeros((1, 2, D)), a if a.ndim == 2 else a[-1], np.zeros((D, D)))
                    refused += 1
                    continue
                if kappa2 * eps > 1e-6:
                    continue  # neither well conditioned nor surely singular
                exact = kappa1(a)
                # two inverses of a matrix with condition kappa agree to about kappa * eps
                assert abs(bound - exact) <= (1e-12 + 1e3 * exact * eps) * exact
                assert bound <= kappa2 * (1 + 1e-12)
                checked += 1
            L32 = L.astype(np.float32)  # its bound: that of the float32 entries, in double precision
            exact = kappa1(L32.astype(np.float64))
            if exact * eps < 1e-6:
                assert abs(_core.condition_bound(L32, True) - exact) <= (1e-12 + 1e3 * exact * eps) * exact
    assert checked >= 20 and refused >= 2  # both regimes are exercised
    L = np.eye(5)
    L[4, 4] = 1e-9
    assert _core.condition_bound(L, True) >= 1e9 / 5 * (1 - 1e-12)
    L0 = L.copy()
    L0[4, 4] = 0.0
    assert _core.condition_bound(L0, True) == np.inf and _core.condition_bound(L0, False) == np.inf
    with pytest.raises(ValueError, match="condition number at least"):
        ag.whiten(rng.standard_normal((2, 5, 5)).astype(np.float32), L, np.zeros((5, 5)))


@pytest.mark.parametrize("size", [1e-300, 1e-200, 1e160, 1e300])
def test_whiteness_and_full_whitening_do_not_depend_on_scale(rng, size):
    """Psi is a ratio and W = Lambda^(-1/2) (x - mu) is dimensionless: the same at any size of
    x (Psi read 0 at 1e-200 and overflowed at 1e160; full whitening called a 1e-300 batch
    singular and failed to converge at 1e160)."""
    x = rng.standard_normal((40, 3, 2))
    assert abs(ag.whiteness(x * size) - ag.whiteness(x)) <= 1e-13
    assert np.max(np.abs(ag.full_whitening(x * size) - ag.full_whitening(x))) <= 1e-12
