"""Gradient checks of backward passes: random q, k, v and central finite differences.

Test modules import from here, never from one another.
"""
import numpy as np
from conftest import rel_err


def draw(rng, bq, bk, bv, n_q, n_k, d_k, d_v, dtype=np.float64):
    q = rng.standard_normal(bq + (n_q, d_k)).astype(dtype)
    k = rng.standard_normal(bk + (n_k, d_k)).astype(dtype)
    v = rng.standard_normal(bv + (n_k, d_v)).astype(dtype)
    return q, k, v


def finite_difference(f, arrays, dy, h=1e-5):
    """Central differences of <dy, f(*arrays)> with respect to every entry of every array."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + h
            plus = np.sum(dy * f(*arrays))
            a[idx] = old - h
            minus = np.sum(dy * f(*arrays))
            a[idx] = old
            g[idx] = (plus - minus) / (2 * h)
        grads.append(g)
    return grads


def check_fd(f, backward, arrays, rng, rtol=1e-7):
    y = f(*arrays)
    dy = rng.standard_normal(y.shape)
    got = backward(*arrays, dy)
    want = finite_difference(f, arrays, dy)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape, name
        assert rel_err(g, w) <= rtol, (name, rel_err(g, w))
