"""Spectral diagnostics: null spaces, subspaces, factored SVDs, effective ranks, tilt
coverage, routing nulls and the gauge symmetry (Laplace-Radon s.5-6, s.9.4, s.12, app. B)."""
import math

import numpy as np
import pytest
import scipy.linalg as sl
from conftest import rel_err

import attngeom as ag
import reference as ref


def low_rank(rng, m, n, r, batch=()):
    return rng.standard_normal(batch + (m, r)) @ rng.standard_normal(batch + (r, n))


def angle(a_cols, sub):
    """Largest principal angle between a column basis and a Subspace (scipy's definition)."""
    if a_cols.shape[1] != sub.dim:
        return math.pi / 2
    if sub.dim == 0:
        return 0.0
    return float(np.max(sl.subspace_angles(a_cols, sub.basis())))


# -- null_space ----------------------------------------------------------------------------
@pytest.mark.parametrize("m,n,r", [(40, 30, 7), (10, 30, 4), (30, 30, 29), (30, 10, 10), (12, 50, 12), (50, 8, 3)])
def test_null_space_matches_scipy(rng, m, n, r):
    M = low_rank(rng, m, n, r)
    null, s = ag.null_space(M)
    expected = sl.null_space(M)
    assert isinstance(null, ag.Subspace) and null.ambient_dim == n
    assert null.dim == expected.shape[1] == n - r
    assert np.linalg.matrix_rank(M) == n - null.dim
    assert angle(expected, null) <= 1e-10
    np.testing.assert_allclose(s, np.linalg.svd(M, compute_uv=False), rtol=1e-12, atol=1e-12 * s[0])
    basis = null.basis()
    assert basis.shape == (n, n - r)
    np.testing.assert_allclose(basis.T @ basis, np.eye(n - r), atol=1e-13)
    assert np.all(np.abs(M @ basis) <= 1e-12 * s[0])
    # the stored side is the smaller one
    assert null.stores_complement == (null.dim > n - null.dim)


def test_null_space_batched_different_nullities(rng):
    Ms = np.stack([low_rank(rng, 20, 16, r) for r in (2, 9, 16)]).reshape(3, 1, 20, 16)
    null, s = ag.null_space(Ms)
    assert null.shape == (3, 1) and null.dtype == object and s.shape == (3, 1, 16)
    for i, r in enumerate((2, 9, 16)):
        assert null[i, 0].dim == 16 - r
        expected, rank = ref.null_space(Ms[i, 0])
        assert rank == r and angle(expected, null[i, 0]) <= 1e-10


def test_null_space_rtol_and_float32(rng):
    M = np.diag([1.0, 1e-3, 1e-9, 0.0])
    assert ag.null_space(M)[0].dim == 1
    assert ag.null_space(M, rtol=1e-6)[0].dim == 2
    assert ag.null_space(M, rtol=1e-2)[0].dim == 3
    assert ag.null_space(M, rtol=0)[0].dim == 1  # only the exact zero
    M32 = low_rank(rng, 30, 20, 6).astype(np.float32)
    null, s = ag.null_space(M32)
    assert s.dtype == np.float32 and null.dtype == np.float32 and null.dim == 14
    expected = sl.null_space(M32.astype(np.float64), rcond=30 * np.finfo(np.float32).eps)
    assert angle(expected, null) <= 1e-4


def test_null_space_zero_and_full_rank(rng):
    null, s = ag.null_space(np.zeros((3, 5)))
    assert null.dim == 5 and np.all(s == 0)
    null, _ = ag.null_space(rng.standard_normal((6, 4)))
    assert null.dim == 0 and null.basis().shape == (4, 0)


def test_null_space_non_contiguous(rng):
    M = low_rank(rng, 30, 24, 5)
    view = np.asfortranarray(M)[:, ::1]
    assert angle(sl.null_space(M), ag.null_space(view)[0]) <= 1e-10
    assert ag.null_space(M.T.copy().T)[0].dim == 19


