"""Projection (Gaussian-distance) attention and local flattening (Sanger)."""
import numpy as np
import pytest
from conftest import TOL, rel_err

import attngeom as ag
import reference as ref


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_unit_norm_identity_with_softmax(rng):
    q = unit(rng.standard_normal((3, 20, 8)))
    k = unit(rng.standard_normal((3, 30, 8)))
    v = rng.standard_normal((3, 30, 5))
    y, z = ag.projection_attention(q, k, v, return_routing=True)
    y_s, p_s = ag.softmax_attention(q, k, v, scale=1.0, return_routing=True)
    assert rel_err(z, p_s) <= 1e-14 and rel_err(y, y_s) <= 1e-14


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_general_norms_match_distance_reference(rng, dtype):
    q = (3 * rng.standard_normal((2, 15, 6))).astype(dtype)
    k = (rng.standard_normal((2, 25, 6)) + 1).astype(dtype)
    v = rng.standard_normal((2, 25, 4)).astype(dtype)
    sigma = 1.7
    y, z = ag.projection_attention(q, k, v, sigma=sigma, return_routing=True)
    z_ref = ref.projection_weights(q.astype(np.float64), k.astype(np.float64), sigma)
    assert z.dtype == dtype and y.dtype == dtype
    assert rel_err(z, z_ref) <= TOL[dtype] * 10
    assert rel_err(y, z_ref @ v.astype(np.float64)) <= TOL[dtype] * 10
    # the weights are softmax with logits q.k / sigma^2 and per-key bias -|k|^2 / (2 sigma^2)
    bias = -np.sum(k.astype(np.float64) ** 2, -1)[:, None, :] / (2 * sigma ** 2)
    _, p = ag.softmax_attention(q.astype(np.float64), k.astype(np.float64), None, scale=sigma ** -2, mask=bias,
                                return_routing=True)
    assert rel_err(z, p) <= TOL[dtype] * 10
    # v defaults to k: the paper's cross-attention form y = z k
    assert rel_err(ag.projection_attention(q, k, sigma=sigma), z_ref @ k.astype(np.float64)) <= TOL[dtype] * 10


def test_tiny_sigma_and_far_points(rng):
    k = rng.standard_normal((40, 3)) + 1e4  # a cloud far from the origin
    q = k[[3, 17]] + 1e-3 * rng.standard_normal((2, 3))
    y, z = ag.projection_attention(q, k, sigma=0.01, return_routing=True)
    assert np.all(np.isfinite(z)) and np.allclose(z.sum(-1), 1, atol=1e-14)
    assert z[0, 3] > 0.999 and z[1, 17] > 0.999  # the nearest key wins
    np.testing.assert_allclose(y, k[[3, 17]], atol=1e-9)
    z_ref = ref.projection_weights(q - k.mean(0), k - k.mean(0), 0.01)
    assert rel_err(z, z_ref) <= 1e-8


def test_self_attention_mask_causal(rng):
    x = rng.standard_normal((12, 4))
    keep = rng.random((12, 12)) > 0.3
    np.fill_diagonal(keep, True)
    _, z = ag.projection_attention(x, x, sigma=0.8, mask=keep, causal=True, return_routing=True)
    assert np.all(z[~(keep & np.tri(12, dtype=bool))] == 0)
    w = ref.projection_weights(x, x, 0.8) * (keep & np.tri(12, dtype=bool))
    assert rel_err(z, w / w.sum(-1, keepdims=True)) <= 1e-12


def test_flattening(rng):
    # points near a 2-d plane in R^6 with noise: one projection layer reduces the local dimension
    plane = rng.standard_normal((300, 2)) @ rng.standard_normal((2, 6))
    x = plane + 0.3 * rng.standard_normal((300, 6))
    y = ag.projection_attention(x, x, sigma=1.0)
    flat = ag.local_flatness(x, y, n_neighbors=15)
    assert flat.before.shape == (300,) and flat.neighbors.shape == (300, 15)
    assert np.all(flat.neighbors[:, 0] == np.arange(300))
    assert flat.mean_after < 0.8 * flat.mean_before
    assert flat.summary()["ratio"] < 0.8
    # identity layer: nothing changes
    same = ag.local_flatness(x, x, n_neighbors=15)
    np.testing.assert_allclose(same.before, same.after)
    # a flat neighbourhood has dimension 2 exactly (participation of two equal variances)
    square = np.array([[i, j, 0.0] for i in range(-3, 4) for j in range(-3, 4)])
    assert ag.local_flatness(square, square, n_neighbors=49).mean_before == pytest.approx(2.0)


def test_projection_errors(rng):
    x = rng.standard_normal((5, 3))
    with pytest.raises(ValueError, match="sigma"):
        ag.projection_attention(x, x, sigma=0)
    with pytest.raises(ValueError, match="sigma"):
        ag.projection_attention(x, x, sigma=-1)
    with pytest.raises(ValueError, match="k must have shape"):
        ag.projection_attention(x, x[:, :2])
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.projection_attention(np.full((2, 3), np.nan), x)
    with pytest.raises(ValueError, match="k must be non-empty"):
        ag.projection_attention(x, np.ones((0, 3)))
    with pytest.raises(ValueError, match="n_neighbors"):
        ag.local_flatness(x, x, n_neighbors=1)
    with pytest.raises(ValueError, match="y must have shape"):
        ag.local_flatness(x, x[:4])
