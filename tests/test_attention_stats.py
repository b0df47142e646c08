"""Attention statistics computed in the streaming kernels (return_stats=True) against the same
statistics of the materialised weights (AttentionStats.from_weights)."""
import numpy as np
import pytest

import attngeom as ag
from conftest import rel_err

TOL = {np.float64: 1e-12, np.float32: 1e-5}
FIELDS = ("entropy", "max_weight", "sink_weight", "mean_distance")


def draw(rng, shapes, dtype, scale=1.0):
    return [(scale * rng.standard_normal(s)).astype(dtype) for s in shapes]


def masks(rng, n_q, n_k):
    keep = rng.random((n_q, n_k)) < 0.7
    keep[:, 0] = True
    keep[2] = False  # a query that sees no key
    bias = np.where(rng.random((n_q, n_k)) < 0.2, -np.inf, rng.standard_normal((n_q, n_k)))
    bias[:, 1] = 0.0
    return {"none": None, "boolean": keep, "additive": bias}


def check_against_weights(stats, P, log_z, causal, tol):
    ref = ag.AttentionStats.from_routing(P, causal=causal, log_z=log_z)
    assert stats.shape == P.shape[:-1]
    for name in FIELDS:
        got, want = getattr(stats, name), getattr(ref, name)
        assert got.dtype == P.dtype and np.all(np.isfinite(got)), name
        assert rel_err(got, want) <= tol, (name, rel_err(got, want))
    assert stats.argmax.dtype == np.int64
    assert np.array_equal(stats.argmax, ref.argmax)
    seen = np.isfinite(log_z)
    assert np.array_equal(np.isfinite(stats.log_z), seen) and np.all(stats.log_z[~seen] == -np.inf)
    if seen.any():
        assert rel_err(stats.log_z[seen], log_z[seen]) <= tol


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("mask", ["none", "boolean", "additive"])
@pytest.mark.parametrize("n_q,n_k", [(37, 37), (23, 301), (300, 41)])
def test_softmax_stats_match_the_weights(rng, dtype, causal, mask, n_q, n_k):
    q, k, v = draw(rng, [(2, 3, n_q, 16), (1, 3, n_k, 16), (2, 1, n_k, 8)], dtype, scale=1.5)
    m = masks(rng, n_q, n_k)[mask]
    y, P, lz = ag.softmax_attention(q, k, v, mask=m, causal=causal, return_routing=True, return_log_partition=True)
    y2, stats = ag.softmax_attention(q, k, v, mask=m, causal=causal, return_stats=True)
    assert np.array_equal(y, y2)  # asking for statistics leaves y bitwise as it was
    check_against_weights(stats, P, lz, causal, TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kernel,params", [("exp", {}), ("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.7}),
                                           ("stable", {"alpha": 1.3, "c": 1.0})])
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_kernel_stats_match_the_weights(rng, dtype, kernel, params, causal):
    q, k, v = draw(rng, [(2, 29, 8), (2, 67, 8), (2, 67, 5)], dtype)
    y, P, lz = ag.kernel_attention(q, k, v, kernel=kernel, causal=causal, return_routing=True,
                                   return_log_partition=True, **params)
    out = ag.kernel_attention(q, k, v, kernel=kernel, causal=causal, return_stats=True, **params)
    assert len(out) == 2
    if kernel == "cauchy":  # without a mask it sums its bounded weights directly; with
        assert rel_err(out[0], y) <= 10 * TOL[dtype]  # statistics it takes the log domain
    else:
        assert np.array_equal(out[0], y)
    check_against_weights(out[1], P, lz, causal, TOL[dtype])


def test_stats_come_after_weights_and_log_partition(rng):
    q, k, v = draw(rng, [(5, 4), (7, 4), (7, 3)], np.float64)
    y, P, lz, stats = ag.softmax_attention(q, k, v, return_routing=True, return_log_partition=True,
                                           return_stats=True)
    assert P.shape == (5, 7) and lz.shape == (5,) and isinstance(stats, ag.AttentionStats)
    y1, P1, stats1 = ag.softmax_attention(q, k, v, return_routing=True, return_stats=True)
    assert np.array_equal(P, P1) and np.array_equal(stats1.entropy, stats.entropy)


def test_fully_masked_rows_have_documented_stats(rng):
    q, k, v = draw(rng, [(4, 6, 3), (4, 5, 3), (4, 5, 2)], np.float64)
    keep = np.ones((6, 5), bool)
    keep[1] = False
    # causal bottom-right with n_q > n_k: the first n_q - n_k queries see nothing either
    y, stats = ag.softmax_attention(q, k, v, mask=keep, causal="bottom_right", return_stats=True)
    hidden = np.zeros((4, 6), bool)
    hidden[:, 1] = True
    hidden[:, 0] = True
    assert np.all(y[hidden] == 0)
    assert np.all(stats.log_z[hidden] == -np.inf)
    for name in FIELDS:
        assert np.all(getattr(stats, name)[hidden] == 0), name
    assert np.all(stats.argmax[hidden] == -1) and np.all(stats.argmax[~hidden] >= 0)