# -- Subspace ------------------------------------------------------------------------------
def test_subspace_representations_agree(rng):
    n = 20
    for k in (0, 1, 3, 10, 15, 20):
        vecs = rng.standard_normal((k, n))
        s = ag.Subspace.span(vecs)
        assert s.dim == k and s.ambient_dim == n
        assert s.stores_complement == (k > n - k)
        c = s.complement()
        assert c.dim == n - k and c.stores_complement != s.stores_complement
        b, cb = s.basis(), c.basis()
        assert b.shape == (n, k) and cb.shape == (n, n - k)
        np.testing.assert_allclose(np.hstack([b, cb]).T @ np.hstack([b, cb]), np.eye(n), atol=1e-13)
        x = rng.standard_normal((4, 2, n))
        np.testing.assert_allclose(s.project(x) + c.project(x), x, atol=1e-13)
        np.testing.assert_allclose(s.project(s.project(x)), s.project(x), atol=1e-13)
        np.testing.assert_allclose(s.project(x), x @ b @ b.T, atol=1e-13)
        if k:
            assert np.all(s.contains(vecs)) and np.all(s.contains(s.project(x)))
        if 0 < k < n:
            assert not np.any(s.contains(c.project(x)))


def test_subspace_contains_tolerances():
    s = ag.Subspace.span([[1.0, 0.0, 0.0]])
    assert s.contains([1.0, 1e-15, 0.0])
    assert not s.contains([1.0, 1e-6, 0.0])
    assert s.contains([1.0, 1e-6, 0.0], atol=1e-5)
    assert s.contains([1.0, 1e-6, 0.0], rtol=1e-5)
    assert s.residual([[3.0, 4.0, 0.0]])[0] == pytest.approx(4.0)


def known_angles(rng, n, k1, k2, theta):
    """Subspaces of R^n with principal angles theta (len min(k1, k2)), randomly rotated."""
    m = len(theta)
    a = np.eye(n)[:, :k1]
    b = np.zeros((n, k2))
    b[np.arange(m), np.arange(m)] = np.cos(theta)
    b[k1 + np.arange(m), np.arange(m)] = np.sin(theta)
    b[k1 + m + np.arange(k2 - m), m + np.arange(k2 - m)] = 1  # further directions orthogonal to a
    rot = np.linalg.qr(rng.standard_normal((n, n)))[0]
    return ag.Subspace((rot @ a)), ag.Subspace((rot @ b))


@pytest.mark.parametrize("k1,k2", [(3, 3), (2, 5), (5, 2), (8, 8), (9, 7)])
def test_principal_angles_known(rng, k1, k2):
    n = 30
    theta = np.sort(np.r_[1e-9, 3e-6, 0.3, 1.2, np.pi / 2, 0.7, 1e-12, 0.05, 1.0][: min(k1, k2)])[::-1]
    a, b = known_angles(rng, n, k1, k2, theta)
    assert a.stores_complement == (k1 > n - k1)
    got = a.principal_angles(b)
    assert got.shape == (min(k1, k2),)
    # small angles to ~1e-16 absolute (arcsin branch), all to 1e-14
    np.testing.assert_allclose(got, theta, rtol=1e-6, atol=1e-14)
    np.testing.assert_allclose(b.principal_angles(a), theta, rtol=1e-6, atol=1e-14)
    # agrees with scipy where scipy is accurate (angles away from 0)
    big = theta > 1e-3
    np.testing.assert_allclose(got[big], sl.subspace_angles(a.basis(), b.basis())[big], atol=1e-12)
    assert a.distance(b) == (pytest.approx(theta.max(), abs=1e-14) if k1 == k2 else math.pi / 2)


def test_principal_angles_between_complements(rng):
    n, k = 60, 4
    a = ag.Subspace.span(rng.standard_normal((k, n))).complement()
    b = ag.Subspace.span(a.complement_basis().T + 1e-6 * rng.standard_normal((k, n))).complement()
    assert a.stores_complement and b.stores_complement and a.dim == b.dim == n - k
    fast = a.principal_angles(b)
    dense = sl.subspace_angles(a.basis(), b.basis())
    assert fast.shape == (n - k,)
    np.testing.assert_allclose(np.sort(fast), np.sort(dense), atol=1e-12)
    assert 1e-7 < fast.max() < 1e-5


