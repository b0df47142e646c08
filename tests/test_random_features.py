"""FAVOR+ positive random features (Laplace-Radon s.7.3 item 3)."""
import math

import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag
import reference as ref


def head(rng, n_q=48, n_k=96, d=8, d_v=3, s=0.7):
    return (s * rng.standard_normal((n_q, d)), s * rng.standard_normal((n_k, d)), rng.standard_normal((n_k, d_v)))


def z_estimates(q, k, v, m, orthogonal, seeds):
    return np.array([np.exp(ag.random_feature_attention(q, k, v, num_features=m, orthogonal=orthogonal, seed=s,
                                                        return_log_partition=True)[1]) for s in seeds])


@pytest.mark.parametrize("orthogonal", [True, False])
def test_partition_estimate_is_unbiased(rng, orthogonal):
    q, k, v = head(rng)
    _, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    est = z_estimates(q, k, v, 32, orthogonal, range(400))
    se = est.std(0, ddof=1) / math.sqrt(len(est))
    z_scores = (est.mean(0) - Z) / se
    assert np.all(np.abs(z_scores) < 4.5)  # every query (48 of them) within 4.5 standard errors
    assert np.mean(np.abs(z_scores) < 3) > 0.95  # and 3 standard errors for nearly all


def test_orthogonal_beats_iid_and_error_falls_with_m(rng):
    q, k, v = head(rng)
    y_exact, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    mse = {}
    for orth in (True, False):
        est = z_estimates(q, k, v, 64, orth, range(60))
        mse[orth] = np.mean((est / Z - 1) ** 2)
    assert mse[True] < mse[False]
    errs = [np.mean([np.abs(ag.random_feature_attention(q, k, v, num_features=m, seed=s) - y_exact).mean()
                     for s in range(20)]) for m in (16, 64, 256, 1024)]
    assert all(a > b for a, b in zip(errs, errs[1:]))


def test_causal_equals_prefix_estimates(rng):
    q, k, v = head(rng, n_q=40, n_k=40)
    y = ag.random_feature_attention(q, k, v, causal=True, seed=5, num_features=48)
    for i in (0, 7, 39):
        yi = ag.random_feature_attention(q[i:i + 1], k[:i + 1], v[:i + 1], seed=5, num_features=48)
        assert rel_err(y[i], yi[0]) <= 1e-12
    # bottom-right alignment for a block of new queries
    y_br = ag.random_feature_attention(q[:10], k, v[:40], causal="bottom_right", seed=5, num_features=48)
    assert rel_err(y_br[-1], ag.random_feature_attention(q[9:10], k, v[:40], seed=5, num_features=48)[0]) <= 1e-12


def test_features_and_batches(rng):
    x = rng.standard_normal((2, 5, 6))
    f = ag.random_features(x, 10, seed=1)
    W = ag.feature_matrix(6, 10, seed=1)
    direct = np.exp(x @ W.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(10)
    assert rel_err(f.phi * np.exp(f.log_shift)[..., None], direct) <= 1e-13
    g = ag.random_features(x, 10, seed=1, per_row=False)
    assert np.allclose(g.log_shift, g.log_shift[..., :1]) and g.phi.max() <= 1 / math.sqrt(10) + 1e-15
    # orthogonal blocks: rows orthogonal inside each block of d
    Wo = ag.feature_matrix(6, 12, orthogonal=True, seed=2)
    G = Wo[:6] @ Wo[:6].T
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0, atol=1e-12)
    # batched heads with broadcast keys; float32 stays float32
    q = rng.standard_normal((3, 8, 4)).astype(np.float32)
    k = rng.standard_normal((8, 4)).astype(np.float32)
    y = ag.random_feature_attention(q, k, k, num_features=16)
    assert y.shape == (3, 8, 4) and y.dtype == np.float32


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (37, 70), (130, 65)])
def test_matches_reference(rng, dtype, tol, n_q, n_k):
    """The core's feature map + lightning product equals FAVOR+ written out in NumPy."""
    q = rng.standard_normal((2, n_q, 8)).astype(dtype)
    k, v = rng.standard_normal((2, 2, n_k, 8)).astype(dtype)
    y, log_z = ag.random_feature_attention(q, k, v, num_features=24, seed=3, scale=0.3,
                                           return_log_partition=True)
    W = ag.feature_matrix(8, 24, seed=3)
    expected = ref.favor_attention(q.astype(float), k.astype(float), v.astype(float), W, 0.3)
    assert y.dtype == dtype and log_z.dtype == dtype
    assert rel_err(y, expected) <= tol
    fq = np.exp((np.sqrt(0.3) * q.astype(float)) @ W.T - 0.15 * np.sum(q.astype(float) ** 2, -1, keepdims=True))
    fk = np.exp((np.sqrt(0.3) * k.astype(float)) @ W.T - 0.15 * np.sum(k.astype(float) ** 2, -1, keepdims=True))
    assert np.max(np.abs(log_z - np.log(fq @ fk.sum(-2)[..., None] / 24)[..., 0])) <= 100 * tol


def test_bad_input(rng):
    q, k, v = head(rng)
    with pytest.raises(ValueError, match="num_features"):
        ag.random_feature_attention(q, k, v, num_features=0)
    with pytest.raises(ValueError, match="num_features"):
        ag.random_features(q, 0)
    with pytest.raises(ValueError, match="k must have shape"):
        ag.random_feature_attention(q, k[:, :3], v)
    with pytest.raises(ValueError, match="v must have shape"):
        ag.random_feature_attention(q, k, v[:5])
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.random_feature_attention(np.full_like(q, np.nan), k, v)
    with pytest.raises(ValueError, match="k must be non-empty"):
        ag.random_feature_attention(q, k[:0], v[:0])
    with pytest.raises(ValueError, match="causal"):
        ag.random_feature_attention(q, k, v, causal="left")
    with pytest.raises(ValueError, match="scale"):
        ag.random_feature_attention(q, k, v, scale=-1.0)