def test_stats_of_known_rows():
    # equal keys: uniform weights over the visible keys, entropy log(i + 1) under a causal mask
    n = 9
    q = np.ones((n, 2))
    k = np.ones((n, 2))
    v = np.arange(2 * n, dtype=float).reshape(n, 2)
    _, st = ag.softmax_attention(q, k, v, causal=True, return_stats=True)
    i = np.arange(n)
    assert np.allclose(st.entropy, np.log(i + 1), rtol=0, atol=1e-14)
    # Relative checks (atol=0; np.allclose's default atol of 1e-8 would otherwise dominate):
    # the values are of order one, and the first mean distance is an exact 0 (one key, at
    # distance 0). Measured: every value here equals its closed form exactly.
    assert np.allclose(st.max_weight, 1 / (i + 1), rtol=1e-14, atol=0)
    assert np.array_equal(st.argmax, np.zeros(n, np.int64))  # the first of the tied keys
    assert np.allclose(st.sink_weight, 1 / (i + 1), rtol=1e-14, atol=0)
    assert np.allclose(st.mean_distance, i / 2, rtol=1e-14, atol=0)  # mean of 0..i
    # a one-hot row: query 3 reads only key 5, far above the others
    k = np.eye(8)
    q = np.zeros((4, 8))
    q[3, 5] = 1e3
    _, st = ag.softmax_attention(q, k, np.ones((8, 1)), scale=1.0, return_stats=True)
    assert st.entropy[3] == 0 and st.max_weight[3] == 1 and st.argmax[3] == 5
    assert st.mean_distance[3] == 2 and st.sink_weight[3] == 0
    assert np.allclose(st.entropy[:3], np.log(8), atol=1e-14)  # zero queries: uniform


@pytest.mark.parametrize("size", [1e-3, 1.0, 300.0])
def test_entropy_is_stable_for_logits_of_any_size(rng, size):
    q, k, v = draw(rng, [(3, 40, 8), (3, 200, 8), (3, 200, 4)], np.float64)
    q = q * size
    y, P, lz = ag.softmax_attention(q, k, v, causal=True, return_routing=True, return_log_partition=True)
    _, st = ag.softmax_attention(q, k, v, causal=True, return_stats=True)
    assert np.all(np.isfinite(st.entropy)) and np.all(st.entropy >= 0)
    check_against_weights(st, P, lz, True, 1e-12 if size < 100 else 1e-10)


def test_layouts_and_threads(rng):
    q, k, v = draw(rng, [(2, 50, 3, 8), (2, 70, 3, 8), (2, 70, 3, 4)], np.float32)
    y, st = ag.softmax_attention(q, k, v, causal="bottom_right", layout="bnhd", return_stats=True)
    assert y.shape == (2, 50, 3, 4) and st.shape == (2, 3, 50)  # statistics stay (..., heads, n_q)
    t = lambda a: np.ascontiguousarray(np.swapaxes(a, 1, 2))
    _, ref = ag.softmax_attention(t(q), t(k), t(v), causal="bottom_right", return_stats=True)
    before = ag.get_num_threads()
    try:
        for threads in (1, 2, 3):
            ag.set_num_threads(threads)
            _, st_n = ag.softmax_attention(t(q), t(k), t(v), causal="bottom_right", return_stats=True)
            for name in ("log_z", "argmax") + FIELDS:
                assert np.array_equal(getattr(st_n, name), getattr(ref, name)), (threads, name)
    finally:
        ag.set_num_threads(before)
    for name in ("log_z", "argmax") + FIELDS:
        assert np.array_equal(getattr(st, name), getattr(ref, name)), name


def test_from_routing_checks_its_input():
    with pytest.raises(ValueError, match="routing must have shape"):
        ag.AttentionStats.from_routing(np.ones(3))
    with pytest.raises(TypeError, match="routing must be a real"):
        ag.AttentionStats.from_routing(np.ones((2, 2), complex))
    st = ag.AttentionStats.from_routing(np.zeros((3, 0)))
    assert np.array_equal(st.argmax, [-1, -1, -1]) and np.all(st.entropy == 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_argmax_is_the_first_of_tied_keys_in_long_rows(rng, dtype, causal):
    # Scores q.k of entries in {-1, 0, 1} are small integers, exact in either type: every row
    # has its max at many keys, in several lanes of a packet, in both halves of the unrolled
    # pair and in several key blocks (700 keys). The first of them is the argmax.
    n, d = 700, 3
    q = rng.integers(-1, 2, (2, n, d)).astype(dtype)
    k = rng.integers(-1, 2, (2, n, d)).astype(dtype)
    v = rng.standard_normal((2, n, 2)).astype(dtype)
    _, st = ag.softmax_attention(q, k, v, scale=1.0, causal=causal, return_stats=True)
    s = q.astype(np.int64) @ np.swapaxes(k.astype(np.int64), -1, -2)
    if causal:
        s = np.where(np.tri(n, dtype=bool), s, np.iinfo(np.int64).min)
    first = np.argmax(s, axis=-1)  # NumPy's argmax: the first index of the max
    assert (np.sum(s == s.max(-1, keepdims=True), -1) > 1).mean() > 0.9  # ties are the rule here
    assert np.array_equal(st.argmax, first)