def test_subspace_errors():
    s = ag.Subspace.span(np.eye(4)[:2])
    with pytest.raises(ValueError, match="x"):
        s.project(np.ones(3))
    with pytest.raises(ValueError, match="x"):
        s.contains([np.nan, 0, 0, 0])
    with pytest.raises(TypeError, match="other"):
        s.principal_angles(np.eye(4))
    with pytest.raises(ValueError, match="R\\^3"):
        s.principal_angles(ag.Subspace.span(np.eye(3)))
    with pytest.raises(ValueError, match="vectors"):
        ag.Subspace.span(np.ones(4))
    with pytest.raises(ValueError, match="rtol"):
        ag.Subspace.span(np.eye(4), rtol=-1)
    with pytest.raises(ValueError, match="atol"):
        s.contains(np.ones(4), atol=-1)


# -- factored SVD --------------------------------------------------------------------------
@pytest.mark.parametrize("m,r,p", [(96, 8, 80), (40, 40, 40), (5, 30, 7), (64, 12, 3), (1, 4, 9)])
def test_factored_svd(rng, m, r, p):
    A = rng.standard_normal((3, m, r))
    B = rng.standard_normal((3, r, p))
    U, S, Vh = ag.factored_svd(A, B)
    k = min(m, r, p)
    assert U.shape == (3, m, k) and S.shape == (3, k) and Vh.shape == (3, k, p)
    AB = A @ B
    assert rel_err((U * S[:, None, :]) @ Vh, AB) <= 1e-12
    dense = np.linalg.svd(AB, compute_uv=False)[:, :k]
    assert rel_err(S, dense) <= 1e-12
    assert np.all(np.diff(S, axis=-1) <= 0)
    np.testing.assert_allclose(np.swapaxes(U, -1, -2) @ U, np.broadcast_to(np.eye(k), (3, k, k)), atol=1e-12)
    np.testing.assert_allclose(Vh @ np.swapaxes(Vh, -1, -2), np.broadcast_to(np.eye(k), (3, k, k)), atol=1e-12)


def test_factored_svd_broadcast_rank_deficient_float32(rng):
    A = low_rank(rng, 50, 10, 3)  # rank 3
    B = rng.standard_normal((4, 1, 10, 60))
    U, S, Vh = ag.factored_svd(A, B)
    assert S.shape == (4, 1, 10)
    assert np.all(S[..., 3:] <= 1e-13 * S[..., :1])
    assert rel_err((U * S[..., None, :]) @ Vh, A @ B) <= 1e-12
    U32, S32, Vh32 = ag.factored_svd(A.astype(np.float32), B.astype(np.float32))
    assert S32.dtype == np.float32 and rel_err(S32[..., :3], S[..., :3]) <= 1e-5
    # non-contiguous views
    At = np.asfortranarray(A)
    assert rel_err(ag.factored_svd(At, B[:, 0, :, ::2]).S, ag.factored_svd(A, B[:, 0, :, ::2].copy()).S) <= 1e-14


def test_factored_svd_errors(rng):
    with pytest.raises(ValueError, match="share r"):
        ag.factored_svd(np.ones((4, 3)), np.ones((2, 5)))
    with pytest.raises(ValueError, match="batch"):
        ag.factored_svd(np.ones((2, 4, 3)), np.ones((3, 3, 5)))
    with pytest.raises(ValueError, match="A"):
        ag.factored_svd(np.ones(4), np.ones((4, 2)))
    with pytest.raises(ValueError, match="B contains NaN"):
        ag.factored_svd(np.ones((4, 3)), np.full((3, 2), np.nan))
    with pytest.raises(ValueError, match="A must be non-empty"):
        ag.factored_svd(np.ones((0, 3)), np.ones((3, 2)))
    with pytest.raises(TypeError, match="A"):
        ag.factored_svd(np.array([["a"]]), np.ones((1, 2)))


# -- parameter nulls -----------------------------------------------------------------------
def test_parameter_nulls_refuse_transposed_weights(rng):
    """A (d_head, d_model) pair (a torch Linear's weights, not transposed) is refused, not read
    as d_model = d_head with an empty null space."""
    wq, wk = rng.standard_normal((2, 4, 16))
    with pytest.raises(ValueError, match=r"W_Q must be oriented \(\.\.\., d_model, d_head\).*got \(4, 16\).*pass its "
                                         r"transpose"):
        ag.parameter_nulls(wq, wk)
    assert ag.parameter_nulls(wq.T, wk.T).ker_B.dim == 12
    with pytest.raises(ValueError, match="W_Q must be oriented"):
        ag.gauge_transform(wq, wk, np.eye(16))


