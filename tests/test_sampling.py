"""Importance-sampled partition and numerator (Laplace-Radon s.7.3 item 4)."""
import math

import numpy as np
import pytest

import attngeom as ag


def synthetic_head(rng, gain=3.0, n=64, d_model=96, d_k=32):
    """Laplace-Radon s.13 heads (Gaussian tokens, weights / sqrt(d_model)), queries scaled up."""
    x = rng.standard_normal((n, d_model))
    W_Q = gain * rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    W_K = rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    return x @ W_Q, x @ W_K, x


def test_both_proposals_unbiased_for_Z(rng):
    q, k, v = synthetic_head(rng, gain=1.0, n=40)
    _, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    for proposal in ("uniform", "tilted"):
        est = np.array([ag.sampled_attention(q, k, v, num_samples=8, proposal=proposal, seed=s).Z
                        for s in range(300)])
        z_scores = (est.mean(0) - Z) / (est.std(0, ddof=1) / math.sqrt(len(est)))
        assert np.all(np.abs(z_scores) < 4.5), proposal
        assert np.mean(np.abs(z_scores) < 3) > 0.95, proposal


def test_tilted_has_lower_variance_at_large_tau(rng):
    q, k, v = synthetic_head(rng, gain=3.0)
    _, tau = ag.tilt_radius(q)
    assert tau.mean() >= 3
    _, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    mse = {}
    for proposal in ("uniform", "tilted"):
        est = np.array([ag.sampled_attention(q, k, v, num_samples=16, proposal=proposal, seed=s).Z
                        for s in range(100)])
        mse[proposal] = np.mean((est / Z - 1) ** 2)
        one = ag.sampled_attention(q, k, v, num_samples=16, proposal=proposal, seed=0)
        assert np.all(one.Z_variance >= 0) and one.y.shape == v.shape[:-2] + (64, 96)
    assert mse["tilted"] < 0.5 * mse["uniform"]
    # the sketch's rank trades cost for variance; full rank samples from the exact Gibbs weights
    exact = np.array([ag.sampled_attention(q, k, v, num_samples=4, proposal="tilted", sketch_rank=32, seed=s).Z
                      for s in range(5)])
    assert np.max(np.abs(exact / Z - 1)) < 1e-10


def test_estimates_consistent(rng):
    q, k, v = synthetic_head(rng, gain=1.0, n=30)
    y, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    est = ag.sampled_attention(q, k, v, num_samples=20000, proposal="tilted", seed=1)
    assert np.max(np.abs(est.log_Z - log_z)) < 0.05
    assert np.max(np.abs(est.y - y)) / np.max(np.abs(y)) < 0.05
    np.testing.assert_allclose(est.N / est.Z[:, None], est.y, rtol=1e-12)
    # batched heads
    qb, kb, vb = (np.stack([a, a]) for a in (q, k, v))
    assert ag.sampled_attention(qb, kb, vb, num_samples=4).y.shape == (2, 30, 96)


def test_bad_input(rng):
    q, k, v = synthetic_head(rng, n=10)
    with pytest.raises(ValueError, match="num_samples"):
        ag.sampled_attention(q, k, v, num_samples=0)
    with pytest.raises(ValueError, match="proposal"):
        ag.sampled_attention(q, k, v, num_samples=4, proposal="gibbs")
    with pytest.raises(ValueError, match="k must have shape"):
        ag.sampled_attention(q, k[:, :5], v, num_samples=4)
    with pytest.raises(ValueError, match="v must have shape"):
        ag.sampled_attention(q, k, v[:3], num_samples=4)
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.sampled_attention(np.full_like(q, np.nan), k, v, num_samples=4)
    with pytest.raises(ValueError, match="sketch_rank"):
        ag.sampled_attention(q, k, v, num_samples=4, proposal="tilted", sketch_rank=0)
