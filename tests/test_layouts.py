"""Activation layouts: every function taking per-head q / k / v accepts layout="bnhd"
(batch, pos, head, d_head) and gives exactly (bitwise) the "bhnd" result with the same axes
swapped; 4-D activations that look like (batch, pos, head, d_head) without a layout argument
give a LayoutWarning.

Bitwise comparisons run on one thread: with several, the core's dynamic schedule may change
the order of a reduction (kernel_attention_backward differs in the last bit between two calls
on the same arrays). The lightning kernel (and random features, which run it) and the backward
kernels can differ in the last bit between two calls on equal inputs even on one thread (their
rounding depends on where buffers are allocated), so those are compared to a few ulps; the
others are compared bitwise.
"""
import warnings

import numpy as np
import pytest

import attngeom as ag
from attngeom._operands import looks_token_major

B, N, H, D = 2, 6, 3, 4


def swap(a, kind="v"):
    """bhnd <-> bnhd for one array of that kind (v: (.., n, d) per head; s: (.., n); m: (.., n, d, d))."""
    if a is None or kind == "-":
        return a
    axes = {"v": (-3, -2), "s": (-2, -1), "m": (-4, -3)}[kind]
    return np.swapaxes(a, *axes)


def operands(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, dy = (rng.standard_normal((B, H, N, D)).astype(dtype) for _ in range(4))
    return q, k, v, dy


# (name, call(q, k, v, dy, layout) in the given layout, kinds of the result items)
CALLS = [
    ("softmax_attention", lambda q, k, v, dy, lay: ag.softmax_attention(
        q, k, v, causal=True, return_routing=True, return_log_partition=True, layout=lay), "v-s"),
    ("softmax_attention_backward", lambda q, k, v, dy, lay: ag.softmax_attention_backward(
        q, k, v, dy, causal=True, layout=lay), "vvv"),
    ("kernel_attention", lambda q, k, v, dy, lay: ag.kernel_attention(
        q, k, v, kernel="cauchy", gamma=0.5, return_log_partition=True, layout=lay), "vs"),
    ("kernel_attention_backward", lambda q, k, v, dy, lay: ag.kernel_attention_backward(
        q, k, v, dy, kernel="gaussian", sigma=0.7, layout=lay), "vvv"),
    ("kernel_attention_backward exp", lambda q, k, v, dy, lay: ag.kernel_attention_backward(
        q, k, v, dy, layout=lay), "vvv"),
    ("projection_attention", lambda q, k, v, dy, lay: ag.projection_attention(
        q, k, v, sigma=1.5, return_routing=True, layout=lay), "v-"),
    ("projection_attention_backward", lambda q, k, v, dy, lay: ag.projection_attention_backward(
        q, k, v, dy, sigma=1.5, causal=True, layout=lay), "vvv"),
    ("lightning_attention", lambda q, k, v, dy, lay: ag.lightning_attention(q, k, v, causal=True, layout=lay), "v"),
    ("lightning_attention_backward", lambda q, k, v, dy, lay: ag.lightning_attention_backward(
        q, k, v, dy, causal=True, layout=lay), "vvv"),
    ("random_feature_attention", lambda q, k, v, dy, lay: ag.random_feature_attention(
        0.5 * q, 0.5 * k, v, num_features=16, return_log_partition=True, layout=lay), "vs"),
    ("random_feature_attention_backward", lambda q, k, v, dy, lay: ag.random_feature_attention_backward(
        0.5 * q, 0.5 * k, v, dy, num_features=16, layout=lay), "vvv"),
    ("sampled_attention", lambda q, k, v, dy, lay: ag.sampled_attention(
        q, k, v, num_samples=8, seed=3, layout=lay), "sssvvs"),
    ("tilt_radius", lambda q, k, v, dy, lay: ag.tilt_radius(q, layout=lay), "vs"),
    ("radon_project", lambda q, k, v, dy, lay: ag.radon_project(q, k, layout=lay), "-"),
    ("log_partition_gradient", lambda q, k, v, dy, lay: ag.log_partition_gradient(
        q, k, hessian=True, layout=lay), "vm"),
]


def _items(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.fixture
def one_thread():
    saved = ag.get_num_threads()
    ag.set_num_threads(1)
    yield
    ag.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, call, kinds", CALLS, ids=[c[0] for c in CALLS])
def test_bnhd_is_the_bhnd_result_with_axes_swapped(name, call, kinds, dtype, one_thread):
    q, k, v, dy = operands(dtype)
    ref = call(q, k, v, dy, "bhnd")
    got = call(swap(q), swap(k), swap(v), swap(dy), "bnhd")
    assert type(got) is type(ref)
    for kind, a, b in zip(kinds, _items(got), _items(ref)):
        expected = swap(b, kind)
        assert a.shape == expected.shape and a.dtype == expected.dtype
        if "lightning" in name or "random_feature" in name or "backward" in name:
            np.testing.assert_allclose(a, expected, rtol=50 * np.finfo(dtype).eps, atol=50 * np.finfo(dtype).eps)
        else:
            np.testing.assert_array_equal(a, expected)  # bitwise: the same kernel on the same blocks


def test_tau_and_log_partition_in_bnhd(one_thread):
    q, k, v, dy = operands()
    u, tau = ag.tilt_radius(swap(q), layout="bnhd")
    assert u.shape == (B, N, H, D) and tau.shape == (B, N, H)
    y, lz = ag.laplace_radon_attention(u, tau, swap(k), swap(v), causal=True, return_log_partition=True,
                                       layout="bnhd")
    y_ref, lz_ref = ag.softmax_attention(q, k, v, causal=True, return_log_partition=True)
    np.testing.assert_allclose(y, swap(y_ref), atol=1e-12)
    np.testing.assert_allclose(lz, swap(lz_ref, "s"), atol=1e-12)
    kappa = ag.projected_cumulants(u, tau, swap(k), order=2, layout="bnhd")
    assert kappa.shape == (B, N, H, 2)
    np.testing.assert_array_equal(kappa, swap(ag.projected_cumulants(*ag.tilt_radius(q), k, order=2)))
    # the backward takes the forward's y and log Z in the same layout
    y, lz = ag.softmax_attention(swap(q), swap(k), swap(v), return_log_partition=True, layout="bnhd")
    g = ag.softmax_attention_backward(swap(q), swap(k), swap(v), swap(dy), y=y, log_partition=lz, layout="bnhd")
    g_ref = ag.softmax_attention_backward(q, k, v, dy)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, swap(b), rtol=1e-14, atol=1e-14)


def test_bnhd_broadcasts_like_bhnd(one_thread):
    """Shared keys (n, heads, d) in bnhd broadcast over the batch as (heads, n, d) do in bhnd;
    the mask keeps the library's layout (..., heads, n_q, n_k)."""
    q, k, v, _ = operands()
    mask = np.tril(np.ones((N, N), bool))[None, None]
    y = ag.softmax_attention(swap(q), swap(k[0]), swap(v[0]), mask=mask, layout="bnhd")
    np.testing.assert_array_equal(y, swap(ag.softmax_attention(q, k[0], v[0], mask=mask)))
    g = ag.softmax_attention_backward(swap(q), swap(k[0]), swap(v[0]), swap(q), layout="bnhd")
    assert g.dk.shape == (N, H, D)  # summed over the broadcast batch, in the caller's layout


@pytest.mark.parametrize("products", ["float", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_merge_heads_places_y_token_major_with_the_same_bits(products, threads):
    """merge_heads: y (batch, n_q, heads d_v), the bits of y with its (heads, n) axes swapped
    and the heads merged, in both layouts and for grouped queries (batch, kv_heads, group, n,
    d) against keys (batch, kv_heads, 1, n, d); P, log Z and the statistics unchanged."""
    rng = np.random.default_rng(3)
    b, kv, g, n, d, dv = 2, 2, 3, 37, 16, 24
    q = rng.standard_normal((b, kv, g, n, d)).astype(np.float32)
    k = rng.standard_normal((b, kv, 1, n, d)).astype(np.float32)
    v = rng.standard_normal((b, kv, 1, n, dv)).astype(np.float32)
    saved = ag.get_num_threads()
    ag.set_num_threads(threads)
    try:
        kw = dict(causal=True, return_routing=True, return_log_partition=True, return_stats=True, products=products)
        ref = ag.softmax_attention(q, k, v, **kw)
        got = ag.softmax_attention(q, k, v, merge_heads=True, **kw)
        np.testing.assert_array_equal(got[0], np.moveaxis(ref[0], 3, 1).reshape(b, n, kv * g * dv))
        assert got[0].flags.c_contiguous
        for a, r in zip(got[1:3], ref[1:3]):
            np.testing.assert_array_equal(a, r)
        np.testing.assert_array_equal(got[3].entropy, ref[3].entropy)
        # four-dimensional heads, in the bnhd layout: the merged y is the same array
        q4, k4, v4 = q.reshape(b, kv * g, n, d), np.repeat(k[:, :, 0], g, 1), np.repeat(v[:, :, 0], g, 1)
        y4 = ag.softmax_attention(swap(q4), swap(k4), swap(v4), causal=True, layout="bnhd", products=products,
                                  merge_heads=True)
        np.testing.assert_array_equal(y4, got[0])
    finally:
        ag.set_num_threads(saved)
    with pytest.raises(ValueError, match="merge_heads"):
        ag.softmax_attention(q[0, 0], k[0, 0], v[0, 0], merge_heads=True)


def test_layout_errors():
    q, k, v, dy = operands()
    for bad in ("bshd", "BNHD", 1, ""):
        with pytest.raises(ValueError, match="layout must be 'bhnd'"):
            ag.softmax_attention(q, k, v, layout=bad)
    with pytest.raises(ValueError, match=r"layout='bnhd', q must have shape \(\.\.\., n, heads, d\) \(at least 3 "
                                         r"dimensions\), got \(6, 4\)"):
        ag.softmax_attention(q[0, 0], k[0, 0], v[0, 0], layout="bnhd")
    with pytest.raises(ValueError, match=r"layout='bnhd', tau must have shape \(\.\.\., n, heads\)"):
        ag.laplace_radon_attention(swap(q), np.ones(N), swap(k), swap(v), layout="bnhd")
    with pytest.raises(ValueError, match="layout must be"):
        ag.lightning_attention_backward(q, k, v, dy, layout="nhd")


# Shapes of 4-D q, k (and v): typical bhnd calls (no warning) and bnhd activations read
# without a layout argument (a warning).
BHND = [((2, 8, 1024, 64),) * 2, ((1, 12, 128, 64),) * 2, ((1, 32, 32, 128),) * 2, ((4, 16, 512, 64),) * 3,
        ((1, 32, 4096, 128), (1, 8, 4096, 128)),  # bhnd grouped-query keys that were not expanded: not flagged
        ((1, 12, 20, 64), (1, 12, 30, 64))]  # cross-attention with more keys than queries
BNHD = [((1, 128, 12, 64),) * 3, ((2, 1024, 32, 128),) * 2, ((1, 64, 14, 64), (1, 64, 2, 64), (1, 64, 2, 64)),
        ((8, 17, 16, 64),) * 2]


@pytest.mark.parametrize("shapes", BHND)
def test_no_warning_for_typical_bhnd_shapes(shapes):
    assert not looks_token_major(*shapes)


@pytest.mark.parametrize("shapes", BNHD)
def test_warning_rule_flags_typical_bnhd_shapes(shapes):
    assert looks_token_major(*shapes)


def test_layout_warning_points_at_the_callers_line():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 16, 4, 8)) for _ in range(3))  # (batch, pos, head, d_head)
    with pytest.warns(ag.LayoutWarning, match=r"q has shape \(1, 16, 4, 8\), which looks like \(batch, pos, head, "
                                              r"d_head\).*layout='bnhd'") as record:
        ag.softmax_attention_backward(q, k, v, q)  # decorated: the warning still names this file
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ag.softmax_attention(q, k, v, layout="bhnd")  # an explicit layout is never second-guessed
        ag.softmax_attention(q, k, v, layout="bnhd")
        ag.softmax_attention(q[0], k[0], v[0])  # 3-D: never flagged
        # internal calls on 4-D intermediates do not warn (random features run lightning attention)
        ag.random_feature_attention(q, k, v, num_features=4, layout="bhnd")
        ag.random_feature_attention_backward(q, k, v, q, num_features=4, layout="bhnd")
        ag.kernel_attention_backward(q, k, v, q, layout="bhnd")
        ag.projection_attention_backward(q, k, v, q, layout="bhnd")
    for func in (ag.lightning_attention, ag.projection_attention, ag.random_feature_attention, ag.kernel_attention):
        with pytest.warns(ag.LayoutWarning, match=func.__name__):
            func(q, k, v)