def test_parameter_nulls_full_rank(rng):
    d_model, d_k = 48, 12
    W_Q = rng.standard_normal((d_model, d_k))
    W_K = rng.standard_normal((d_model, d_k))
    nulls = ag.parameter_nulls(W_Q, W_K)
    B = W_Q @ W_K.T
    assert nulls.rank == 12 and nulls.rank_WQ == 12 and nulls.rank_WK == 12
    for sub, M in ((nulls.ker_B, B), (nulls.ker_BT, B.T), (nulls.ker_WQ_T, W_Q.T), (nulls.ker_WK_T, W_K.T)):
        assert sub.dim == d_model - d_k and sub.stores_complement
        assert angle(sl.null_space(M), sub) <= 1e-10
    np.testing.assert_allclose(nulls.singular_values, np.linalg.svd(B, compute_uv=False)[:d_k], rtol=1e-12)
    # full-rank factors: ker(B) = ker(W_K^T), ker(B^T) = ker(W_Q^T) (eq. 18-19)
    assert nulls.ker_B.distance(nulls.ker_WK_T) <= 1e-10
    assert nulls.ker_BT.distance(nulls.ker_WQ_T) <= 1e-10
    # a key-side null direction leaves every logit unchanged
    z = nulls.ker_B.basis()[:, 0]
    x = rng.standard_normal((5, d_model))
    np.testing.assert_allclose(x @ B @ (x + 3 * z).T, x @ B @ x.T, atol=1e-12)


def test_parameter_nulls_rank_deficient(rng):
    d_model, d_k = 40, 10
    W_Q = rng.standard_normal((d_model, d_k))
    W_K = rng.standard_normal((d_model, d_k))
    W_K[:, 7] = W_K[:, 0] - 2 * W_K[:, 3]  # two dependent columns
    W_K[:, 9] = 0.5 * W_K[:, 1]
    nulls = ag.parameter_nulls(W_Q, W_K)
    assert nulls.rank_WK == 8 and nulls.ker_WK_T.dim == 32
    assert nulls.rank_WQ == 10 and nulls.ker_WQ_T.dim == 30
    assert nulls.rank == 8 and nulls.ker_B.dim == 32 and nulls.ker_BT.dim == 32
    B = W_Q @ W_K.T
    assert angle(sl.null_space(B), nulls.ker_B) <= 1e-10
    assert angle(sl.null_space(B.T), nulls.ker_BT) <= 1e-10
    # the query-side logit null is coarser than ker(W_Q^T): it contains it
    assert np.all(nulls.ker_BT.contains(nulls.ker_WQ_T.basis().T))


def test_parameter_nulls_stacked(rng):
    W_Q = rng.standard_normal((2, 3, 32, 6))
    W_K = rng.standard_normal((3, 32, 6))  # broadcast over layers
    nulls = ag.parameter_nulls(W_Q, W_K)
    assert nulls.ker_B.shape == (2, 3) and nulls.singular_values.shape == (2, 3, 6) and nulls.rank.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        B = W_Q[idx] @ W_K[idx[1]].T
        assert angle(sl.null_space(B), nulls.ker_B[idx]) <= 1e-10
        assert nulls.rank[idx] == 6


def test_parameter_nulls_errors():
    with pytest.raises(ValueError, match="d_k"):
        ag.parameter_nulls(np.ones((8, 3)), np.ones((8, 4)))
    with pytest.raises(ValueError, match="W_K"):
        ag.parameter_nulls(np.ones((8, 3)), np.ones((7, 3)))
    with pytest.raises(ValueError, match="rtol"):
        ag.parameter_nulls(np.ones((8, 3)), np.ones((8, 3)), rtol=-1e-3)
    with pytest.raises(ValueError, match="W_Q contains NaN"):
        ag.parameter_nulls(np.full((8, 3), np.nan), np.ones((8, 3)))
    with pytest.raises(ValueError, match="W_Q"):
        ag.parameter_nulls(np.ones(8), np.ones((8, 3)))


# -- effective ranks -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["entropy", "energy", "participation"])
def test_effective_rank_known_spectra(rng, kind):
    for k in (1, 4, 17):
        assert ag.effective_rank(np.full(k, 2.5), kind=kind) == pytest.approx(k, rel=1e-14, abs=0)
        assert ag.effective_rank(np.r_[np.ones(k), np.zeros(5)], kind=kind) == pytest.approx(k, rel=1e-14, abs=0)
    assert ag.effective_rank(np.zeros(4), kind=kind) == 0.0
    s = rng.random(9)
    assert ag.effective_rank(s, kind=kind) == pytest.approx(ref.effective_rank(s, kind), rel=1e-13, abs=0)
    # a matrix: its singular values; batched
    M = rng.standard_normal((2, 3, 12, 7))
    got = ag.effective_rank(M, kind=kind)
    assert got.shape == (2, 3)
    sv = np.linalg.svd(M, compute_uv=False)
    np.testing.assert_allclose(got, [[ref.effective_rank(sv[i, j], kind) for j in range(3)] for i in range(2)],
                               rtol=1e-12)
    np.testing.assert_allclose(ag.effective_rank(sv, kind=kind, spectrum=True), got, rtol=1e-12)
    # a diagonal matrix with k equal entries is a flat spectrum
    assert ag.effective_rank(np.diag([3.0, 3.0, 3.0, 0.0]), kind=kind) == pytest.approx(3)


def test_effective_rank_values_by_hand():
    s = np.array([2.0, 1.0])
    p = np.array([2, 1]) / 3
    assert ag.effective_rank(s) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-15, abs=0)
    p2 = np.array([4, 1]) / 5
    assert ag.effective_rank(s, kind="energy") == pytest.approx(math.exp(-(p2 * np.log(p2)).sum()), rel=1e-15, abs=0)
    assert ag.effective_rank(s, kind="participation") == pytest.approx(25 / 17, rel=1e-15, abs=0)
    np.testing.assert_allclose(ag.cumulative_energy(s), [0.8, 1.0], rtol=1e-15)
    np.testing.assert_allclose(ag.cumulative_energy([1.0, 2.0]), [0.8, 1.0], rtol=1e-15)  # sorted first
    np.testing.assert_allclose(ag.cumulative_energy(np.zeros(3)), 0)
    assert ag.cumulative_energy(np.ones((2, 5, 4)), spectrum=True).shape == (2, 5, 4)
    assert ag.cumulative_energy(np.eye(3))[-1] == pytest.approx(1)


def test_effective_rank_errors():
    with pytest.raises(ValueError, match="kind"):
        ag.effective_rank(np.ones(3), kind="shannon")
    with pytest.raises(ValueError, match="x contains NaN"):
        ag.effective_rank([1.0, np.nan])
    with pytest.raises(ValueError, match=">= 0"):
        ag.effective_rank([1.0, -1.0])
    with pytest.raises(ValueError, match="x must be non-empty"):
        ag.effective_rank(np.ones(0))
    with pytest.raises(TypeError, match="x"):
        ag.effective_rank("abc")


# -- tilt coverage -------------------------------------------------------------------------
def test_tilt_coverage_against_reference(rng):
    q = rng.standard_normal((4, 50, 8)) * np.array([3, 2, 1, 1, 0.5, 0.5, 0.2, 0.1])
    q[0, 3] = 0  # a zero query has no tilt: skipped
    cov = ag.tilt_coverage(q)
    assert cov.count == 199
    np.testing.assert_allclose(cov.eigenvalues, ref.tilt_eigenvalues(q), rtol=1e-12, atol=1e-15)
    lam = ref.tilt_eigenvalues(q)
    assert cov.effective_dim == pytest.approx(lam.sum() ** 2 / (lam ** 2).sum(), rel=1e-12, abs=0)
    assert cov.eigenvalues.sum() == pytest.approx(1.0, rel=1e-13, abs=0)  # trace E[uu^T] = E|u|^2 = 1
    assert cov.rank == 8 and cov.null.dim == 0
    centered = ag.tilt_coverage(q, centered=True)
    np.testing.assert_allclose(centered.eigenvalues, np.clip(ref.tilt_eigenvalues(q, True), 0, None),
                               rtol=1e-11, atol=1e-14)


def test_tilt_coverage_limited_angle(rng):
    d_k, d_model = 12, 30
    basis = np.linalg.qr(rng.standard_normal((d_k, 5)))[0]
    q = rng.standard_normal((300, 5)) @ basis.T  # tilts in a 5-dimensional subspace
    W_K = rng.standard_normal((d_model, d_k))
    cov = ag.tilt_coverage(q, W_K=W_K)
    assert cov.rank == 5 and cov.null.dim == 7
    assert angle(sl.null_space(basis.T), cov.null) <= 1e-10
    assert np.all(cov.eigenvalues[5:] <= 1e-15)
    # token space: n = W_K u spans W_K span(U), a 5-dim subspace of R^d_model
    assert cov.token_rank == 5 and cov.token_null.dim == d_model - 5
    assert angle(sl.null_space((W_K @ basis).T), cov.token_null) <= 1e-10
    u = q / np.linalg.norm(q, axis=1, keepdims=True)
    n = u @ W_K.T
    lam_n = np.linalg.eigvalsh(n.T @ n / len(n))[::-1][: cov.token_eigenvalues.size]
    np.testing.assert_allclose(cov.token_eigenvalues, lam_n, rtol=1e-10, atol=1e-12 * lam_n[0])
    assert cov.effective_dim_token == pytest.approx(lam_n.sum() ** 2 / (lam_n ** 2).sum(), rel=1e-10, abs=0)


def test_tilt_coverage_streaming_merge(rng):
    q = rng.standard_normal((1000, 16)) * np.linspace(2, 0.1, 16)
    W_K = rng.standard_normal((40, 16))
    whole = ag.tilt_coverage(q, W_K=W_K)
    a = ag.TiltCoverage(16)
    for chunk in np.array_split(q[:500], 7):
        a.update(chunk)
    b = ag.TiltCoverage(16).update(q[500:])
    merged = a.merge(b).result(W_K=W_K)
    assert merged.count == whole.count == 1000
    assert rel_err(merged.eigenvalues, whole.eigenvalues) <= 1e-12
    assert rel_err(merged.token_eigenvalues, whole.token_eigenvalues) <= 1e-12
    assert merged.effective_dim == pytest.approx(whole.effective_dim, rel=1e-12, abs=0)
    assert merged.effective_dim_token == pytest.approx(whole.effective_dim_token, rel=1e-12, abs=0)
    np.testing.assert_allclose(a.gram, ref_gram(q), rtol=1e-12, atol=1e-12)


def ref_gram(q):
    u = q / np.linalg.norm(q, axis=1, keepdims=True)
    return u.T @ u


def test_tilt_coverage_errors(rng):
    with pytest.raises(ValueError, match="u must have shape"):
        ag.TiltCoverage(4).update(np.ones((3, 5)))
    with pytest.raises(ValueError, match="u contains NaN"):
        ag.tilt_coverage(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="no tilts"):
        ag.TiltCoverage(4).update(np.zeros((3, 4))).result()
    with pytest.raises(ValueError, match="W_K"):
        ag.tilt_coverage(np.ones((3, 4)), W_K=np.ones((5, 3)))
    with pytest.raises(ValueError, match="rtol"):
        ag.tilt_coverage(np.ones((3, 4)), rtol=-1)
    with pytest.raises(ValueError, match="dim"):
        ag.TiltCoverage(0)
    with pytest.raises(ValueError, match="dim"):
        ag.TiltCoverage(4).merge(ag.TiltCoverage(5))


# -- routing nulls -------------------------------------------------------------------------
def test_routing_nulls_one_hot_with_repeated_columns():
    # six queries routed one-hot onto keys 0, 0, 1, 1, 2, 2 of five keys: rank 3, nullity 2
    P = np.zeros((6, 5))
    P[np.arange(6), [0, 0, 1, 1, 2, 2]] = 1
    r = ag.routing_nulls(P)
    assert r.rank == 3 and r.nullity == 2 and r.null.dim == 2
    np.testing.assert_allclose(P @ r.null.basis(), 0, atol=1e-15)
    assert r.effective_rank == pytest.approx(3, rel=1e-14, abs=0)  # three equal singular values
    # duplicated columns: keys 3 and 4 attended identically by every query
    Q = np.full((4, 5), 0.1)
    Q[:, :3] += np.eye(4, 3) * 0.7
    Q /= Q.sum(1, keepdims=True)
    r = ag.routing_nulls(Q)
    assert r.nullity == 5 - np.linalg.matrix_rank(Q)
    assert np.all(r.null.contains([[0, 0, 0, 1, -1]]))


def test_routing_nulls_deprecated_keyword(rng):
    P = rng.random((5, 4))
    with pytest.warns(DeprecationWarning, match="'P' is deprecated, use 'routing'"):
        old = ag.routing_nulls(P=P)
    new = ag.routing_nulls(routing=P)
    assert old.rank == new.rank and old.nullity == new.nullity
    np.testing.assert_array_equal(old.singular_values, new.singular_values)
    with pytest.raises(ValueError, match="routing must have shape"):
        ag.routing_nulls(np.ones(4))


def test_routing_nulls_batched_softmax(rng):
    q = rng.standard_normal((2, 3, 10, 4))
    k = rng.standard_normal((2, 3, 12, 4))
    k[..., 11, :] = k[..., 10, :]  # a repeated key: equal columns in P
    _, P = ag.softmax_attention(q, k, None, return_routing=True)
    r = ag.routing_nulls(P)
    assert r.rank.shape == (2, 3) and r.null.shape == (2, 3) and r.singular_values.shape == (2, 3, 10)
    assert np.all(r.nullity >= 2) and np.all(r.rank + r.nullity == 12)
    for idx in np.ndindex(2, 3):
        assert r.rank[idx] == np.linalg.matrix_rank(P[idx])
        assert np.all(r.null[idx].contains(np.eye(12)[10] - np.eye(12)[11]))
        assert r.effective_rank[idx] == pytest.approx(ref.effective_rank(r.singular_values[idx], "entropy"))


# -- gauge ---------------------------------------------------------------------------------
def test_gauge_invariance(rng):
    d_model, d_k, d_v = 32, 8, 6
    W_Q, W_K = (rng.standard_normal((d_model, d_k)) / math.sqrt(d_model) for _ in range(2))
    W_V = rng.standard_normal((d_model, d_v)) / math.sqrt(d_model)
    A = rng.standard_normal((d_k, d_k)) + 3 * np.eye(d_k)
    wq2, wk2 = ag.gauge_transform(W_Q, W_K, A)
    np.testing.assert_allclose(wq2, W_Q @ A, rtol=1e-14)
    np.testing.assert_allclose(wk2, W_K @ np.linalg.inv(A).T, rtol=1e-11)
    x = rng.standard_normal((3, 20, d_model))
    err = ag.gauge_invariance_error(W_Q, W_K, A, x, W_V=W_V)
    assert err.bilinear <= 1e-14 and err.logits <= 1e-13 and err.outputs <= 1e-13
    assert rel_err(wq2 @ wk2.T, W_Q @ W_K.T) <= 1e-13
    nulls = ag.parameter_nulls(wq2, wk2)
    assert nulls.ker_B.distance(ag.parameter_nulls(W_Q, W_K).ker_B) <= 1e-10


def test_gauge_errors():
    W = np.ones((6, 2))
    with pytest.raises(ValueError, match="invertible"):
        ag.gauge_transform(W, W, np.ones((2, 2)))
    with pytest.raises(ValueError, match="A must have shape"):
        ag.gauge_transform(W, W, np.eye(3))
    with pytest.raises(ValueError, match="x must have shape"):
        ag.gauge_invariance_error(W, W, np.eye(2), np.ones((4, 5)))


# -- threads -------------------------------------------------------------------------------
def test_threads_do_not_change_results(rng):
    A = rng.standard_normal((16, 40, 6))
    B = rng.standard_normal((16, 6, 30))
    M = rng.standard_normal((16, 25, 25))
    old = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.factored_svd(A, B), ag.singular_values(M)
        ag.set_num_threads(2)
        two = ag.factored_svd(A, B), ag.singular_values(M)
    finally:
        ag.set_num_threads(old)
    for x, y in zip(one[0], two[0]):
        assert rel_err(x, y) <= 1e-12
    assert rel_err(one[1], two[1]) <= 1e-12


@pytest.mark.parametrize("centered", [False, True])
def test_tilt_coverage_batched_heads_equal_one_by_one(rng, centered):
    """batch_ndim: one result per head, equal to the head's own tilt_coverage."""
    q = rng.standard_normal((2, 3, 4, 9, 6))  # (2, 3) heads, 36 samples each
    q[0, 1, :, :, 4:] = 0.0  # a head whose tilts span 4 of 6 directions
    q[1, 2, 0, :3] = 0.0  # zero rows are skipped
    W_K = rng.standard_normal((3, 10, 6))  # broadcast over the first head axis
    stack = ag.tilt_coverage(q, W_K=W_K, batch_ndim=2, centered=centered)
    assert stack.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            one = ag.tilt_coverage(q[i, j], W_K=W_K[j], centered=centered)
            got = stack[i, j]
            assert got.count == one.count and got.rank == one.rank and got.token_rank == one.token_rank
            np.testing.assert_allclose(got.eigenvalues, one.eigenvalues, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(got.token_eigenvalues, one.token_eigenvalues, rtol=1e-12, atol=1e-13)
            assert math.isclose(got.effective_dim, one.effective_dim, rel_tol=1e-12)
            assert got.null.dim == one.null.dim and got.token_null.dim == one.token_null.dim
            assert got.null.distance(one.null) <= 1e-10
            assert got.token_null.distance(one.token_null) <= 1e-10
    assert stack[0, 1].rank == 4 and stack[1, 2].count == 33


def test_tilt_coverage_batch_ndim_errors(rng):
    with pytest.raises(ValueError, match="batch_ndim"):
        ag.tilt_coverage(rng.standard_normal((3, 4)), batch_ndim=2)
    with pytest.raises(ValueError, match="no nonzero rows"):
        ag.tilt_coverage(np.zeros((2, 5, 3)), batch_ndim=1)
    with pytest.raises(ValueError, match="W_K"):
        ag.tilt_coverage(rng.standard_normal((2, 5, 3)), W_K=np.ones((3, 7, 3)), batch_ndim=1)


@pytest.mark.parametrize("size", [1e-310, 1e-200, 1e200, 1e300])
def test_singular_values_at_the_float_limits(rng, size):
    """A matrix far from 1 is scaled by a power of two before the SVD (exact): its singular
    values are those of the unscaled matrix times the size, where they are representable;
    beyond the range, ResultOverflow instead of inf."""
    x = rng.standard_normal((3, 6, 4))
    want = ag.singular_values(x)
    got = ag.singular_values(x * size)
    assert np.all(np.isfinite(got))
    # Not bitwise: x * size rounds every entry (size is no power of two), so the SVD runs on a
    # matrix within eps/2 of x * size entrywise. Weyl's bound |s_i(A + E) - s_i(A)| <= |E|_2
    # gives an absolute error in units of eps * s_max per matrix: measured <= 8.1 over 1001
    # seeds at 1e-200, 1e200 and 1e300 (2.1 to 3.1 for this seed); 32 leaves a margin of four.
    # At 1e-310 the input and the output are subnormal, rounded to multiples of 2^-1074:
    # |E|_2 <= |E|_F <= sqrt(24) half-steps for the 6 x 4 input, plus one half-step for the
    # output, which is the whole of the error there (measured <= 2.8 half-steps, 1.6 here).
    eps = np.finfo(np.float64).eps
    half_step = 2.0 ** -1074 / size / 2 if size < 1e-300 else 0.0  # in units of size
    tol = 32 * eps * want[..., :1] + (math.sqrt(x[0].size) + 1) * half_step
    assert np.all(np.abs(got / size - want) <= tol), np.max(np.abs(got / size - want) / tol)
    with pytest.raises(ValueError, match="not finite"):
        ag.singular_values(np.full((5, 4), 1.7e308))
